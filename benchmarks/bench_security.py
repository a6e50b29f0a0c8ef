"""The cost of ACL and TLS on pipelined produce: the same load against three `tidemq dev`
processes started side by side, measured in turns (plain, acl, tls, plain, ...) so that all three
see the same machine, and reported as ratios to plain from this run.

    plain  no ACL, no TLS
    acl    aclEnable (tidemq dev --acl-file): every request signed by the client (HMAC-SHA1 over
           the fields and the body) and checked by the broker: signature, account, topic and
           group permission (a non-admin account with topicPerms)
    tls    tls.server.mode=enforcing on the name server and the broker (tidemq dev --set tls.*),
           the producer dialling with tls=<context trusting the run's CA>; the client's own
           encryption runs on the same machine, as the broker's does

Each turn sends for `--seconds` with `--window` send_nowait futures in flight on one producer
(RocketMQ's async send; the side-by-side suite's pipelined case), 1 KiB bodies, ASYNC_FLUSH.
Targets (issue 15): acl >= 0.9x plain, tls >= 0.8x plain. Certificates are made for the run
(tidemq.testing.tls_certs; needs the test extra's `cryptography`).

Usage: python benchmarks/bench_security.py [--runs 3] [--seconds 3] [--window 256]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidemq import Admin, Credentials, Message, Producer
from tidemq.remoting.loop import install_uvloop
from tidemq.security.tls import TlsClientSettings, client_context
from tidemq.testing.tls_certs import Pki, make_pki

BODY_SIZE = 1024
TOPIC = "BenchSecurity"
GROUP = "bench_security_producer"
ADMIN = Credentials("benchAdmin", "benchAdminSecret")
USER = Credentials("benchUser", "benchUserSecret")
TARGETS = {"acl": 0.9, "tls": 0.8}

# An admin for the brokers' own requests (tidemq dev signs with the file's first admin), and the
# producer's account: only what it uses, so every send is checked against a topic permission.
ACL_FILE = f"""\
accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: {USER.access_key}
    secretKey: {USER.secret_key}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB
    groupPerms:
      - {GROUP}=PUB|SUB
"""


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Variant:
    """One server process and how the producer talks to it."""

    name: str
    dev_args: list[str]
    producer_options: dict[str, Any] = field(default_factory=dict)
    admin_options: dict[str, Any] = field(default_factory=dict)
    namesrv: str = ""
    pid: int = 0
    error: str | None = None


def variants(pki: Pki, acl_file: Path) -> list[Variant]:
    tls = client_context(TlsClientSettings(trust_cert_path=pki.ca))
    tls_set = [
        "--set",
        "tls.server.mode=enforcing",
        "--set",
        f"tls.server.certPath={pki.server_cert}",
        "--set",
        f"tls.server.keyPath={pki.server_key}",
        "--set",
        "tls.enable=true",
        "--set",
        f"tls.client.trustCertPath={pki.ca}",
    ]
    return [
        Variant("plain", []),
        Variant(
            "acl",
            ["--acl-file", str(acl_file)],
            {"credentials": USER},
            {"credentials": ADMIN},
        ),
        Variant("tls", tls_set, {"tls": tls}, {"tls": tls}),
    ]


@contextlib.contextmanager
def dev_server(data_dir: Path, extra: list[str]) -> Iterator[tuple[str, int]]:
    """A `tidemq dev` process; yields its name server address and its pid once both ports
    accept."""
    namesrv_port, broker_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tidemq.cli.main", "--log-level", "WARNING", "dev"),
        *("--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port)),
        *("--data-dir", str(data_dir), "--set", "flushDiskType=ASYNC_FLUSH", *extra),
    ]
    data_dir.mkdir(parents=True)
    log_path = data_dir / "dev.log"  # a file, not a pipe: nobody has to drain it
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    try:
        for port in (namesrv_port, broker_port):
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), 0.2),
                ):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"tidemq dev did not start: {tail}")
                time.sleep(0.05)
        time.sleep(0.5)  # the broker's first registration
        yield f"127.0.0.1:{namesrv_port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def prepare(variant: Variant) -> None:
    """Create the topic (with the admin account under ACL) and wait until it has a route."""
    async with Admin(variant.namesrv, **variant.admin_options) as admin:
        deadline = time.monotonic() + 20
        while True:
            try:
                addresses = await admin.master_addresses()
                if addresses:
                    await admin.create_topic(TOPIC, broker_addr=addresses[0])
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)


async def pipelined(producer: Producer, seconds: float, window: int, body: bytes) -> float:
    """Messages per second acknowledged with `window` sends in flight for `seconds`."""
    send_nowait = producer.send_nowait
    in_flight: collections.deque[asyncio.Future[Any]] = collections.deque()
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if len(in_flight) >= window:
            await in_flight.popleft()
        in_flight.append(send_nowait(Message(TOPIC, body)))
        sent += 1
    for future in in_flight:
        await future
    return sent / (time.perf_counter() - start)


async def measure(
    all_variants: list[Variant], runs: int, seconds: float, window: int
) -> dict[str, list[tuple[float, float]]]:
    """Per variant, each turn's (messages per second, CPU microseconds per message of the
    server process and this client together). The CPU cost is what a busy machine changes
    least: throughput on a shared machine follows whoever else runs."""
    body = os.urandom(BODY_SIZE)
    rates: dict[str, list[tuple[float, float]]] = {v.name: [] for v in all_variants}
    producers: dict[str, Producer] = {}
    try:
        for variant in all_variants:
            try:
                await prepare(variant)
                producer = Producer(GROUP, variant.namesrv, **variant.producer_options)
                await producer.start()
                producers[variant.name] = producer
                await pipelined(producer, min(seconds, 1.0), window, body)  # warm up
            except Exception as exc:
                variant.error = f"{type(exc).__name__}: {exc}"
        for _ in range(runs):
            for variant in all_variants:
                if variant.name in producers:
                    cpu_before = process_cpu_s(variant.pid) + time.process_time()
                    started = time.perf_counter()
                    rate = await pipelined(producers[variant.name], seconds, window, body)
                    sent = rate * (time.perf_counter() - started)
                    cpu = process_cpu_s(variant.pid) + time.process_time() - cpu_before
                    rates[variant.name].append((rate, cpu / sent * 1e6))
    finally:
        for producer in producers.values():
            await producer.shutdown()
    return rates


def report(
    all_variants: list[Variant], rates: dict[str, list[tuple[float, float]]], window: int
) -> str:
    turns = max(map(len, rates.values()))
    lines = [
        f"pipelined produce, 1 KiB bodies, window {window}, ASYNC_FLUSH, "
        f"python {sys.version.split()[0]}, median of {turns} turns; CPU: server + client",
        f"{'variant':<8} {'msg/s':>10} {'MiB/s':>7} {'vs plain':>9} {'CPU us/msg':>11} "
        f"{'vs plain':>9}  target (throughput)",
    ]
    plain = _medians(rates["plain"])
    for variant in all_variants:
        if not rates[variant.name]:
            lines.append(f"{variant.name:<8} not measured: {variant.error}")
            continue
        rate, cpu = _medians(rates[variant.name])
        mib = rate * BODY_SIZE / 2**20
        ratio = f"{rate / plain[0]:8.2f}x" if plain else "        -"
        cpu_ratio = f"{cpu / plain[1]:8.2f}x" if plain else "        -"
        target = TARGETS.get(variant.name)
        verdict = ""
        if target is not None and plain:
            verdict = f">= {target}x {'met' if rate / plain[0] >= target else 'MISSED'}"
        lines.append(
            f"{variant.name:<8} {rate:>10,.0f} {mib:>7.1f} {ratio} {cpu:>11,.1f} {cpu_ratio}"
            f"  {verdict}"
        )
    return "\n".join(lines)


def _medians(turns: list[tuple[float, float]]) -> tuple[float, float] | None:
    if not turns:
        return None
    return statistics.median(t[0] for t in turns), statistics.median(t[1] for t in turns)


async def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-security-") as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki")
        acl_file = root / "plain_acl.yml"
        acl_file.write_text(ACL_FILE)
        all_variants = variants(pki, acl_file)
        with contextlib.ExitStack() as stack:
            for variant in all_variants:
                variant.namesrv, variant.pid = stack.enter_context(
                    dev_server(root / variant.name, variant.dev_args)
                )
            rates = await measure(all_variants, args.runs, args.seconds, args.window)
    return report(all_variants, rates, args.window)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="turns per variant (median)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one turn")
    parser.add_argument("--window", type=int, default=256, help="sends in flight")
    args = parser.parse_args()
    install_uvloop()
    print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
