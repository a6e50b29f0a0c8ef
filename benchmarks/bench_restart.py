"""Broker restart time and resident memory after a restart, with 1 GiB commit-log segments.

Issue 11 item 4: a clean restart of a store holding 2 messages took 7.4 s and left ~1 GiB
resident, because start-up read the whole rest of the last segment. This measures, for a store
of 2 messages and for a store of `--store-gib` GiB (both stopped cleanly):

- restart: a real `tidemq broker` process on the store, from spawn until its port accepts,
  then its VmRSS / RssAnon / RssFile right away and once a flush pass has released pages;
- store start: `FileMessageStore.start()` alone, in this process (recovery without the
  interpreter start-up), and the resident bytes of its commit-log mappings afterwards.

References measured in the same run: the same broker process on an empty store (Python
start-up, imports and an empty recovery: the floor of any restart), and a raw open + mmap of
every segment of the store. Ratios are against them. The page cache is warm (the stores were
just written); dropping it would disturb the other users of this machine.

Usage: python benchmarks/bench_restart.py [--store-gib 10] [--segment-mib 1024]
           [--body-bytes 1024] [--repeat 3] [--dir /tmp] [--src DIR]

`--src` runs the broker processes from another source tree (e.g. an export of an older commit,
for a before/after pair). Everything created is removed at the end.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from sidebyside.common import free_port
from sidebyside.servers import rss_bytes

from tidemq.clock import SystemClock
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig
from tidemq.testing.resident import mapped_rss_by_file

TOPIC: Final = "BenchRestart"
QUEUES: Final = 8
BATCH: Final = 256  # messages per put_messages call while filling
FLUSH_EVERY_BYTES: Final = 256 * 1024 * 1024  # keep the dirty page cache bounded while filling
START_TIMEOUT_S: Final = 600.0  # a restart slower than this is a failure, not a figure
SETTLE_S: Final = 2.0  # a few flush passes (500 ms each): flushed pages are released by then
LOG_TAIL_CHARS: Final = 1_500  # of a failed broker's log in the error (the test shows 2,000)


def store_config(root: Path, segment_bytes: int) -> StoreConfig:
    return StoreConfig(root_dir=root, commit_log_file_size=segment_bytes)


def fill(
    root: Path, segment_bytes: int, total_bytes: int, body_bytes: int, count_max: int = 2**62
) -> tuple[int, float]:
    """Write messages until the log holds `total_bytes` (or `count_max` messages); stop
    cleanly. Returns (messages, MiB/s)."""
    store = FileMessageStore(store_config(root, segment_bytes), SystemClock())
    store.start()
    body = os.urandom(body_bytes)
    started = time.perf_counter()
    count = 0
    flushed = 0
    queue = 0
    while store.max_physical_offset < total_bytes and count < count_max:
        batch = [
            MessageToStore(
                topic=TOPIC,
                queue_id=queue,
                body=body,
                flag=0,
                properties=f"UNIQ_KEY\x01K{count + i:012d}\x02",
                sys_flag=0,
                born_timestamp=0,
                born_host=("127.0.0.1", 1),
                store_host=("127.0.0.1", 10911),
            )
            for i in range(min(BATCH, count_max - count))
        ]
        results = store.put_messages(batch)
        assert all(r.ok for r in results), results[0]
        count += len(batch)
        queue = (queue + 1) % QUEUES
        if store.max_physical_offset - flushed >= FLUSH_EVERY_BYTES:
            store.flush()
            flushed = store.max_physical_offset
    elapsed = time.perf_counter() - started
    size = store.max_physical_offset
    store.shutdown()
    return count, size / elapsed / 2**20 if elapsed else 0.0


def mapped_rss(prefix: str) -> int:
    """Resident bytes of this process's mappings of files under `prefix` (smaps)."""
    return sum(rss for path, rss in mapped_rss_by_file().items() if path.startswith(prefix))


def broker_restart(root: Path, segment_bytes: int, src: Path | None) -> dict[str, float]:
    """Spawn `tidemq broker` on `root`; seconds until its port accepts and its RSS then."""
    port = free_port()
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    args = [
        sys.executable,
        "-m",
        "tidemq.cli.main",
        "--log-level",
        "WARNING",
        "broker",
        "--data-dir",
        str(root),
        "--port",
        str(port),
        "--namesrv-addr",
        f"127.0.0.1:{free_port()}",  # nobody: registration retries in the background
        "--set",
        f"mappedFileSizeCommitLog={segment_bytes}",
        "--set",
        "brokerIP1=127.0.0.1",
    ]
    started = time.perf_counter()
    log_path = root.parent / f"{root.name}-broker.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"broker exited with {process.returncode}{_tail(log_path)}")
            if time.perf_counter() - started > START_TIMEOUT_S:
                raise RuntimeError("broker did not start in time")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                time.sleep(0.01)
        elapsed = time.perf_counter() - started
        at_start = rss_bytes(process.pid)
        time.sleep(SETTLE_S)
        settled = rss_bytes(process.pid)
        # A broker gone by now (an exited one's /proc status has no VmRSS) crashed after its
        # port accepted, or never bound it (another process took the port after free_port()
        # and answered): a failure to show, not a figure.
        if process.poll() is not None or not settled:
            raise RuntimeError(
                f"broker exited with {process.returncode} within {SETTLE_S:.0f} s of its port"
                f" accepting{_tail(log_path)}"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return {
        "seconds": elapsed,
        **{f"{k} at start": v for k, v in at_start.items()},
        **{f"{k} settled": v for k, v in settled.items()},
    }


def _tail(log_path: Path) -> str:
    """The end of a broker's log, for an error (the log goes when the run's files are removed)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return f"; its log ends:\n{text[-LOG_TAIL_CHARS:]}"


def store_start(root: Path, segment_bytes: int) -> dict[str, float]:
    """FileMessageStore.start() alone, in this process: seconds and commit-log RSS after."""
    store = FileMessageStore(store_config(root, segment_bytes), SystemClock())
    started = time.perf_counter()
    store.start()
    elapsed = time.perf_counter() - started
    rss = mapped_rss(str(root / "commitlog"))
    report = store.last_recovery
    store.shutdown()
    return {
        "seconds": elapsed,
        "commitlog RssFile": rss,
        "records scanned": report.records_scanned if report else -1,
    }


def raw_mmap(root: Path) -> dict[str, float]:
    """Open and mmap every commit-log segment, touch nothing: the cost of having the files."""
    started = time.perf_counter()
    for path in sorted((root / "commitlog").iterdir()):
        fd = os.open(path, os.O_RDWR)
        try:
            with mmap.mmap(fd, path.stat().st_size):
                pass
        finally:
            os.close(fd)
    return {"seconds": time.perf_counter() - started}


def median_of(runs: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    values = [run[key] for run in runs]
    return statistics.median(values), min(values), max(values)


def repeat(times: int, measure: Callable[[], dict[str, float]]) -> list[dict[str, float]]:
    return [measure() for _ in range(times)]


def mib(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def report_case(
    name: str, root: Path, segment_bytes: int, runs: int, src: Path | None, floor_s: float
) -> None:
    segments = len(list((root / "commitlog").iterdir())) if (root / "commitlog").is_dir() else 0
    raw = repeat(runs, lambda: raw_mmap(root)) if segments else [{"seconds": 0.0}]
    broker = repeat(runs, lambda: broker_restart(root, segment_bytes, src))
    # The in-process start runs this tree's store: meaningless next to another tree's brokers.
    inproc = repeat(runs if src is None else 0, lambda: store_start(root, segment_bytes))
    b_med, b_min, b_max = median_of(broker, "seconds")
    r_med = median_of(raw, "seconds")[0]
    print(f"\n## {name}: {segments} segment(s) of {segment_bytes // 2**20} MiB")
    print(
        f"broker restart (spawn -> port accepts): {b_med:.2f} s ({b_min:.2f}-{b_max:.2f}); "
        f"{b_med / floor_s:.2f}x the empty-store restart ({floor_s:.2f} s)"
    )
    print(
        "broker RSS MiB at start  VmRSS/RssAnon/RssFile: "
        + "/".join(
            mib(median_of(broker, f"{k} at start")[0]) for k in ("VmRSS", "RssAnon", "RssFile")
        )
    )
    print(
        f"broker RSS MiB {SETTLE_S:.0f} s later VmRSS/RssAnon/RssFile: "
        + "/".join(
            mib(median_of(broker, f"{k} settled")[0]) for k in ("VmRSS", "RssAnon", "RssFile")
        )
    )
    if not inproc:
        return
    s_med, s_min, s_max = median_of(inproc, "seconds")
    scanned = median_of(inproc, "records scanned")[0]
    print(
        f"store start in-process: {s_med * 1000:,.1f} ms ({s_min * 1000:,.1f}-"
        f"{s_max * 1000:,.1f}), {scanned:,.0f} records scanned; raw open+mmap of the segments "
        f"{r_med * 1000:,.2f} ms ({s_med / r_med if r_med else float('nan'):,.0f}x)"
    )
    print(
        "commit-log mappings resident after store start in-process: "
        f"{mib(median_of(inproc, 'commitlog RssFile')[0])} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store-gib", type=float, default=10.0, help="size of the large store")
    parser.add_argument("--segment-mib", type=int, default=1024, help="commit-log segment size")
    parser.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--src", type=Path, default=None, help="tidemq source for the brokers")
    args = parser.parse_args()
    segment_bytes = args.segment_mib * 2**20
    base = Path(tempfile.mkdtemp(prefix="bench-restart-", dir=args.dir))
    try:
        empty = base / "empty"
        floor = repeat(args.repeat, lambda: broker_restart(empty, segment_bytes, args.src))
        floor_s = median_of(floor, "seconds")[0]
        print(f"# restart with {args.segment_mib} MiB segments, {args.body_bytes} B bodies")
        print(f"empty store (reference): broker restart {floor_s:.2f} s")
        two = base / "two"
        fill(two, segment_bytes, segment_bytes, args.body_bytes, count_max=2)
        report_case("store of 2 messages", two, segment_bytes, args.repeat, args.src, floor_s)
        big = base / "big"
        count, rate = fill(big, segment_bytes, int(args.store_gib * 2**30), args.body_bytes)
        print(f"\nfilled {args.store_gib:g} GiB: {count:,} messages at {rate:,.0f} MiB/s")
        name = f"store of {args.store_gib:g} GiB"
        report_case(name, big, segment_bytes, args.repeat, args.src, floor_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
