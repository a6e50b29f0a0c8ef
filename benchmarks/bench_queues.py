"""Cost per queue: disk, descriptors, memory, creation and restart time with many queues.

Issue 18: 2,000 topics auto-created with one 100-byte message each took 13 GB of disk (every
consume-queue file fully allocated), 4,000 descriptors and 39 s to create. This creates `--topics`
topics (default 10,000) by auto-creation (a send to an unknown topic, as an application does),
each with one `--body-bytes` message: `--topics` consume queues with one entry each (a topic's
other queues get no file until written). A real name server and broker process run here, with
production segment sizes (1 GiB commit-log segments, 300,000-entry consume-queue files).

Figures, against the issue's targets:
- create: seconds for every send to be acknowledged (`--in-flight` sends at a time), and topics/s;
- disk: `du` of the store (allocated blocks), and of it without the commit log, whose segments
  are preallocated whole on purpose (a fixed 1 GiB whatever the queue count);
- descriptors (/proc/PID/fd), mappings (/proc/PID/maps) and RSS of the broker once flushed;
- restart: SIGTERM, then a new broker process on the same store, from spawn until its port
  accepts; and the same after a kill -9 (crash recovery).

Usage: python benchmarks/bench_queues.py [--topics 10000] [--in-flight 64] [--dir /tmp]
Everything created is removed at the end; every process started is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.servers import rss_bytes

from tidemq.client.message import Message, SendStatus
from tidemq.client.producer import Producer
from tidemq.store.queue_manifest import QUEUE_MANIFEST_NAME
from tidemq.testing import eventually
from tidemq.testing.processes import ServerProcess, process_cluster

TARGET_DISK_BYTES: Final = 200 * 1000 * 1000
TARGET_FDS: Final = 1000
TARGET_RESTART_S: Final = 2.0
# Production sizes, not the test ones process_cluster defaults to.
SETTINGS: Final = {
    "mappedFileSizeCommitLog": str(1 << 30),
    "mappedFileSizeConsumeQueue": str(300_000 * 20),
    "autoCreateTopicEnable": "true",
}
TOPIC_PREFIX: Final = "BenchQ"
# Most time for the broker's periodic flush to name every new queue in the queue manifest after
# the last send (the flush writes it once the queues are synced and their pages released).
FLUSHED_TIMEOUT_S: Final = 60.0


def du_bytes(path: Path, *, skip: str | None = None) -> int:
    """Allocated bytes under `path` (du: blocks, not sizes), files and directories."""
    total = 0
    for directory, dirs, files in os.walk(path):
        if skip is not None and skip in dirs:
            dirs.remove(skip)
        total += os.lstat(directory).st_blocks * 512
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def queues_named(store: Path) -> int:
    """The benchmark's queues the store's manifest names: all of them once a flush has run."""
    try:
        text = (store / "consumequeue" / QUEUE_MANIFEST_NAME).read_text()
    except FileNotFoundError:
        return 0
    return sum(line.startswith(TOPIC_PREFIX) for line in text.splitlines())


def process_figures(pid: int) -> dict[str, int]:
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "maps": len(Path(f"/proc/{pid}/maps").read_text().splitlines()),
        "rss": rss_bytes(pid).get("VmRSS", 0),
    }


async def create_topics(namesrv: str, topics: int, in_flight: int, body: bytes) -> float:
    """Send one message to each of `topics` new topics; seconds until all are acknowledged."""
    producer = Producer("bench_queues", namesrv, retry_times=2)
    await producer.start()
    try:
        names = iter(f"{TOPIC_PREFIX}{n:05d}" for n in range(topics))
        failed: list[str] = []

        async def worker() -> None:
            for topic in names:
                result = await producer.send(Message(topic, body))
                if result.status is not SendStatus.SEND_OK:
                    failed.append(topic)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
        if failed:
            raise RuntimeError(f"{len(failed)} sends not SEND_OK, e.g. {failed[0]}")
        return elapsed
    finally:
        await producer.shutdown()


async def timed_start(broker: ServerProcess) -> float:
    started = time.perf_counter()
    await broker.start()
    return time.perf_counter() - started


def mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def verdict(value: float, target: float, unit: str = "") -> str:
    return f"({'meets' if value <= target else 'MISSES'} target {target:g}{unit})"


async def run(root: Path, topics: int, in_flight: int, body_bytes: int) -> None:
    async with process_cluster(root, broker_settings=SETTINGS, log_level="WARNING") as cluster:
        broker = cluster.brokers[0]
        assert broker.store_dir is not None
        store = broker.store_dir
        base = process_figures(broker.pid)
        base_du = du_bytes(store)
        created_s = await create_topics(cluster.namesrv_addr, topics, in_flight, b"x" * body_bytes)
        await eventually(
            lambda: queues_named(store) >= topics, FLUSHED_TIMEOUT_S, what="a flush of every queue"
        )
        after = process_figures(broker.pid)
        disk = du_bytes(store)
        disk_no_log = du_bytes(store, skip="commitlog")
        queues = sum(1 for _ in (store / "consumequeue").glob("*/*"))
        await broker.stop()
        clean_s = await timed_start(broker)
        restarted = process_figures(broker.pid)
        broker.kill()
        crash_s = await timed_start(broker)

    print(f"{topics:,} topics auto-created, one {body_bytes}-byte message each: {queues:,} queues")
    print(f"create: {created_s:.1f} s ({topics / created_s:,.0f} topics/s, {in_flight} in flight)")
    print(
        f"disk (du): {mb(disk)} in all, {mb(disk_no_log)} without the commit log's preallocated "
        f"segment {verdict(disk_no_log / 1e6, TARGET_DISK_BYTES / 1e6, ' MB')}; "
        f"empty store {mb(base_du)}; {(disk_no_log) / max(queues, 1) / 1024:.1f} KiB per queue"
    )
    print(
        f"broker fds: {after['fds']} {verdict(after['fds'], TARGET_FDS)} (empty: {base['fds']}); "
        f"after restart {restarted['fds']}; mappings {after['maps']} (empty {base['maps']})"
    )
    print(
        f"broker RSS: {mb(after['rss'])} (empty {mb(base['rss'])}), after restart "
        f"{mb(restarted['rss'])}"
    )
    print(f"restart after SIGTERM: {clean_s:.2f} s {verdict(clean_s, TARGET_RESTART_S, ' s')}")
    print(f"restart after kill -9: {crash_s:.2f} s {verdict(crash_s, TARGET_RESTART_S, ' s')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temp store")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="bench-queues-", dir=args.dir))
    try:
        asyncio.run(run(root, args.topics, args.in_flight, args.body_bytes))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
