"""Shared pieces of the suite: options, statistics, timestamps in payloads, CPU accounting.

The CPU used by *foreign* processes (anything that is not this suite, its children or the servers
it started) is the main noise source on a small shared machine. It is measured as the reference
harness does: busy jiffies of the whole machine from /proc/stat minus the jiffies of our process
tree (read from /proc/<pid>/stat for every live descendant, plus reaped children via rusage).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BODY_SIZE_DEFAULT = 1024  # bytes; the default body
STAMP = struct.Struct("<q")  # time.monotonic_ns() at the head of each latency-case payload
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Options:
    """Bounds of every case. Each measurement stops at its count or its time, whichever first."""

    runs: int = 3
    quick: bool = False
    measure_s: float = 2.0  # cap on one measurement
    window: int = 256  # sends in flight for "pipelined"
    batch: int = 64  # messages per batch request
    batch_window: int = 4  # batch requests in flight
    count_sync: int = 20_000
    count_pipelined: int = 200_000
    count_consume: int = 50_000
    latency_s: float = 3.0  # open-loop producer duration at each fixed rate
    latency_rates: tuple[int, ...] = (500, 5000)
    sizes: tuple[int, ...] = (128, 1024, 16 * 1024, 1024 * 1024)
    inflight_bytes_max: int = 16 * 1024 * 1024  # window is cut to this many bytes in flight
    capacity_s: float = 4.0
    capacity_processes: int = 2
    capacity_connections: int = 50  # in total, like redis-benchmark -c 50
    backlog_bytes: int = 2 * 1024**3  # broker RSS case
    peers: tuple[str, ...] = ("redis", "redis-always", "nats", "rabbitmq")
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def quick_mode(peers: tuple[str, ...]) -> Options:
        return Options(
            runs=1,
            quick=True,
            measure_s=0.4,
            count_sync=2000,
            count_pipelined=20_000,
            count_consume=5000,
            latency_s=0.6,
            latency_rates=(500,),
            sizes=(128, 16 * 1024),
            capacity_s=0.8,
            backlog_bytes=32 * 1024**2,
            peers=peers,
        )


def window_for(size: int, options: Options) -> int:
    """The pipelined window for a body size: `options.window`, cut to the in-flight byte cap."""
    return max(1, min(options.window, options.inflight_bytes_max // size))


def payload(size: int) -> bytes:
    return os.urandom(size)


def stamped(body: bytes) -> bytes:
    return STAMP.pack(time.monotonic_ns()) + body[STAMP.size :]


def age_us(body: bytes) -> float:
    sent_ns: int = STAMP.unpack_from(body, 0)[0]
    return (time.monotonic_ns() - sent_ns) / 1e3


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))])


def median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field over the runs that succeeded, with min and max."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return {"error": runs[0].get("error", "no run") if runs else "no run"}
    merged: dict[str, Any] = {"runs": len(good)}
    for key, first in good[0].items():
        values = [run[key] for run in good if isinstance(run.get(key), int | float)]
        if (
            isinstance(first, int | float)
            and not isinstance(first, bool)
            and len(values) == len(good)
        ):
            merged[key] = statistics.median(values)
            merged[key + "_min"] = min(values)
            merged[key + "_max"] = max(values)
        else:
            merged[key] = first
    return merged


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout_s: float, alive: Any = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
            return True
        if alive is not None and not alive():
            return False
        time.sleep(0.1)
    return False


# -- CPU accounting -------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime jiffies) for every process visible in /proc."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def _our_jiffies() -> int:
    table = _process_table()
    ours = {os.getpid()}
    grew = True
    while grew:  # the descendants of this process, however deep
        found = {pid for pid, (parent, _) in table.items() if parent in ours} - ours
        grew = bool(found)
        ours |= found
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = int((children.ru_utime + children.ru_stime) * CLOCK_TICKS_PER_S)
    return sum(table[pid][1] for pid in ours if pid in table) + reaped


def _busy_jiffies() -> int:
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[0] + values[1] + values[2] + values[5] + values[6] + values[7]


@dataclass(frozen=True)
class CpuSnapshot:
    time_s: float
    busy_jiffies: int
    our_jiffies: int


def cpu_snapshot() -> CpuSnapshot:
    return CpuSnapshot(time.monotonic(), _busy_jiffies(), _our_jiffies())


def cpu_foreign_cores(start: CpuSnapshot, end: CpuSnapshot) -> float:
    """Cores' worth of CPU used between the snapshots by processes that are not ours."""
    elapsed_s = max(1e-6, end.time_s - start.time_s)
    busy = (end.busy_jiffies - start.busy_jiffies) / CLOCK_TICKS_PER_S / elapsed_s
    ours = (end.our_jiffies - start.our_jiffies) / CLOCK_TICKS_PER_S / elapsed_s
    return round(max(0.0, busy - ours), 2)
