"""TideMQ side by side with Redis Streams, NATS JetStream and RabbitMQ, and the machine's limits.

`make bench` runs this; it appends one Markdown table (absolute figures and ratios) with the
machine, commit and date to benchmarks/RESULTS.md. Every server is started here on 127.0.0.1 with
its data in a temp dir and stopped by pid at the end. Each case is bounded in time and count and
repeated `--runs` times; the table quotes medians (min-max) and the foreign CPU.

    python benchmarks/run_suite.py                 # everything, 3 runs (~11 min on 2 cores)
    python benchmarks/run_suite.py --quick         # smoke run, one short run of a few cases
    python benchmarks/run_suite.py --tidemq-only   # no peers (what CI's smoke test runs)
    python benchmarks/run_suite.py --tidemq-only --cases "latency @500/s" --no-append
                                                   # only the cases whose names contain it

Peers missing from the machine (`make bench-deps` installs them) are skipped and named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside import capacity, cases, machine, report, servers
from sidebyside.common import Options, median_runs, window_for
from sidebyside.drivers import DRIVERS, Driver

log = logging.getLogger("bench")
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
PEER_SERVERS: dict[str, tuple[Callable[[Path], Any], tuple[str, ...]]] = {
    "redis": (servers.redis, ("redis", "redis-always")),
    "nats": (servers.nats, ("nats",)),
    "rabbitmq": (servers.rabbitmq, ("rabbitmq",)),
}


class Run:
    """Collects rows; each row is one (case, system) with the median of its runs."""

    def __init__(self, options: Options, case_filter: tuple[str, ...] = ()) -> None:
        self.options = options
        # Lower-case parts of case names (--cases); empty: every case.
        self.case_filter = case_filter
        self.rows: list[dict[str, Any]] = []
        self.versions: dict[str, str] = {}
        self.skipped: list[str] = []

    def add(
        self,
        case: str,
        system: str,
        client: str,
        durability: str,
        key: str,
        runs: list[dict[str, Any]],
        **extra: Any,
    ) -> None:
        median = median_runs(runs)
        self.rows.append(
            {
                "case": case,
                "system": system,
                "client": client,
                "durability": durability,
                "key": key,
                "median": median,
                **extra,
            }
        )
        log.info(
            "%-34s %-20s %s",
            case,
            system,
            {k: v for k, v in median.items() if not k.endswith(("_min", "_max"))},
        )

    def wants(self, case: str) -> bool:
        """Whether the case named `case` runs (always, unless --cases names others)."""
        name = case.lower()
        return not self.case_filter or any(part in name for part in self.case_filter)

    async def repeat(self, case: Any, *args: Any) -> list[dict[str, Any]]:
        return [await cases.measured(case, *args) for _ in range(self.options.runs)]


def system_name(driver: Driver, flush: str | None) -> str:
    return f"tidemq {flush}" if flush else driver.name


def pipelined_case(options: Options, size: int = 1024) -> str:
    """The pipelined case's name, with its window (cases.produce_pipelined's): the body size is
    named unless it is the default 1 KiB."""
    label = ""
    if size != 1024:
        label = f" {size // 1024} KiB" if size >= 1024 else f" {size} B"
        if size >= 1024 * 1024:
            label = f" {size // 2**20} MiB"
    return f"produce pipelined{label} ({window_for(size, options)} in flight)"


def capacity_case(options: Options, window: int = 1) -> str:
    """The capacity case's name; the TideMQ and redis-benchmark rows are paired by it."""
    in_flight = "" if window == 1 else f" x {window} in flight"
    return f"server capacity ({options.capacity_connections} clients{in_flight})"


async def driver_cases(run: Run, name: str, server: servers.Server, flush: str | None) -> None:
    options = run.options
    state = {"durability": server.durability} if name == "tidemq" else None
    driver = DRIVERS[name](server.address, options, state)
    driver.attached = False
    await driver.connect()
    system = system_name(driver, flush)
    row = {"system": system, "client": driver.client, "durability": driver.durability}

    async def measure(case: str, key: str, function: Any, *args: Any, **extra: Any) -> None:
        if run.wants(case):
            runs = await run.repeat(function, driver, options, *args)
            run.add(case, key=key, runs=runs, **{**row, **extra})

    try:
        await measure("produce one at a time", "rate", cases.produce_sync)
        await measure(pipelined_case(options), "rate", cases.produce_pipelined, 1024)
        batch_client = f"{driver.client}; {driver.batch_note}"
        await measure("produce batched", "rate", cases.produce_batched, client=batch_client)
        await measure("consume + commit", "rate", cases.consume)
        for rate in options.latency_rates:
            await measure(f"end-to-end latency @{rate}/s", "e2e", cases.latency, rate)
        for size in options.sizes:
            if size == 1024:
                continue  # the pipelined row above
            case = pipelined_case(options, size)
            await measure(case, "rate", cases.produce_pipelined, size, size=size)
    finally:
        await driver.close()


def peer_servers(run: Run, root: Path) -> None:
    for server_name, (start, flavours) in PEER_SERVERS.items():
        selected = [flavour for flavour in flavours if flavour in run.options.peers]
        if not selected:
            continue
        if not servers.binary_present(server_name):
            run.skipped.append(f"{server_name} (not installed: make bench-deps)")
            continue
        try:
            with start(root) as server:
                run.versions[server_name] = server.version
                for flavour in selected:
                    try:
                        asyncio.run(driver_cases(run, flavour, server, None))
                    except Exception as exc:  # A peer that fails is reported, not fatal.
                        log.exception("%s failed", flavour)
                        run.skipped.append(f"{flavour} ({type(exc).__name__}: {exc})"[:200])
                case = capacity_case(run.options)
                if server_name == "redis" and "redis-always" in selected and run.wants(case):
                    clients = run.options.capacity_connections
                    runs = []
                    for _ in range(run.options.runs):
                        try:
                            runs.append(
                                capacity.redis_benchmark_xadd(server.address, "always", clients)
                            )
                        except Exception as exc:
                            runs.append({"error": f"{type(exc).__name__}: {exc}"})
                    run.add(
                        case,
                        "redis-always",
                        "redis-benchmark (C)",
                        "AOF appendfsync always",
                        "rate",
                        runs,
                        comparable=True,
                    )
        except Exception as exc:
            log.exception("%s did not start", server_name)
            run.skipped.append(f"{server_name} ({type(exc).__name__}: {exc})"[:200])


async def _topic(address: str) -> str:
    driver = DRIVERS["tidemq"](address, Options())
    await driver.connect()
    try:
        await driver.reset()
        return str(driver.state()["topic"])
    finally:
        await driver.close()


def tidemq_servers(run: Run, root: Path) -> None:
    options = run.options
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        system = f"tidemq {flush}"
        with servers.tidemq(root, flush) as server:
            run.versions["tidemq"] = server.version
            asyncio.run(driver_cases(run, "tidemq", server, flush))
            durability = server.durability
            if run.wants(case := "transactional (half -> local tx -> commit), 256 in flight"):
                run.add(
                    case,
                    system,
                    "tidemq TransactionProducer",
                    durability,
                    "rate",
                    [
                        asyncio.run(cases.measured(cases.transactions, server.address, options))
                        for _ in range(options.runs)
                    ],
                )
            for mode, case in (
                ("sync", "produce one at a time"),
                ("async", pipelined_case(options)),
            ):
                if not run.wants(case):
                    continue
                runs = []
                for index in range(options.runs):
                    topic = asyncio.run(_topic(server.address))
                    try:
                        runs.append(
                            cases.cpp_produce(
                                server.address,
                                topic,
                                mode,
                                options,
                                root / f"cpp-home-{flush}-{mode}-{index}",
                            )
                        )
                    except Exception as exc:
                        runs.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
                run.add(
                    case,
                    system,
                    f"C++ rocketmq 0.4.4 send_{mode}",
                    durability,
                    "rate",
                    runs,
                    comparable=False,
                )
            for window in (1, 16):
                case = capacity_case(options, window)
                if not run.wants(case):
                    continue
                runs = []
                for _ in range(options.runs):
                    topic = asyncio.run(_topic(server.address))
                    runs.append(capacity_run(server, topic, options, window))
                run.add(
                    case,
                    system,
                    f"raw-frame load generator, {options.capacity_processes} processes",
                    durability,
                    "rate",
                    runs,
                    comparable=window == 1,
                )
    rss_case = f"broker RSS, backlog {options.backlog_bytes / 2**30:.2f} GiB"
    if not run.wants(rss_case):
        return
    with servers.tidemq(root, "ASYNC_FLUSH") as server:
        result = asyncio.run(cases.measured(cases.broker_rss, server.address, server.pid, options))
        run.add(
            rss_case,
            "tidemq ASYNC_FLUSH",
            "tidemq Producer, 64 KiB bodies",
            server.durability,
            "rss",
            [result],
        )


def capacity_run(
    server: servers.Server, topic: str, options: Options, window: int
) -> dict[str, Any]:
    from sidebyside.common import cpu_foreign_cores, cpu_snapshot

    start = cpu_snapshot()
    try:
        result = capacity.tidemq_capacity(server.broker_address, topic, options, window)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    result["cpu_foreign"] = cpu_foreign_cores(start, cpu_snapshot())
    return result


def machine_limits(run: Run, root: Path) -> dict[str, Any]:
    return median_runs([machine.measure(root, run.options.quick) for _ in range(run.options.runs)])


def describe_machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
        memory = f"{kib / 2**20:.1f} GiB"
    commit = "?"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=RESULTS.parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
            check=True,
            cwd=RESULTS.parent,
        ).stdout.strip()
        commit += " (src/ modified)" if dirty else ""
    return (
        f"nproc {os.cpu_count()}, {model}, memory {memory}, {platform.platform()}, "
        f"Python {sys.version.split()[0]}; commit {commit}"
    )


def rss_note(run: Run) -> str:
    for row in run.rows:
        if row["key"] == "rss" and "error" not in row["median"]:
            return cases.describe_rss(row["median"])
    return "Broker RSS: not measured."


def render(run: Run, machine_figures: dict[str, Any], started: float) -> str:
    rows = [row for row in run.rows if row["key"] != "rss"]
    options = run.options
    parts = [
        f"## Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        + (" (--quick)" if options.quick else "")
        + (f" (--cases {','.join(run.case_filter)})" if run.case_filter else ""),
        "",
        f"Machine: {describe_machine()}. Runs per case: {options.runs} (median, min-max); "
        f"each measurement ≤ {options.measure_s} s; 1 KiB bodies unless stated; suite took "
        f"{(time.monotonic() - started) / 60:.1f} min.",
        "",
        report.table(rows, machine_figures),
        "",
        report.machine_table(machine_figures),
        "",
        rss_note(run),
        "",
        "Servers: " + "; ".join(f"{k}: {v}" for k, v in sorted(run.versions.items())) + ". "
        "Every client runs on uvloop. Durability classes compared: ASYNC_FLUSH ↔ Redis everysec, "
        "NATS (acks before fsync); SYNC_FLUSH (group commit) ↔ Redis always, RabbitMQ confirms. "
        "Rows marked with no peer ratio have no peer at equal durability (C++ client rows, "
        "capacity with 16 in flight per client, transactions).",
    ]
    if run.skipped:
        parts += ["", "Skipped: " + "; ".join(run.skipped) + "."]
    return "\n".join(parts) + "\n"


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tidemq-suite-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one short run of each case")
    parser.add_argument("--tidemq-only", action="store_true", help="no peer brokers")
    parser.add_argument("--peers", default="redis,redis-always,nats,rabbitmq")
    parser.add_argument("--peers-only", action="store_true", help="skip the TideMQ servers")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Markdown file appended to")
    parser.add_argument("--no-append", action="store_true", help="print only")
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated parts of case names (any case whose name contains one runs; "
        'e.g. "latency @500/s,capacity"); default: every case',
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    peers = () if args.tidemq_only else tuple(p for p in args.peers.split(",") if p)
    options = Options.quick_mode(peers) if args.quick else Options(runs=args.runs, peers=peers)
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()
    # A terminated suite still stops the servers it started (the context managers' finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    case_filter = tuple(part.strip().lower() for part in args.cases.split(",") if part.strip())
    run = Run(options, case_filter)
    with scratch() as root:
        machine_figures = machine_limits(run, root)
        log.info(
            "machine %s",
            {
                k: round(v)
                for k, v in machine_figures.items()
                if isinstance(v, float) and not k.endswith(("_min", "_max"))
            },
        )
        peer_servers(run, root)
        if not args.peers_only:
            try:
                tidemq_servers(run, root)
            except Exception as exc:  # Keep what was measured; the table names the failure.
                log.exception("tidemq cases failed")
                run.skipped.append(f"tidemq ({type(exc).__name__}: {exc})"[:300])
    text = render(run, machine_figures, started)
    sys.stdout.write(text)
    if not args.no_append:
        with args.out.open("a") as out:
            out.write("\n" + text)
    failed = [row for row in run.rows if "error" in row["median"]]
    sys.exit(1 if failed and args.quick else 0)


if __name__ == "__main__":
    main()
