"""Recovery: find the commit log's true end and make consume queues and index agree with it.

The commit log is the only source of truth; consume queues and the index are derived from it
and can always be rebuilt. At start:

1. Choose where to scan from. With a valid checkpoint and every consume queue still there:
   `logic_flushed` itself (everything before it is known dispatched and flushed), so a
   restart costs the records after the checkpoint (`scan_start`). With a queue missing: the
   start of the segment holding `logic_flushed`.
   Otherwise (no/damaged checkpoint, lost consume queues, damaged index): the first segment,
   and the index is rebuilt from nothing.
2. Scan forward (`LogScanner`), checking every record's whole-record CRC, and stop at the
   first bad or missing one. That offset is the end of the log. It is the same code after a
   clean stop and a crash, so the tail is validated either way. The zeros after the end are
   not read: the filesystem says where data may lie (mapped_file.py, "Past the end"), so a
   restart costs the records it scans, not the segment size.
3. Re-dispatch each scanned record. Consume-queue entries are written at the record's own queue
   offset, so records already dispatched are left as they are. A record whose queue offset lies
   past the end of its consume queue means entries before the checkpoint were lost: the
   recovery restarts as a full rebuild.
4. Decide whether the end is a torn tail. Only a torn tail may be cut: the stop lies in the
   last segment, no valid record follows it there, and (when it is a bad record rather than
   zeros) it lies at or beyond the checkpoint's flushed offset, i.e. in bytes that were never
   promised durable. Anything else is corruption of data that was durable or that valid data
   follows: cutting it would silently delete acknowledged messages. Then `corrupt_policy`
   decides: REFUSE (the default) raises StoreError naming the segment and offset and pointing
   to `tidemq store verify`; QUARANTINE copies the damaged segment and moves every later one
   into `<root>/quarantine/` (never unlinking a byte) and goes on as for a torn tail.
5. Truncate: zero the rest of the segment holding the end, delete later segments, drop consume
   queue entries pointing at or past the end, and move each queue's minimum to the log's first
   record. Stale index entries need no cleaning: lookups check the record they point at.

A record that fails its CRC is never dispatched, so it can never be served.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemq.errors import CorruptRecordError, StoreError
from tidemq.protocol import record as rec
from tidemq.protocol.record import StoredMessage
from tidemq.store.checkpoint import Checkpoint
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.config import CorruptPolicy
from tidemq.store.consume_queue import ConsumeQueue, PutAt
from tidemq.store.mapped_file import MappedFile

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    clean_stop: bool
    full_rebuild: bool
    scan_start_offset: int
    log_end_offset: int
    stop_reason: str
    records_scanned: int
    segments_deleted: int
    consume_queue_entries_dropped: int


class NeedFullRebuild(Exception):
    """Raised during a partial recovery that found consume-queue entries missing.

    `started_queue` names a queue this attempt began from empty, to be discarded before the
    rebuild (it must start again from the first record the log holds for it).
    """

    def __init__(self, reason: str, started_queue: tuple[str, int] | None = None):
        super().__init__(reason)
        self.started_queue = started_queue


def scan_start(log: CommitLog, checkpoint: Checkpoint | None, full: bool, exact: bool) -> int:
    """Where the scan begins.

    `exact` (every consume queue the store had is still there, queue_manifest.py): the
    checkpoint's `logic_flushed` itself, a record boundary (the end of a written run) below
    which every record is durable (synced before the checkpoint was written) and dispatched,
    so a restart costs the records written after the checkpoint (none after a clean stop), not
    the records of the segment holding it. A crash or a power loss cannot have touched them.

    Otherwise the start of the segment holding `logic_flushed` (or the first segment):
    re-dispatching the whole segment is what notices a lost queue (its records come back as
    STARTED). Records below the scan are CRC-checked when read, and by `tidemq store verify`.
    """
    files = log.files.files
    if full or checkpoint is None or not files:
        return log.min_offset
    logic = checkpoint.logic_flushed_offset
    if exact and logic == files[-1].end_offset:
        return logic
    start = files[0].start_offset
    for mf in files:
        if exact and mf.start_offset <= logic < mf.end_offset:
            return logic
        if mf.start_offset <= logic:
            start = mf.start_offset
    return start


def recover_find_valid_record(mf: MappedFile, pos_from: int) -> int | None:
    """Position of the first valid record (magic, CRC, own offset) at or after `pos_from`.

    Searches for the magic with mmap.find, and only in the ranges the filesystem may hold data
    in (`MappedFile.written_ranges`: holes read as zeros and hold no record), so the cost is
    what was written past `pos_from`, not the rest of a 1 GiB segment.
    """
    for start, end in mf.written_ranges(pos_from):
        magic_at = mf.mm.find(rec.MAGIC_RECORD_BYTES, start + 4, end)
        while magic_at >= 0:
            pos = magic_at - 4
            try:
                message = rec.decode_record(mf.mm, pos, require_crc=True)
            except CorruptRecordError:
                pass
            else:
                if message.physical_offset == mf.start_offset + pos:
                    return pos
            magic_at = mf.mm.find(rec.MAGIC_RECORD_BYTES, magic_at + 1, end)
    return None


def recover_damage(
    log: CommitLog, end: int, stop_reason: str, checkpoint: Checkpoint | None, clean_stop: bool
) -> str | None:
    """Why the scan's stop at `end` is not a torn tail, or None when it is one."""
    later = [mf for mf in log.files.files if mf.start_offset > end]
    if later:
        return f"{len(later)} later segment(s) follow it, starting with {later[0].path.name}"
    mf = log.files.find_file(end)
    if mf is None:
        return None  # at the very end of the last segment: nothing to cut
    if stop_reason != "end":
        if checkpoint is not None:
            flushed = checkpoint.log_flushed_offset
        else:
            # Without a checkpoint a clean stop still means everything was flushed.
            flushed = mf.end_offset if clean_stop else 0
        if end < flushed:
            return f"it lies below the flushed offset {flushed}"
    found = recover_find_valid_record(mf, end - mf.start_offset + 1)
    if found is not None:
        return f"a valid record follows it at offset {mf.start_offset + found}"
    return None


def recover_quarantine(log: CommitLog, end: int) -> list[Path]:
    """Copy the segment holding `end` and move every later one into <root>/quarantine/."""
    directory = log.files.directory.parent / "quarantine"
    directory.mkdir(parents=True, exist_ok=True)
    moved: list[Path] = []
    for mf in list(log.files.files):
        if mf.end_offset <= end:
            continue
        target = directory / mf.path.name
        n = 1
        while target.exists():
            target = directory / f"{mf.path.name}.{n}"
            n += 1
        if mf.start_offset <= end:
            mf.mm.flush()
            shutil.copy2(mf.path, target)  # the live copy keeps its valid prefix
        else:
            mf.close()
            mf.path.rename(target)
            log.files.files.remove(mf)
        moved.append(target)
    return moved


def recover(
    *,
    log: CommitLog,
    checkpoint: Checkpoint | None,
    clean_stop: bool,
    full: bool,
    dispatch: Callable[[StoredMessage, bool], PutAt | None],
    queues: Callable[[], list[ConsumeQueue]],
    corrupt_policy: CorruptPolicy = CorruptPolicy.REFUSE,
    exact_start: bool = False,
) -> RecoveryReport:
    """Run steps 1-5 above. `dispatch(message, index_it)` re-dispatches one record;
    `exact_start`: scan from the checkpoint itself (`scan_start`).

    Raises:
        StoreError: the log is corrupt other than at a torn tail and the policy is REFUSE.
    """
    start = scan_start(log, checkpoint, full, exact_start)
    index_from = 0 if full or checkpoint is None else checkpoint.logic_flushed_offset
    scanner = LogScanner(log, start)
    scanned = _redispatch(scanner, dispatch, index_from, full)
    end = scanner.end_offset
    _refuse_or_quarantine(log, scanner, checkpoint, clean_stop, corrupt_policy)
    if scanner.stop_reason != "end":
        logger.warning(
            "commit log truncated at offset %d: %s (scanned %d records from %d)",
            end,
            scanner.stop_reason,
            scanned,
            start,
        )
    deleted, dropped = _truncate(log, end, queues())
    logger.info(
        "recovered commit log: %s stop, %s, scanned %d records from %d, end %d",
        "clean" if clean_stop else "unclean",
        "full rebuild" if full else "from checkpoint",
        scanned,
        start,
        end,
    )
    return RecoveryReport(
        clean_stop=clean_stop,
        full_rebuild=full,
        scan_start_offset=start,
        log_end_offset=end,
        stop_reason=scanner.stop_reason,
        records_scanned=scanned,
        segments_deleted=deleted,
        consume_queue_entries_dropped=dropped,
    )


def _redispatch(
    scanner: LogScanner,
    dispatch: Callable[[StoredMessage, bool], PutAt | None],
    index_from: int,
    full: bool,
) -> int:
    """Step 3: re-dispatch every record the scan finds (indexing those at or after
    `index_from`); returns how many. Raises NeedFullRebuild as `recover_check_outcome`."""
    scanned = 0
    for message in scanner.records():
        outcome = dispatch(message, message.physical_offset >= index_from)
        scanned += 1
        recover_check_outcome(message, outcome, full)
    return scanned


def recover_check_outcome(
    message: StoredMessage | rec.PlacedRecord, outcome: PutAt | None, full: bool
) -> None:
    """Log what re-dispatching `message` found; a partial recovery that finds a queue's earlier
    entries missing raises NeedFullRebuild. With `full` it only logs (also a slave's append of
    its master's records, store/replica.py)."""
    if outcome is PutAt.STARTED and not full:
        # Earlier entries of this queue are gone; only a scan from the first segment
        # knows whether retention removed them or they were lost.
        raise NeedFullRebuild(
            f"{message.topic}/{message.queue_id} starts at queue offset {message.queue_offset}",
            (message.topic, message.queue_id),
        )
    if outcome is PutAt.GAP:
        if not full:
            raise NeedFullRebuild(
                f"{message.topic}/{message.queue_id} lacks entries before queue offset "
                f"{message.queue_offset}"
            )
        logger.error(
            "consume queue %s/%d has a hole before offset %d (records lost from the log)",
            message.topic,
            message.queue_id,
            message.queue_offset,
        )
    elif outcome is PutAt.REPLACED:
        logger.warning(
            "consume queue %s/%d entry %d rewritten from the log",
            message.topic,
            message.queue_id,
            message.queue_offset,
        )


def _refuse_or_quarantine(
    log: CommitLog,
    scanner: LogScanner,
    checkpoint: Checkpoint | None,
    clean_stop: bool,
    corrupt_policy: CorruptPolicy,
) -> None:
    """Step 4: nothing when the scan stopped at the end or a torn tail; else raise StoreError
    (REFUSE) or move the damaged segments aside (QUARANTINE)."""
    end = scanner.end_offset
    damage = recover_damage(log, end, scanner.stop_reason, checkpoint, clean_stop)
    if damage is None:
        return
    mf = log.files.find_file(end)
    where = f"segment {mf.path} " if mf is not None else ""
    what = f"commit log {where}is corrupt at offset {end} ({scanner.stop_reason}) and {damage}"
    if corrupt_policy is CorruptPolicy.REFUSE:
        raise StoreError(
            f"{what}; not truncating. Run `tidemq store verify {log.files.directory.parent}`"
            " to see the damage, then restore the segment or start with corrupt_policy="
            "quarantine (broker.conf corruptPolicy=quarantine) to move it aside"
        )
    moved = recover_quarantine(log, end)
    logger.error("%s; quarantined %s", what, ", ".join(str(p) for p in moved))


def _truncate(log: CommitLog, end: int, queues: list[ConsumeQueue]) -> tuple[int, int]:
    """Step 5: cut the log and the consume queues at `end`; returns (segments deleted,
    consume-queue entries dropped)."""
    deleted = log.truncate(end)
    if deleted:
        logger.warning("deleted %d commit-log segments after offset %d", deleted, end)
    dropped = 0
    for cq in queues:
        n = cq.truncate_physical(end)
        if n:
            logger.warning(
                "dropped %d consume-queue entries of %s/%d beyond the log end",
                n,
                cq.topic,
                cq.queue_id,
            )
        dropped += n
        cq.correct_min(log.min_offset)
    return deleted, dropped
