"""Large bodies (16 KiB, 1 MiB) pipelined, with CPU per MiB, A/B between two source trees.

Issue 18: judge by CPU per message and per MiB, measured back to back in one run, and set the
1 MiB rate against the machine's sequential write bandwidth measured in the same run. Each
variant is a source tree (`--variant name=path/to/src`, default: this tree's src as "this");
the cases of every variant run in turn, `--rounds` times interleaved, each in a fresh worker
process whose PYTHONPATH is that tree (the broker, `tidemq dev`, runs from the same tree).

    python benchmarks/bench_large.py                             # this tree only
    python benchmarks/bench_large.py --variant before=/tmp/base/src --variant after=src

Rows: rate (msg/s, MiB/s), client and broker CPU in ms per MiB sent (process CPU over the
measured window; the broker's from /proc), and a reference row `disk write+fsync`: the same bytes
written sequentially to a file in the data directory and fsynced once per body (the SYNC ceiling)
and once at the end (the ASYNC ceiling, page cache then disk).

Body kinds: random (os.urandom; what encrypted or compressed payloads look like) and text (JSON):
the client's compression decides differently on each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# No tidemq import at the top: the worker runs under a variant's tree (sidebyside imports none).
from sidebyside.servers import cpu_seconds, tidemq

HERE = Path(__file__).resolve().parent
# 1 KiB first: the 1 MiB cases leave the page cache a gigabyte to write back.
CASES = ("1k:ASYNC_FLUSH", "16k:ASYNC_FLUSH", "1m:ASYNC_FLUSH", "1m:SYNC_FLUSH")
SIZES = {"1k": 1024, "16k": 16 * 1024, "1m": 1024 * 1024}
WINDOWS = {"1k": 256, "16k": 64, "1m": 16}


def body_of(kind: str, size: int) -> bytes:
    if kind == "random":
        return os.urandom(size)
    row = b'{"id": 12345, "name": "user12345", "score": 43210.5, "tags": ["a", "b"]}, '
    return (row * (size // len(row) + 1))[:size]


async def _pipelined(
    namesrv: str, broker_pid: int, size: int, kind: str, seconds: float
) -> dict[str, Any]:
    from tidemq.client.message import Message
    from tidemq.client.producer import Producer

    window = WINDOWS[next(k for k, v in SIZES.items() if v == size)]
    body = body_of(kind, size)
    topic = f"Large{size}{kind}"
    async with Producer("bench_large", namesrv, max_message_size=4 * 1024 * 1024) as producer:
        await producer.send(Message(topic, body))

        async def run(until: float) -> int:
            count = 0

            async def one() -> None:
                nonlocal count
                while time.monotonic() < until:
                    await producer.send(Message(topic, body))
                    count += 1

            await asyncio.gather(*(one() for _ in range(window)))
            return count

        await run(time.monotonic() + min(1.0, seconds / 4))  # warm-up
        cpu0, broker0, t0 = time.process_time(), cpu_seconds(broker_pid), time.monotonic()
        count = await run(t0 + seconds)
        elapsed = time.monotonic() - t0
        cpu, broker = time.process_time() - cpu0, cpu_seconds(broker_pid) - broker0
    mib = count * size / 2**20
    return {
        "rate": count / elapsed,
        "mib_s": mib / elapsed,
        "client_ms_per_mib": cpu * 1e3 / mib,
        "broker_ms_per_mib": broker * 1e3 / mib,
        "client_cores": cpu / elapsed,
        "broker_cores": broker / elapsed,
        "window": window,
    }


def worker(cases: list[str], kind: str, seconds: float) -> None:
    """Runs in a worker process (PYTHONPATH = the variant's tree); prints one JSON line."""
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-large-") as tmp:
        for flush in sorted({case.split(":")[1] for case in cases}):
            with tidemq(Path(tmp), flush) as server:
                for case in cases:
                    name, case_flush = case.split(":")
                    if case_flush == flush:
                        results[case] = asyncio.run(
                            _pipelined(server.address, server.pid, SIZES[name], kind, seconds)
                        )
    print(json.dumps(results))


def reference_disk(directory: Path, size: int, count: int) -> dict[str, float]:
    """MiB/s writing `count` bodies of `size` bytes sequentially: fsync each (SYNC's ceiling),
    and fsync once at the end (ASYNC's)."""
    body = os.urandom(size)
    rates = {}
    for label, each in (("fsync_each", True), ("fsync_end", False)):
        path = directory / f"disk-{label}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        start = time.perf_counter()
        try:
            for _ in range(count):
                os.write(fd, body)
                if each:
                    os.fsync(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        rates[label] = count * size / 2**20 / (time.perf_counter() - start)
        path.unlink()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", default=[], help="name=path/to/src")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--kind", default="random", choices=["random", "text"])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = args.cases.split(",")
    if args.worker:
        worker(cases, args.kind, args.seconds)
        return
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(HERE.parent / "src")}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, src in variants.items():
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            argv = [sys.executable, __file__, "--worker", "--cases", args.cases]
            argv += ["--kind", args.kind, "--seconds", str(args.seconds)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode:  # a failed run is named and left out, not fatal
                print(f"{name}: worker failed: {done.stderr[-2000:]}", file=sys.stderr)
                continue
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    with tempfile.TemporaryDirectory(prefix="tidemq-large-disk-", dir=tempfile.gettempdir()) as tmp:
        disk = reference_disk(Path(tmp), 2**20, 256)
    print(f"bodies: {args.kind}; {args.rounds} rounds x {args.seconds:.0f} s; medians (min-max)")
    print(
        f"{'case':<18} {'variant':<8} {'msg/s':>16} {'MiB/s':>8}"
        f" {'client ms/MiB':>14} {'broker ms/MiB':>14}"
    )
    for case in cases:
        for name in variants:
            rows = [run[case] for run in runs[name]]
            if not rows:
                continue
            rates = [r["rate"] for r in rows]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(
                f"{case:<18} {name:<8} {med['rate']:>8,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
                f" {med['mib_s']:>8.1f} {med['client_ms_per_mib']:>14.2f}"
                f" {med['broker_ms_per_mib']:>14.2f}"
            )
    print(
        f"{'disk write+fsync':<18} {'1 MiB':<8} fsync each: {disk['fsync_each']:,.0f} MiB/s, "
        f"fsync at end: {disk['fsync_end']:,.0f} MiB/s (same disk, same run)"
    )


if __name__ == "__main__":
    main()
