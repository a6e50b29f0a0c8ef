"""Replication side by side (issue 13): produce with a TideMQ master+slave pair against one
TideMQ broker with SYNC_FLUSH and against NATS JetStream with three replicas, in one run.

Systems (every server its own process on loopback, started and stopped here):

    tidemq SYNC_FLUSH                   one broker, group commit: the reference row
    tidemq SYNC_MASTER + SYNC_FLUSH     master and slave both SYNC_FLUSH; a send is answered once
                                        the master's fsync is done and the slave reported past it
    tidemq SYNC_MASTER + ASYNC_FLUSH    both ASYNC_FLUSH; answered once the slave has it (in its
                                        page cache: neither broker has synced it)
    nats-r3                             three nats-server processes, stream num_replicas=3

Cases: cases.produce_sync (one in flight: the ack latency replication adds),
cases.produce_pipelined (1 KiB, `window` in flight) and cases.produce_batched (TideMQ:
SEND_BATCH_MESSAGE of `batch`, `batch_window` in flight; NATS has no batch API). Each row has its
absolute rate, its ratio to the single-node SYNC_FLUSH row of the same case in the same run, and
the CPU cores each broker process used during the case (on a 2-core machine the master, the slave
and the client share two cores, which a real deployment would not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidebyside import cases, servers
from sidebyside.common import Options, median_runs, window_for
from sidebyside.drivers import DRIVERS, Driver

log = logging.getLogger("bench.replication")

IN_SYNC_TIMEOUT_S = 60.0  # a fresh slave of an empty master connects within a few backoffs
IN_SYNC_POLL_S = 0.05
RUNTIME_INFO_TIMEOUT_MS = 3000.0
REFERENCE = "tidemq SYNC_FLUSH"


@dataclass(frozen=True)
class System:
    label: str
    kind: str  # "tidemq" or "nats-r3"
    flush: str = ""
    role: str = "ASYNC_MASTER"
    slaves: int = 0


SYSTEMS: tuple[System, ...] = (
    System(REFERENCE, "tidemq", "SYNC_FLUSH"),
    System("tidemq SYNC_MASTER + SYNC_FLUSH", "tidemq", "SYNC_FLUSH", "SYNC_MASTER", 1),
    System("tidemq SYNC_MASTER + ASYNC_FLUSH", "tidemq", "ASYNC_FLUSH", "SYNC_MASTER", 1),
    System("nats-r3", "nats-r3"),
)
EXTRA_SYSTEMS: tuple[System, ...] = (  # --systems may name these too
    System("tidemq ASYNC_FLUSH", "tidemq", "ASYNC_FLUSH"),
    System("tidemq ASYNC_MASTER + ASYNC_FLUSH", "tidemq", "ASYNC_FLUSH", "ASYNC_MASTER", 1),
)


def pipelined_case(options: Options) -> str:
    return f"produce pipelined ({window_for(1024, options)} in flight)"


def batched_case(options: Options) -> str:
    return f"produce batched ({options.batch} per batch, {options.batch_window} in flight)"


# -- runtime info -------------------------------------------------------------------------------


async def runtime_info(admin: Any, addr: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO (28) of the broker at `addr`, as its key/value table."""
    from tidemq.protocol.bodies import KVTable
    from tidemq.protocol.codes import RequestCode, ResponseCode
    from tidemq.protocol.frame import RemotingCommand

    cmd = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
    response = await admin.instance.remoting.invoke(addr, cmd, RUNTIME_INFO_TIMEOUT_MS)
    if response.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"runtime info of {addr}: code {response.code} {response.remark}")
    return dict(KVTable.from_json(response.body).table)


async def wait_in_sync(
    admin: Any, group: servers.Group, timeout_s: float = IN_SYNC_TIMEOUT_S
) -> None:
    """Until every slave of `group` is connected and has the master's max offset.

    Raises RuntimeError naming what was last seen (a broker without the HA keys, a slave that
    refused to follow) when that does not happen within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            master = await runtime_info(admin, group.master.address)
            seen = {"master": f"{master.get('haSlaveCount')} slaves"}
            ready = True
            for slave in group.slaves:
                info = await runtime_info(admin, slave.address)
                seen[slave.name] = (
                    f"connected={info.get('haConnected')} offset={info.get('haReplicaOffset')} "
                    f"refused={info.get('haRefusedReason')!r}"
                )
                ready &= info.get("haConnected") == "true" and info.get(
                    "haReplicaOffset"
                ) == master.get("commitLogMaxOffset")
            if ready and int(master.get("haSlaveCount", "0")) >= len(group.slaves):
                return
        await asyncio.sleep(IN_SYNC_POLL_S)
    raise RuntimeError(f"slaves not in sync within {timeout_s:g} s: {seen}")


# -- the side-by-side run -----------------------------------------------------------------------


@contextlib.contextmanager
def started(system: System, root: Path) -> Iterator[tuple[servers.Server, dict[str, int]]]:
    """The servers of `system`; yields what the driver connects to and the broker pids."""
    if system.kind == "nats-r3":
        with servers.nats_cluster(root) as server:
            yield server, {f"node{i}": pid for i, pid in enumerate(server.pids)}
        return
    with servers.tidemq_group(root, system.flush, system.role, system.slaves) as group:
        if group.slaves:

            async def in_sync() -> None:
                from tidemq import Admin

                async with Admin(group.namesrv) as admin:
                    await wait_in_sync(admin, group)

            asyncio.run(in_sync())
        yield group.server, group.pids


async def _measured_with_cpu(
    case: Any, driver: Driver, options: Options, pids: dict[str, int]
) -> dict[str, Any]:
    before = {name: servers.cpu_seconds(pid) for name, pid in pids.items()}
    start = time.monotonic()
    result = await cases.measured(case, driver, options)
    elapsed = time.monotonic() - start
    for name, pid in pids.items():
        result[f"cpu_{name}"] = (servers.cpu_seconds(pid) - before[name]) / elapsed
    return result


def _cases(options: Options) -> tuple[tuple[str, Any], ...]:
    return (
        ("produce one at a time", cases.produce_sync),
        (pipelined_case(options), cases.produce_pipelined),
        (batched_case(options), cases.produce_batched),
    )


async def _one_round(
    system: System, server: servers.Server, pids: dict[str, int], options: Options
) -> dict[str, Any]:
    """One measurement of every case on `system`: {case: result}, plus the row's texts."""
    state = {"durability": server.durability} if system.kind == "tidemq" else None
    driver = DRIVERS[system.kind](server.address, options, state)
    driver.attached = False
    await driver.connect()
    results: dict[str, Any] = {}
    try:
        for case_name, case in _cases(options):
            results[case_name] = await _measured_with_cpu(case, driver, options, pids)
    finally:
        await driver.close()
    results["_client"] = driver.client
    results["_batch_note"] = driver.batch_note
    results["_durability"] = driver.durability or server.durability
    return results


def _brief(median: dict[str, Any]) -> dict[str, Any]:
    return {
        k: round(v, 2) if isinstance(v, float) else v
        for k, v in median.items()
        if not k.endswith(("_min", "_max"))
    }


def _rows(
    options: Options, systems: tuple[System, ...], rounds: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    rows = []
    for system in systems:
        measured = rounds.get(system.label, [])
        if not measured:
            continue
        first = measured[0]
        for case_name, case in _cases(options):
            median = median_runs([m[case_name] for m in measured])
            note = f"; {first['_batch_note']}" if case is cases.produce_batched else ""
            rows.append(
                {
                    "case": case_name,
                    "system": system.label,
                    "client": first["_client"] + note,
                    "durability": first["_durability"],
                    "median": median,
                }
            )
            log.info("%-40s %-34s %s", case_name, system.label, _brief(median))
    return rows


def run(
    root: Path, options: Options, systems: tuple[System, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """`options.runs` rounds; each round starts every system afresh and measures every case
    once, so slow drift in the machine's other load falls on every system alike (the median
    per row is over the rounds). Returns the rows and what was skipped (and why)."""
    skipped: list[str] = []
    rounds: dict[str, list[dict[str, Any]]] = {}
    failed: set[str] = set()
    for index in range(options.runs):
        for system in systems:
            if system.label in failed:
                continue
            if system.kind == "nats-r3" and not servers.binary_present("nats"):
                failed.add(system.label)
                skipped.append(
                    f"{system.label} (nats-server not installed: apt-get install nats-server)"
                )
                continue
            directory = root / f"{system.label.replace(' ', '_').replace('+', '')}-{index}"
            try:
                with started(system, directory) as (server, pids):
                    result = asyncio.run(_one_round(system, server, pids, options))
                rounds.setdefault(system.label, []).append(result)
            except Exception as exc:  # One system that fails is reported; the others still run.
                log.exception("%s failed", system.label)
                failed.add(system.label)
                skipped.append(f"{system.label} ({type(exc).__name__}: {exc})"[:300])
    return _rows(options, systems, rounds), skipped


# -- the table ----------------------------------------------------------------------------------


def _number(value: Any, digits: int = 0) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:,.{digits}f}"


def _cpu(median: dict[str, Any]) -> str:
    parts = [
        f"{key[4:]} {median[key]:.2f}"
        for key in sorted(median)
        if key.startswith("cpu_") and key != "cpu_foreign" and not key.endswith(("_min", "_max"))
    ]
    return ", ".join(parts) or "-"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (case, system), the ratio to the reference row of the case."""
    reference = {
        row["case"]: row["median"].get("rate")
        for row in rows
        if row["system"] == REFERENCE and "error" not in row["median"]
    }
    lines = [
        f"| case | system | client | durability | msg/s median (min-max) | / {REFERENCE} "
        "(same run) | broker CPU (cores) | foreign CPU (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        median = row["median"]
        if "error" in median:
            figure, ratio = f"error: {median['error'][:100]}", ""
        else:
            rate = median["rate"]
            figure = _number(rate)
            if median.get("runs", 1) > 1:
                figure += f" ({_number(median['rate_min'])}-{_number(median['rate_max'])})"
            if "ack_p50_us" in median:
                figure += (
                    f"; ack p50/p99 {_number(median['ack_p50_us'])}/"
                    f"{_number(median['ack_p99_us'])} us"
                )
            base = reference.get(row["case"])
            ratio = f"{rate / base:.2f}x" if base else ""
        lines.append(
            f"| {row['case']} | {row['system']} | {row['client']} | {row['durability']} "
            f"| {figure} | {ratio} | {_cpu(median)} | {_number(median.get('cpu_foreign'), 2)} |"
        )
    return "\n".join(lines)
