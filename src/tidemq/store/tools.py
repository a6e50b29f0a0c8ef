"""Read-only operator tools over a store directory: `verify` and `dump`.

Both map the files read-only and decode with `protocol.record`, the same code the store uses,
so what they report is what recovery would do. Neither writes or opens the store for writing,
nor takes its lock (store/lock.py): they can run next to a live broker, and say so
(`live_pid`), because they then see a moving tail and its `abort` marker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from tidemq.errors import CorruptRecordError
from tidemq.limits import CONSUME_QUEUE_ENTRY_SIZE
from tidemq.protocol import record as rec
from tidemq.store.checkpoint import Checkpoint, read_checkpoint
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.consume_queue import ConsumeQueue
from tidemq.store.lock import holder_pid
from tidemq.store.mapped_file import SEGMENT_NAME_DIGITS
from tidemq.store.queue_manifest import queue_dirs


@dataclass(slots=True)
class VerifyReport:
    segments: int = 0
    records: int = 0
    first_offset: int = 0
    end_offset: int = 0
    stop_reason: str = "end"
    # Non-zero bytes found after the end in the segment holding it (torn or corrupt data).
    trailing_garbage: bool = False
    later_segments: int = 0
    clean_stop: bool = True
    checkpoint: Checkpoint | None = None
    consume_queues: int = 0
    # The pid of a live broker holding the store's lock (0: pid not written yet), else None.
    live_pid: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _segment_size(directory: Path) -> int | None:
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        if len(path.name) == SEGMENT_NAME_DIGITS and path.name.isdigit():
            return path.stat().st_size
    return None


# verify's progress callback is called about once per this many bytes of commit log read.
PROGRESS_STEP: Final = 1 << 20


def verify(root_dir: Path, progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check every commit-log record's CRC and every consume-queue entry against the log.
    `progress` is given the bytes of commit log read since its last call (a CLI bar: reading
    a big store takes minutes)."""
    root = Path(root_dir)
    report = VerifyReport(clean_stop=not (root / "abort").exists(), live_pid=holder_pid(root))
    report.checkpoint = read_checkpoint(root / "checkpoint")
    size = _segment_size(root / "commitlog")
    if size is None:
        return report
    log = CommitLog(root / "commitlog", size, read_only=True)
    log.load()
    try:
        report.segments = len(log.files.files)
        report.first_offset = log.min_offset
        scanner = LogScanner(log, log.min_offset)
        report.records = _count_records(scanner, progress)
        report.end_offset = scanner.end_offset
        report.stop_reason = scanner.stop_reason
        holder = log.files.find_file(report.end_offset)
        if holder is not None:
            # Only what the filesystem may hold data in is read (MappedFile.nonzero_chunks).
            chunks = holder.nonzero_chunks(report.end_offset - holder.start_offset)
            report.trailing_garbage = next(chunks, None) is not None
            chunks.close()  # now, while the file is open (it resets the readahead mode)
        report.later_segments = sum(
            1 for mf in log.files.files if mf.start_offset > report.end_offset
        )
        if report.stop_reason != "end" or report.trailing_garbage:
            report.problems.append(
                f"commit log: valid records end at {report.end_offset} ({report.stop_reason})"
            )
        _verify_queues(root, log, report)
    finally:
        log.close()
    return report


def _count_records(scanner: LogScanner, progress: Callable[[int], None] | None) -> int:
    count = 0
    reported = scanner.start
    for message in scanner.records():
        count += 1
        if progress is not None and message.physical_offset - reported >= PROGRESS_STEP:
            progress(message.physical_offset - reported)
            reported = message.physical_offset
    if progress is not None and scanner.end_offset > reported:
        progress(scanner.end_offset - reported)
    return count


def _verify_queues(root: Path, log: CommitLog, report: VerifyReport) -> None:
    cq_root = root / "consumequeue"
    for topic, queue_id in queue_dirs(cq_root):
        entry_bytes = _segment_size(cq_root / topic / str(queue_id))
        if entry_bytes is None:
            continue
        cq = ConsumeQueue(
            cq_root, topic, queue_id, entry_bytes // CONSUME_QUEUE_ENTRY_SIZE, read_only=True
        )
        cq.load()
        report.consume_queues += 1
        try:
            _verify_queue(cq, log, report)
        finally:
            cq.close()


def _verify_queue(cq: ConsumeQueue, log: CommitLog, report: VerifyReport) -> None:
    name = f"{cq.topic}/{cq.queue_id}"
    for index, phys, size, _tags in cq.entries(cq.min_offset, cq.max_offset - cq.min_offset):
        if phys < log.min_offset:
            continue
        if phys + size > report.end_offset:
            report.problems.append(f"{name}@{index}: points past the log end ({phys})")
            continue
        data = log.read(phys, size)
        try:
            if data is None:
                raise CorruptRecordError("unreadable")
            message = rec.decode_record(data, require_crc=True)
        except CorruptRecordError as exc:
            report.problems.append(f"{name}@{index}: {exc}")
            continue
        if (message.topic, message.queue_id, message.queue_offset) != (
            cq.topic,
            cq.queue_id,
            index,
        ):
            report.problems.append(f"{name}@{index}: record at {phys} belongs elsewhere")


def dump(
    root_dir: Path,
    out: TextIO,
    *,
    start_offset: int | None = None,
    max_records: int | None = None,
    show_body: bool = False,
) -> int:
    """Write one line per commit-log record to `out`; returns how many were written."""
    root = Path(root_dir)
    size = _segment_size(root / "commitlog")
    if size is None:
        return 0
    log = CommitLog(root / "commitlog", size, read_only=True)
    log.load()
    written = 0
    try:
        scanner = LogScanner(log, log.min_offset if start_offset is None else start_offset)
        for m in scanner.records():
            if max_records is not None and written >= max_records:
                break
            props = " ".join(
                f"{k}={v}" for k, v in m.property_map().items() if k != rec.CRC_PROPERTY
            )
            line = (
                f"{m.physical_offset} size={m.total_size} topic={m.topic} queue={m.queue_id} "
                f"qoffset={m.queue_offset} sysflag={m.sys_flag} stored={m.store_timestamp} "
                f"born={m.born_host[0]}:{m.born_host[1]} body={len(m.body)}B {props}"
            )
            if show_body:
                line += f" data={m.body!r}"
            out.write(line + "\n")
            written += 1
        else:
            out.write(f"# end at {scanner.end_offset}: {scanner.stop_reason}\n")
    finally:
        log.close()
    return written
