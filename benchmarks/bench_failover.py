"""Failover benchmarks (issue 14): how long a kill -9 of the master stops producers, and what
controller mode's group acknowledgement costs on pipelined produce.

    failover  a controller-mode group (etcd, a name server, 3 replicas of broker-a as processes:
              tidemq.testing.failover_group, FAST_FAILOVER_SETTINGS, controllerLeaseTtlSeconds
              `--lease-ttl`, 2 by default). One Python producer sends continuously, one message
              at a time, a failed send retried after 20 ms. `--failovers` times: wait until the
              published master's in-sync set (runtime info syncStateSet) has 3 members, kill -9
              it, take the time from the kill to the first acknowledged send after it, restart
              the killed replica and wait until it is back in the in-sync set:

                  in-sync {1,2,3} --kill -9 master--> ... lease expires, a syncSet member is
                  elected, registers as brokerId 0, the producer's route moves --> first ack
                         |<------------------- failover time ------------------->|

              Then every acknowledged body is read back (tidemq.testing.reading.pull_bodies):
              lost must be 0. The reference figure is the lease TTL itself (a successor cannot
              be elected before the dead master's lease expires). Target: p99 <= 5 s.
    cost      pipelined produce (1 KiB, a window in flight: sidebyside.cases.produce_pipelined)
              against (a) one broker with SYNC_FLUSH (the reference), (b) the controller-mode
              group of 3 with ASYNC_FLUSH and (c) with SYNC_FLUSH, each started afresh, `--runs`
              rounds alternating the three; median (min-max) msg/s and the ratio to (a).
              Every broker of the three uses the default segment sizes. Target: >= 0.75x.

Every process is on 127.0.0.1 with its data in a temp dir and is stopped by pid at the end.
Results are printed and appended to benchmarks/RESULTS.md (`--no-append`: not).

Usage: python benchmarks/bench_failover.py [all|failover|cost] [--failovers 20]
           [--lease-ttl 2] [--runs 3] [--measure-s 3] [--quick] [--no-append]

`all` takes about 10 min on 2 cores. Needs etcd (Debian etcd-server; `make test` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import logging
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replication import machine_line
from sidebyside import cases, servers
from sidebyside.common import Options, median_runs, percentile, window_for
from sidebyside.drivers import TideDriver

from tidemq.protocol.message_id import decode_offset_msg_id

log = logging.getLogger("bench")
RESULTS: Final = Path(__file__).resolve().parent / "RESULTS.md"

TOPIC: Final = "BenchFailover"
QUEUES: Final = 4
RETRY_PAUSE_S: Final = 0.02  # a failed send is retried after this pause, as an application would
SEND_TIMEOUT_MS: Final = 2_000  # the producer's budget per send (retries included)
SETTLE_S: Final = 60.0  # elections, registration and a replica's rejoin on a loaded 2-core box
ACK_LIMIT_S: Final = 60.0  # no ack this long after a kill: the run fails
READ_BACK_S: Final = 60.0  # the read-back may first meet a master still adopting the topic
FAILOVER_TARGET_S: Final = 5.0
COST_TARGET: Final = 0.75
REFERENCE: Final = "one broker, SYNC_FLUSH"
LOG_LEVEL: Final = "WARNING"


def _segments() -> dict[str, str]:
    """The default segment sizes, for every broker of the cost case alike (the test harness's
    group otherwise uses small test segments, which roll every few seconds at these rates)."""
    from tidemq.broker.config import BrokerConfig
    from tidemq.limits import CONSUME_QUEUE_ENTRY_SIZE

    defaults = BrokerConfig()
    return {
        "mappedFileSizeCommitLog": str(defaults.commit_log_file_size),
        "mappedFileSizeConsumeQueue": str(
            defaults.consume_queue_file_entries * CONSUME_QUEUE_ENTRY_SIZE
        ),
    }


# -- the group ----------------------------------------------------------------------------------


async def _runtime(admin: Any, addr: str) -> dict[str, str]:
    from tidemq.errors import QueueError

    try:
        return dict(await admin.broker_runtime_info(addr))
    except (QueueError, OSError):
        return {}


async def _in_sync(group: Any, admin: Any, size: int, timeout_s: float = SETTLE_S) -> Any:
    """The published master (a ServerProcess), once it is a controller master whose in-sync set
    has `size` replicas."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        master = await group.published_master()
        if master is not None and master.running:
            seen = await _runtime(admin, master.address)
            members = [i for i in seen.get("syncStateSet", "").split(",") if i]
            if seen.get("controllerRole") == "MASTER" and len(members) == size:
                return master
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no master with an in-sync set of {size} within {timeout_s:g} s: {seen}")


# -- failover -----------------------------------------------------------------------------------


class Sender:
    """Sends numbered messages one after another for ever (the caller cancels); remembers every
    acknowledged body and when its ack came."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.acked: list[bytes] = []
        self.ack_times: list[float] = []  # monotonic, ascending
        self.ack_from: list[str] = []  # the answering broker (offsetMsgId's store host) per ack
        self.failed = 0
        self.errors: dict[str, int] = {}
        self.acked_event = asyncio.Event()
        self.late_acks = 0  # acks of the killed master read after the kill (last failover)

    async def run(self) -> None:
        from tidemq import Message, SendStatus
        from tidemq.errors import QueueError

        number = 0
        while True:
            body = b"f-%08d" % number
            number += 1
            try:
                result = await self.producer.send(Message(TOPIC, body))
                error = "" if result.status is SendStatus.SEND_OK else result.status.name
            except QueueError as exc:
                error = type(exc).__name__
            if error:
                self.failed += 1
                self.errors[error] = self.errors.get(error, 0) + 1
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            self.acked.append(body)
            self.ack_times.append(time.monotonic())
            host, port, _ = decode_offset_msg_id(result.offset_msg_id)
            self.ack_from.append(f"{host}:{port}")
            self.acked_event.set()

    def _first_after(self, moment: float, not_from: str) -> tuple[float | None, int]:
        """(seconds to the first ack after `moment` not answered by `not_from`, how many acks
        before it `not_from` answered)."""
        start = bisect.bisect_right(self.ack_times, moment)
        for index in range(start, len(self.ack_times)):
            if self.ack_from[index] != not_from:
                return self.ack_times[index] - moment, index - start
        return None, len(self.ack_times) - start

    async def first_ack_after(self, moment: float, timeout_s: float, not_from: str = "") -> float:
        """Seconds from `moment` to the first acknowledgement after it by a broker other than
        `not_from` (waits for one). An answer of the killed master read after the kill was
        sent before it died: the producer's loop had not yet run (kill() reaps synchronously)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found, self.late_acks = self._first_after(moment, not_from)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no send acknowledged within {timeout_s:g} s of the kill")
            self.acked_event.clear()
            try:
                await asyncio.wait_for(self.acked_event.wait(), left)
            except TimeoutError:
                pass


async def _one_failover(group: Any, admin: Any, sender: Sender) -> dict[str, Any]:
    """Kill the in-sync master; the failover time, who took over, the killed replica's rejoin."""
    master = await _in_sync(group, admin, 3)
    failed_before = sender.failed
    killed_at = time.monotonic()
    master.kill()
    failover_s = await sender.first_ack_after(killed_at, ACK_LIMIT_S, master.address)
    failed, late = sender.failed - failed_before, sender.late_acks
    successor = await group.master(SETTLE_S, not_=master)
    restarted_at = time.monotonic()
    await master.start()
    await _in_sync(group, admin, 3)
    return {
        "failover_s": failover_s,
        "killed": master.name,
        "successor": successor.name,
        "failed_sends": failed,
        "late_acks": late,
        "rejoin_s": time.monotonic() - restarted_at,
    }


async def _read_back(namesrv: str, acked: list[bytes]) -> set[bytes]:
    """What a consumer reads of TOPIC (retried while the topic's master is still settling)."""
    from tidemq.errors import QueueError
    from tidemq.testing.reading import pull_bodies

    deadline = time.monotonic() + READ_BACK_S
    read: set[bytes] = set()
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        try:
            read = await pull_bodies(namesrv, TOPIC, f"bench_failover_check_{attempt}")
        except QueueError:
            read = set()
        if not set(acked) - read:
            break
        await asyncio.sleep(1.0)
    return read


async def _failover_run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from tidemq import Admin, Producer
    from tidemq.testing.failover_group import controlled_group

    settings = {"controllerLeaseTtlSeconds": str(args.lease_ttl)}
    async with controlled_group(root, settings=settings, log_level=LOG_LEVEL) as group:
        async with Admin(group.namesrv_addr, timeout_ms=2_000) as admin:
            master = await _in_sync(group, admin, 3)
            await admin.create_topic(
                TOPIC, broker_addr=master.address, read_queue_nums=QUEUES, write_queue_nums=QUEUES
            )
            producer = Producer(
                "bench_failover", group.namesrv_addr, send_timeout_ms=SEND_TIMEOUT_MS
            )
            async with producer:
                sender = Sender(producer)
                task = asyncio.create_task(sender.run())
                started = time.monotonic()
                runs: list[dict[str, Any]] = []
                try:
                    await sender.first_ack_after(started - 1, SETTLE_S)
                    for index in range(args.failovers):
                        runs.append(await _one_failover(group, admin, sender))
                        log.info("failover %d/%d: %s", index + 1, args.failovers, runs[-1])
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                elapsed = time.monotonic() - started
        read = await _read_back(group.namesrv_addr, sender.acked)
    lost = set(sender.acked) - read
    return {
        "runs": runs,
        "acked": len(sender.acked),
        "failed": sender.failed,
        "errors": sender.errors,
        "send_rate": len(sender.acked) / elapsed,
        "read": len(read),
        "lost": len(lost),
        "lost_sample": sorted(lost)[:3],
    }


def failover(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    try:
        return asyncio.run(_failover_run(args, root / "failover"))
    except Exception as exc:
        log.exception("failover failed")
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


# -- cost ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    label: str
    flush: str
    controlled: bool  # the controller-mode group of 3, or one plain broker


SYSTEMS: Final = (
    System(REFERENCE, "SYNC_FLUSH", False),
    System("controller group of 3, ASYNC_FLUSH", "ASYNC_FLUSH", True),
    System("controller group of 3, SYNC_FLUSH", "SYNC_FLUSH", True),
)


async def _measure(namesrv: str, options: Options, pids: dict[str, int]) -> dict[str, Any]:
    """One pipelined-produce measurement through the side-by-side TideMQ driver, with the CPU
    cores each broker process used."""
    driver = TideDriver(namesrv, options, {})
    driver.attached = False
    await driver.connect()
    try:
        before = {name: servers.cpu_seconds(pid) for name, pid in pids.items()}
        start = time.monotonic()
        result = await cases.measured(cases.produce_pipelined, driver, options)
        elapsed = time.monotonic() - start
    finally:
        await driver.close()
    for name, pid in pids.items():
        result[f"cpu_{name}"] = (servers.cpu_seconds(pid) - before[name]) / elapsed
    return result


async def _measure_group(system: System, root: Path, options: Options) -> dict[str, Any]:
    from tidemq import Admin
    from tidemq.testing.failover_group import controlled_group

    settings = {"flushDiskType": system.flush, **_segments()}
    async with controlled_group(root, settings=settings, log_level=LOG_LEVEL) as group:
        async with Admin(group.namesrv_addr, timeout_ms=2_000) as admin:
            master = await _in_sync(group, admin, 3)
        slaves = [r for r in group.replicas if r is not master]
        pids = {"master": master.pid} | {f"slave{i}": r.pid for i, r in enumerate(slaves, 1)}
        result = await _measure(group.namesrv_addr, options, pids)
        async with Admin(group.namesrv_addr, timeout_ms=2_000) as admin:
            info = await _runtime(admin, master.address)
        result["sync_set_after"] = info.get("syncStateSet", "?")
        return result


def _cost_round(system: System, root: Path, options: Options) -> dict[str, Any]:
    if system.controlled:
        return asyncio.run(_measure_group(system, root, options))
    with servers.tidemq_group(root, system.flush, "ASYNC_MASTER", 0, **_segments()) as group:
        return asyncio.run(_measure(group.namesrv, options, {"master": group.master.pid}))


def cost(args: argparse.Namespace, root: Path) -> dict[str, dict[str, Any]]:
    """`--runs` rounds, each starting every system afresh in turn (slow drift in the machine's
    other load falls on every system alike); the median per system over the rounds."""
    options = Options(runs=args.runs, measure_s=args.measure_s)
    measured: dict[str, list[dict[str, Any]]] = {s.label: [] for s in SYSTEMS}
    for index in range(args.runs):
        for system in SYSTEMS:
            directory = root / f"cost-{index}-{system.label.replace(' ', '_').replace(',', '')}"
            directory.mkdir(parents=True)
            try:
                result = _cost_round(system, directory, options)
            except Exception as exc:  # one failed round is reported; the others still run
                log.exception("%s failed", system.label)
                result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            log.info("cost round %d %s: %s", index + 1, system.label, result)
            measured[system.label].append(result)
    return {label: median_runs(results) for label, results in measured.items()}


# -- the report ---------------------------------------------------------------------------------


def _f(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def failover_text(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    head = (
        f"Failover: controller group of 3 (FAST_FAILOVER_SETTINGS, controllerLeaseTtlSeconds="
        f"{args.lease_ttl}), one Python producer sending one at a time (a failed send retried "
        f"after {RETRY_PAUSE_S * 1000:.0f} ms), {args.failovers} x kill -9 of the in-sync master."
    )
    if "error" in result:
        return [head, "", f"error: {result['error']}"]
    times = [r["failover_s"] for r in result["runs"]]
    rejoins = [r["rejoin_s"] for r in result["runs"]]
    ttl = float(args.lease_ttl)
    p99 = percentile(times, 0.99)
    verdict = "met" if p99 <= FAILOVER_TARGET_S else "**missed**"
    lines = [
        head,
        "",
        "| kill -> first ack | p50 | p99 | max | min | / lease TTL (p50, p99) |",
        "|---|---|---|---|---|---|",
        f"| seconds | {_f(percentile(times, 0.5), 2)} | {_f(p99, 2)} | {_f(max(times), 2)} | "
        f"{_f(min(times), 2)} | {percentile(times, 0.5) / ttl:.2f}x, {p99 / ttl:.2f}x |",
        "",
        f"Target p99 <= {FAILOVER_TARGET_S:g} s: {verdict}. All (s): "
        + ", ".join(f"{t:.2f}" for t in times)
        + ".",
        f"Killed replica back in the in-sync set (from its restart) p50 "
        f"{_f(percentile(rejoins, 0.5), 1)} s, max {_f(max(rejoins), 1)} s. Answers of the "
        f"killed master read after the kill (sent before it; not counted): "
        f"{sum(r.get('late_acks', 0) for r in result['runs'])}. New master: "
        + ", ".join(f"{r['killed'][-2:]}->{r['successor'][-2:]}" for r in result["runs"])
        + ".",
        f"Sends: {result['acked']:,} acknowledged ({_f(result['send_rate'], 0)} msg/s overall), "
        f"{result['failed']:,} failed and retried ({result['errors']}); read back "
        f"{result['read']:,} distinct (a send whose answer died with a master may be stored "
        f"unacknowledged); **lost {result['lost']}** (acknowledged, not read back)"
        + (f" (e.g. {result['lost_sample']})" if result["lost"] else "")
        + ".",
    ]
    return lines


def _cpu(median: dict[str, Any]) -> str:
    keys = [k for k in sorted(median) if k.startswith("cpu_") and not k.endswith(("_min", "_max"))]
    return ", ".join(f"{k[4:]} {median[k]:.2f}" for k in keys if k != "cpu_foreign") or "-"


def cost_table(medians: dict[str, dict[str, Any]], options: Options) -> str:
    base = medians.get(REFERENCE, {}).get("rate")
    lines = [
        f"| produce pipelined (1 KiB, {window_for(1024, options)} in flight) | msg/s median "
        f"(min-max) | / {REFERENCE} (same run) | broker CPU (cores) | foreign CPU (cores) |",
        "|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        m = medians[system.label]
        if "error" in m:
            lines.append(f"| {system.label} | error: {m['error'][:200]} ||||")
            continue
        figure = f"{_f(m['rate'], 0)} ({_f(m['rate_min'], 0)}-{_f(m['rate_max'], 0)})"
        ratio = f"{m['rate'] / base:.2f}x" if base else "-"
        if base and system.controlled:
            low, high = m["rate_min"] / base, m["rate_max"] / base
            ratio += f" ({low:.2f}-{high:.2f} against the reference's median)"
        lines.append(
            f"| {system.label} | {figure} | {ratio} | {_cpu(m)} | {_f(m.get('cpu_foreign'), 2)} |"
        )
    return "\n".join(lines)


def render(args: argparse.Namespace, parts: dict[str, Any], started: float) -> str:
    out = [
        f"## Failover, {time.strftime('%Y-%m-%d %H:%M:%S %Z')} (issue 14; "
        f"`benchmarks/bench_failover.py {args.what}"
        + (" --quick" if args.quick else "")
        + (f" --failovers {args.failovers}" if "failover" in parts else "")
        + (f" --runs {args.runs} --measure-s {args.measure_s:g}" if "cost" in parts else "")
        + "`)",
        "",
        f"Machine: {machine_line()}; took {(time.monotonic() - started) / 60:.1f} min.",
    ]
    if "failover" in parts:
        out += ["", *failover_text(parts["failover"], args)]
    if "cost" in parts:
        options = Options(runs=args.runs, measure_s=args.measure_s)
        out += [
            "",
            f"Cost of controller mode: pipelined produce for {args.measure_s:g} s per run, "
            f"{args.runs} run(s) alternating the systems, each started afresh; group "
            f"acknowledgement waits for every in-sync replica. Target >= {COST_TARGET:g}x.",
            "",
            cost_table(parts["cost"], options),
        ]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="?", default="all", choices=("all", "failover", "cost"))
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--lease-ttl", type=int, default=2, help="controllerLeaseTtlSeconds")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--measure-s", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="one failover, one short cost run")
    parser.add_argument("--dir", type=Path, default=None, help="where the temp dirs go")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.failovers, args.runs, args.measure_s = 1, 1, 1.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    # The client logs every send refused during a failover; the run counts them instead.
    logging.getLogger("tidemq").setLevel(logging.ERROR)
    # A terminated run still stops the servers it started (the context managers' finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()
    started = time.monotonic()
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-failover-", dir=args.dir) as tmp:
        root = Path(tmp)
        if args.what in ("all", "failover"):
            parts["failover"] = failover(args, root)
        if args.what in ("all", "cost"):
            parts["cost"] = cost(args, root)
    text = render(args, parts, started)
    sys.stdout.write(text)
    if not args.no_append:
        with args.out.open("a") as out:
            out.write("\n" + text)
    failed = parts.get("failover", {}).get("error") or parts.get("failover", {}).get("lost")
    failed = failed or any("error" in m for m in parts.get("cost", {}).values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
