"""Replication, the store's side: a master reads its commit-log bytes out, a slave appends them.

    master store                                            slave store
    read_replica(offset, size_max) ──▶ HA frames ──▶ append_replica(offset, data) -> consumed
      the bytes at `offset` up to the     [offset]     `offset` == the slave's max physical
      end of that segment's data          [size]       offset (an empty store: any segment
      (never across segments)             [bytes]      start, where its first segment is made)
                                  (protocol/ha.py, broker/ha/)

The slave's log becomes a byte-for-byte copy of the master's. It takes whole units only, judged
by the rules the log scanner applies at a restart (`commit_log.unit_at`), so whatever it wrote
is what its own recovery would keep:

    segment  | record | record | ... | record | marker  zeros ............... |
               '-- CRC required, claims its      '-- the marker's size is the rest of the
                   own offset, leaves 8 bytes        segment: the marker and the zeros after
                   for the marker                    it are one unit (at most the size of the
                                                     record that did not fit); the next unit
                                                     starts the next segment

    one call's data  | unit | unit | unit | part of a unit |  ──▶ returns the size of the 3
                                                                  units; the caller keeps the
                                                                  part and passes it again with
                                                                  the next frame's bytes after it
                     | unit | unit | bad unit | ...        |  ──▶ writes the 2 units, then
                                                                  raises ReplicaCorruptError

No unit is larger than a segment, so what a caller keeps stays below `commit_log_file_size`.

Per segment, the units `data` holds whole are written with one pwrite (the segment's page cache,
which its mapping shares: `MappedFile.append_written`, no page fault per page), then each
record is dispatched as recovery dispatches a scanned record (`Appender.dispatch_placed_run`:
the consume-queue entry at the queue offset the record carries, the index keys) and the dispatch
listeners get the events the master's put sent (pull-hold wake-ups). A unit that is not valid
stops the append after the valid units before it are written and dispatched.

Cost (benchmarks/bench_replica_append.py): a record is read by `rec.placed_record_at`, which
makes every check `decode_record(require_crc=True)` makes but decodes only what dispatch needs
(no message, no body copy); each queue's entries of a run go in one write, the run's index
entries with one index-header update.

After a kill -9 the log holds only whole CRC-valid units, so the normal recovery applies (a log
that ends with a marker ends at the marker: the master sends it again).

Slave-side state is the log itself: `max_physical_offset` is where the next frame must start,
whatever was raised, so the HA slave resumes from it after any error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from tidemq.errors import CorruptRecordError, ReplicaCorruptError, ReplicaOffsetError
from tidemq.protocol import record as rec
from tidemq.store.append import Appender, DispatchFailed, send_events
from tidemq.store.commit_log import CommitLog, UnitKind, unit_at
from tidemq.store.mapped_file import MappedFile
from tidemq.store.recovery import recover_check_outcome

__all__ = [
    "ReplicaCorruptError",
    "ReplicaOffsetError",
    "append_replica",
    "bytes_before",
    "read_replica",
]


@dataclass(slots=True)
class _Run:
    """The whole units of one segment found at the start of the data (`_scan_run`)."""

    end: int  # the position in the data after the last whole valid unit
    records: list[rec.PlacedRecord] = field(default_factory=list)
    segment_full: bool = False  # it ends with the segment's blank marker
    error: CorruptRecordError | None = None  # why the unit at `end` is not valid


def append_replica(
    log: CommitLog, appender: Appender, offset: int, data: bytes | memoryview
) -> int:
    """Append the whole units of `data`, the master's log bytes from `offset`, and dispatch
    their records; returns how many bytes that took (the rest is a unit still incomplete).

    Raises:
        ReplicaOffsetError: `offset` is not where this log continues.
        ReplicaCorruptError: a unit is not valid (those before it are written and dispatched).
        DispatchFailed: records were written but their entries not (`Appender.broken` says so).
        OSError: a segment could not be created (the units before it are written).
    """
    append_replica_check_offset(log, offset)
    consumed = 0
    with memoryview(data) as view:
        while consumed < len(view):
            at = offset + consumed
            run = _scan_run(view, consumed, at, log.file_size - at % log.file_size)
            if run.end > consumed:
                _segment_at(log, at).append_written(view[consumed : run.end])
                _dispatch_run(appender, run.records, offset + run.end)
                consumed = run.end
            if run.error is not None:
                raise ReplicaCorruptError(
                    f"master's bytes at commit-log offset {offset + consumed} are no valid "
                    f"record or blank marker ({run.error}); the {consumed} bytes before them "
                    "are appended"
                ) from run.error
            if not run.segment_full:
                break  # an incomplete unit, or the end of the data
    return consumed


def append_replica_check_offset(log: CommitLog, offset: int) -> None:
    """Raise ReplicaOffsetError unless the log continues at `offset`: its end, or for a log
    without segments a segment start (the master streams an empty slave from its first)."""
    if log.files.files:
        if offset != log.max_offset:
            raise ReplicaOffsetError(
                f"replica bytes at commit-log offset {offset}, but this log ends at "
                f"{log.max_offset}"
            )
    elif offset < 0 or offset % log.file_size:
        raise ReplicaOffsetError(
            f"an empty commit log starts at a segment start (a multiple of {log.file_size}), "
            f"not at {offset}"
        )


def _scan_run(view: memoryview, pos: int, offset: int, remaining: int) -> _Run:
    """The whole valid units from `view[pos]` (log `offset`, `remaining` bytes before its
    segment ends) to the first incomplete or invalid one or the segment's marker.

    A record `rec.placed_record_at` takes (whole, valid, at its offset, leaving room for the
    marker: what `unit_at` calls a RECORD) is read without decoding all of it; anything else,
    `unit_at` says what it is (a marker, the end of the data, or why it is no valid unit)."""
    run = _Run(pos)
    records = run.records
    placed_record_at = rec.placed_record_at
    marker_size = rec.BLANK_MARKER_SIZE
    while True:
        placed = placed_record_at(view, pos, offset, remaining - marker_size)
        if placed is not None:
            records.append(placed)
            size = placed.total_size
            pos += size
            offset += size
            remaining -= size
            run.end = pos
            continue
        try:
            unit = unit_at(view, pos, offset, remaining)
        except CorruptRecordError as exc:
            run.error = exc
            return run
        if unit.kind is UnitKind.END:
            run.error = CorruptRecordError(f"zeros at offset {offset}, where a unit should start")
            return run
        if unit.kind is UnitKind.PARTIAL or len(view) - pos < unit.size:
            return run  # a marker's zeros may be still to come too
        if unit.message is not None:  # not reached: placed_record_at took it
            records.append(_placed(unit.message))
        pos += unit.size
        offset += unit.size
        remaining -= unit.size
        run.end = pos
        if unit.kind is UnitKind.BLANK:
            run.segment_full = True
            return run


def _segment_at(log: CommitLog, offset: int) -> MappedFile:
    """The segment that writes continue in at `offset` (the log's end): the last one, or a new
    one when the last is full or there is none."""
    mf = log.files.last_file()
    if mf is None or mf.wrote == mf.size:
        return log.files.create_file(offset)
    assert mf.start_offset + mf.wrote == offset
    return mf


def _placed(message: rec.StoredMessage) -> rec.PlacedRecord:
    return rec.PlacedRecord(
        message.total_size,
        message.queue_id,
        message.queue_offset,
        message.physical_offset,
        message.sys_flag,
        message.store_timestamp,
        message.topic,
        message.properties,
    )


def _dispatch_run(appender: Appender, records: list[rec.PlacedRecord], end: int) -> None:
    """Dispatch the records of one written run (the log now ends at `end`), then send their
    events. Raises DispatchFailed when an entry could not be written: the store takes no
    writes until it re-dispatched them (FileMessageStore.retry_dispatch)."""
    try:
        dispatched = appender.dispatch_placed_run(records)
    except OSError as exc:
        appender.broken = (
            f"dispatch of replicated records failed after commit-log offset "
            f"{appender.dispatched} ({exc}); writes resume once they are re-dispatched"
        )
        raise DispatchFailed(appender.broken) from exc
    for record, outcome in dispatched.unusual:
        recover_check_outcome(record, outcome, full=True)
    appender.dispatched = end
    send_events(dispatched.events)


def read_replica(log: CommitLog, offset: int, size_max: int) -> bytes:
    """The log bytes from `offset` to the end of the written data of the segment holding it, at
    most `size_max`; b"" at the log's end. A full segment's bytes include its marker and the
    zeros after it; its end offset is the next segment's start.

    Raises:
        ReplicaOffsetError: `offset` is below the log's first segment (deleted by retention),
            beyond its end, or in no segment (a gap in the files).
    """
    assert size_max > 0
    if offset < log.min_offset:
        raise ReplicaOffsetError(
            f"commit-log offset {offset} is gone: the log starts at {log.min_offset}"
        )
    if offset > log.max_offset:
        raise ReplicaOffsetError(f"commit-log offset {offset} is beyond the end {log.max_offset}")
    if offset == log.max_offset:
        return b""
    data = log.read_raw(offset, size_max)
    if not data:
        raise ReplicaOffsetError(f"no commit-log segment holds offset {offset}")
    return data


def bytes_before(log: CommitLog, end: int, size_max: int) -> bytes:
    """Up to `size_max` log bytes ending at `end`, from the segment holding `end - 1` only (the
    tail a slave and its master compare); b"" when no segment holds it.

    At a segment's end the bytes end at its blank marker's end instead: what follows the marker
    is zeros in every log, so a tail of them would match any other layout of that segment (two
    logs that diverged before a rollover would compare equal). The marker's size field says
    where its segment's last record ended, so the tail up to it tells the layouts apart.

    Raises:
        ReplicaOffsetError: `end` is beyond the log's end.
    """
    if end > log.max_offset:
        raise ReplicaOffsetError(f"commit-log offset {end} is beyond the end {log.max_offset}")
    if end <= log.min_offset or size_max <= 0:
        return b""
    mf = log.files.find_file(end - 1)
    if mf is None:
        return b""
    stop = end - mf.start_offset
    if stop == mf.size:
        stop = _marker_end(mf)
    start = max(0, stop - size_max)
    return mf.read(start, stop - start)


_BLANK_MAGIC_BYTES: Final = rec.BLANK_MAGIC.to_bytes(4, "big")


def _marker_end(mf: MappedFile) -> int:
    """The position after the blank marker that ends the full segment `mf`; `mf.size` when no
    valid marker is found (the segment is compared as it is). The marker is the segment's last
    non-zero bytes, so its magic is the last occurrence of those bytes."""
    magic_at = mf.mm.rfind(_BLANK_MAGIC_BYTES)
    pos = magic_at - 4
    if magic_at < 0 or pos < 0:
        return mf.size
    mf.touched_from = min(mf.touched_from, pos)  # the search faulted pages in: release them
    size, magic = rec.record_head_at(mf.mm, pos)
    if magic != rec.BLANK_MAGIC or size != mf.size - pos:
        return mf.size
    return pos + rec.BLANK_MARKER_SIZE
