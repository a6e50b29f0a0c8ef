"""Recovery: find the commit log's true end and make consume queues and index agree with it.

The commit log is the only source of truth; consume queues and the index are derived from it
and can always be rebuilt. At start:

1. Choose where to scan from. With a valid checkpoint and consume-queue directory: the start of
   the segment holding `logic_flushed` (everything before it is known dispatched and flushed).
   Otherwise (no/damaged checkpoint, lost consume queues, damaged index): the first segment,
   and the index is rebuilt from nothing.
2. Scan forward (`LogScanner`), checking every record's whole-record CRC, and stop at the
   first bad or missing one. That offset is the end of the log. After a clean stop the scan
   covers only the last segment; it is the same code, so the tail is validated either way.
3. Re-dispatch each scanned record. Consume-queue entries are written at the record's own queue
   offset, so records already dispatched are left as they are. A record whose queue offset lies
   past the end of its consume queue means entries before the checkpoint were lost: the
   recovery restarts as a full rebuild.
4. Truncate: zero the rest of the segment holding the end, delete later segments, drop consume
   queue entries pointing at or past the end, and move each queue's minimum to the log's first
   record. Stale index entries need no cleaning: lookups check the record they point at.

A record that fails its CRC is never dispatched, so it can never be served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.protocol.record import StoredMessage
from tidemq.store.checkpoint import Checkpoint
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.consume_queue import ConsumeQueue, PutAt

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


def scan_start(log: CommitLog, checkpoint: Checkpoint | None, full: bool) -> int:
    files = log.files.files
    if full or checkpoint is None or not files:
        return log.min_offset
    start = files[0].start_offset
    for mf in files:
        if mf.start_offset <= checkpoint.logic_flushed_offset:
            start = mf.start_offset
    return start


def recover(
    *,
    log: CommitLog,
    checkpoint: Checkpoint | None,
    clean_stop: bool,
    full: bool,
    dispatch: Callable[[StoredMessage, bool], PutAt | None],
    queues: Callable[[], list[ConsumeQueue]],
) -> RecoveryReport:
    """Run steps 2-4 above. `dispatch(message, index_it)` re-dispatches one record."""
    start = scan_start(log, checkpoint, full)
    index_from = 0 if full or checkpoint is None else checkpoint.logic_flushed_offset
    scanner = LogScanner(log, start)
    scanned = 0
    for message in scanner.records():
        outcome = dispatch(message, message.physical_offset >= index_from)
        scanned += 1
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
    end = scanner.end_offset
    if scanner.stop_reason != "end":
        logger.warning(
            "commit log truncated at offset %d: %s (scanned %d records from %d)",
            end,
            scanner.stop_reason,
            scanned,
            start,
        )
    deleted = log.truncate(end)
    if deleted:
        logger.warning("deleted %d commit-log segments after offset %d", deleted, end)
    dropped = 0
    for cq in queues():
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
