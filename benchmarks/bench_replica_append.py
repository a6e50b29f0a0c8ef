"""A slave store's append of its master's log bytes (FileMessageStore.append_replica), against
the master's own put of the same records and a raw copy + CRC pass over the same bytes.

    master   put_messages of N records (batches of --batch, the queues in turn) into an empty
             store: encode, two CRCs, one copy per segment run, consume-queue and index entries
    frames   the master's log read back with read_replica in --frame-kib frames (not timed),
             as the HA master sends them (a frame never crosses a segment)
    slave    an empty store fed the frames the way the HA slave feeds them: the bytes a call
             left (an incomplete record) before the next frame's; every record CRC-checked, its
             offset verified, then its consume-queue entry, index keys and listeners' events
    copy     the reference, measured in the same run: each frame copied into a mapping of the
             log's size and crc32'd whole (`copy+crc`), and the same with one crc32 per record
             found by walking the TOTALSIZE fields (`copy+crc/record`: the floor of a Python
             loop that checks each record)

The stores carry the broker's three dispatch listeners with their topic filters (pull holds:
no pull is held; schedule; timer), so no record of the benchmark topic gets an event; with
--wanted a listener wants the topic and every record gets one. Record properties as a client
sends them: UNIQ_KEY, TAGS, KEYS (one key), WAIT dropped, CLUSTER added by the broker.

Each pass is timed after the same warm-up (the master's first batch of each queue; the frames
holding those bytes): creating the segment, each consume queue's and the index's first file
fsyncs a directory, tens of ms that a 64 MiB pass would count and a 1 GiB catch-up spreads thin.

Prints MiB/s of log bytes (wall) and records/s per pass, the best and median of --runs, and MiB
per CPU-second of this process (less moved by other processes), for 1 KiB and 16 KiB bodies.
Judge a change by A/B runs back to back (PYTHONPATH=<other tree>/src): the machine is shared.

Usage: python benchmarks/bench_replica_append.py [--mib 64] [--runs 3] [--bodies 1024,16384]
           [--frame-kib 32] [--batch 32] [--queues 8] [--wanted] [--profile OUT.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import mmap
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemq.clock import SystemClock
from tidemq.protocol import record as rec
from tidemq.protocol.message import encode_properties
from tidemq.store import DispatchEvent, FileMessageStore, MessageToStore, StoreConfig

TOPIC = "BenchReplicaTopic"
MIB = 1024 * 1024


def make_messages(count: int, body_size: int, queues: int) -> list[list[MessageToStore]]:
    """`count` messages, grouped per queue (queue i gets every queues-th message)."""
    body = os.urandom(body_size)
    per_queue: list[list[MessageToStore]] = [[] for _ in range(queues)]
    for i in range(count):
        properties = encode_properties(
            {
                "UNIQ_KEY": f"7F0000010001{i:020X}",
                "TAGS": f"tag{i % 4}",
                "KEYS": f"order-{i}",
                "CLUSTER": "DefaultCluster",
            }
        )
        per_queue[i % queues].append(
            MessageToStore(
                topic=TOPIC,
                queue_id=i % queues,
                body=body,
                flag=0,
                properties=properties,
                sys_flag=0,
                born_timestamp=1_700_000_000_000 + i,
                born_host=("127.0.0.1", 40000),
                store_host=("127.0.0.1", 10911),
            )
        )
    return per_queue


def open_store(root: Path, wanted: bool) -> FileMessageStore:
    store = FileMessageStore(StoreConfig(root_dir=root), SystemClock())
    store.start()
    events: list[DispatchEvent] = []
    held: set[str] = {TOPIC} if wanted else set()
    store.add_dispatch_listener(events.append, held.__contains__)  # pull holds
    store.add_dispatch_listener(events.append, "SCHEDULE_TOPIC_XXXX".__eq__)  # schedule
    store.add_dispatch_listener(events.append, lambda t: t.startswith("rmq_sys_wheel_timer"))
    return store


def timed(fn: Callable[[], None], profiler: cProfile.Profile | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of `fn()`."""
    if profiler is not None:
        profiler.enable()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if profiler is not None:
        profiler.disable()
    return elapsed, cpu


def put_master(
    store: FileMessageStore, per_queue: list[list[MessageToStore]], batch: int, first: int
) -> None:
    """put_messages of each queue's messages from index `first` on, `batch` at a time, the
    queues in turn."""
    longest = max(len(q) for q in per_queue)
    for at in range(first, longest, batch):
        for msgs in per_queue:
            if at < len(msgs):
                store.put_messages(msgs[at : at + batch])


def read_frames(store: FileMessageStore, frame_bytes: int) -> tuple[int, list[bytes]]:
    """The master's log as the HA master sends it: (first offset, frames)."""
    start = offset = store.min_physical_offset
    frames: list[bytes] = []
    while data := store.read_replica(offset, frame_bytes):
        frames.append(data)
        offset += len(data)
    return start, frames


class SlaveFeed:
    """The HA slave's loop: the held bytes, then the frame; keep what was not consumed."""

    def __init__(self, store: FileMessageStore, start: int) -> None:
        self.store = store
        self.offset = start
        self.held = b""

    def append(self, frames: list[bytes]) -> None:
        held, offset, append_replica = self.held, self.offset, self.store.append_replica
        for frame in frames:
            data = held + frame if held else frame
            consumed = append_replica(offset, data)
            offset += consumed
            held = data[consumed:]
        self.held, self.offset = held, offset


def copy_crc(frames: list[bytes], total: int, per_record: bool) -> None:
    """The reference: each frame copied into a mapping, then crc32 whole or per record."""
    mm = mmap.mmap(-1, total)
    pos = 0
    crc32 = zlib.crc32
    head = rec.RECORD_HEAD.unpack_from
    try:
        for frame in frames:
            end = pos + len(frame)
            mm[pos:end] = frame
            if not per_record:
                crc32(frame)
            else:
                with memoryview(frame) as view:
                    at = 0
                    while at + 8 <= len(frame):
                        size, magic = head(frame, at)
                        if magic != rec.MAGIC_RECORD or at + size > len(frame):
                            break  # a blank marker, or a record split across frames
                        crc32(view[at : at + size - 10])
                        at += size
            pos = end
    finally:
        mm.close()


def one_run(
    args: argparse.Namespace, body: int, profiler: cProfile.Profile | None
) -> dict[str, Any]:
    """Each pass's (log bytes timed, wall seconds, CPU seconds). Every pass starts after a
    warm-up that is not timed: the master's first batch of each queue, and the frames holding
    those bytes, so the segment, every consume queue's and the index's first file exist (each
    creation fsyncs a directory: tens of ms here, which a 1 GiB catch-up spreads thin)."""
    count = args.mib * MIB // (body + 150)
    per_queue = make_messages(count, body, args.queues)
    passes: dict[str, tuple[int, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-replica-bench-") as tmp:
        master = open_store(Path(tmp) / "master", args.wanted)
        put_master(master, [q[: args.batch] for q in per_queue], args.batch, 0)
        warm_end = master.max_physical_offset
        wall, cpu = timed(lambda: put_master(master, per_queue, args.batch, args.batch), None)
        passes["master put_messages"] = (master.max_physical_offset - warm_end, wall, cpu)
        start, frames = read_frames(master, args.frame_kib * 1024)
        total = sum(len(f) for f in frames)
        master.shutdown()
        warm_frames, sent = 0, start
        while sent < warm_end:
            sent += len(frames[warm_frames])
            warm_frames += 1
        slave = open_store(Path(tmp) / "slave", args.wanted)
        slave.set_replica_mode(True)
        feed = SlaveFeed(slave, start)
        feed.append(frames[:warm_frames])
        timed_frames = frames[warm_frames:]
        wall, cpu = timed(lambda: feed.append(timed_frames), profiler)
        passes["slave append_replica"] = (start + total - sent, wall, cpu)
        assert slave.max_physical_offset == start + total
        assert not feed.held
        slave.shutdown()
    for name, per_record in (("copy+crc", False), ("copy+crc/record", True)):
        wall, cpu = timed(functools.partial(copy_crc, timed_frames, total, per_record), None)
        passes[name] = (start + total - sent, wall, cpu)
    return {"count": count, "bytes": total, "passes": passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="log bytes per pass, about")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bodies", default="1024,16384")
    parser.add_argument("--frame-kib", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--wanted", action="store_true", help="a listener wants the topic")
    parser.add_argument("--profile", help="cProfile the slave passes into this file")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    for body in (int(b) for b in args.bodies.split(",")):
        runs = [one_run(args, body, profiler) for _ in range(args.runs)]
        count, total = runs[0]["count"], runs[0]["bytes"]
        print(f"\nbody {body} B: {count} records, {total / MIB:.1f} MiB of log, {args.runs} runs")
        print(
            f"  {'pass':<22} {'MiB/s best':>11} {'median':>8} {'records/s best':>15}"
            f" {'MiB/CPU-s best':>15} {'median':>8}"
        )
        for name in runs[0]["passes"]:
            size = runs[0]["passes"][name][0]
            mib, records = size / MIB, count * size / total
            wall = sorted(r["passes"][name][1] for r in runs)
            cpu = sorted(r["passes"][name][2] for r in runs)
            print(
                f"  {name:<22} {mib / wall[0]:>11.1f} {mib / statistics.median(wall):>8.1f}"
                f" {records / wall[0]:>15,.0f}"
                f" {mib / cpu[0]:>15.1f} {mib / statistics.median(cpu):>8.1f}"
            )
    if profiler is not None:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
