"""The commit log: every record of the broker, appended in order to mapped segments.

    commitlog/00000000000000000000
    +----------+----------+-----+----------+---------------------------+
    | record 0 | record 1 | ... | record k | blank marker | (unused)   |
    +----------+----------+-----+----------+---------------------------+
                                             remaining:i32 BLANK_MAGIC
    commitlog/<segment size as 20 digits>
    +----------+-----
    | record   | ...

Records are `protocol.record` bytes (remoting.md §5.1), and carry their own physical offset.
When a record plus the 8-byte marker does not fit in what is left of a segment, the marker is
written and the record goes to the start of the next segment, so a record never spans segments
and the marker is always there to say "continue in the next file".

What may stand at a position is decided once, by `unit_at`: a record (magic, CRC required, its
own physical offset, leaving room for the marker), a blank marker (its size is exactly the rest
of the segment), zeros (the end), or nothing valid (CorruptRecordError says why). `LogScanner`
walks the log from an offset with it and stops at the first thing that is neither a valid record
nor a valid blank marker: that offset is the log's end. Recovery, `verify` and `dump` all use
the scanner; a slave's append of its master's bytes (store/replica.py) uses `unit_at` on them.

Resident memory: each `flush` releases the flushed pages more than `resident_bytes` behind the
write position, and the pages readers faulted back in below that (mapped_file.py), so the
log's share of the broker's RSS is about `resident_bytes` plus what is not flushed yet plus what
readers touch between two flushes, whatever the backlog. The scanner releases each segment it
has walked through, so recovering or verifying a long log does not map all of it at once.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tidemq.errors import CorruptRecordError
from tidemq.protocol import record as rec
from tidemq.store.config import COMMIT_LOG_RESIDENT_BYTES_DEFAULT
from tidemq.store.mapped_file import MappedFile, MappedFileQueue

logger = logging.getLogger(__name__)


class CommitLog:
    def __init__(
        self,
        directory: Path,
        file_size: int,
        *,
        read_only: bool = False,
        resident_bytes: int = COMMIT_LOG_RESIDENT_BYTES_DEFAULT,
    ):
        """`resident_bytes`: the tail behind the write position kept mapped (StoreConfig)."""
        assert resident_bytes >= 0
        self.file_size = file_size
        self.resident_bytes = resident_bytes
        self.files = MappedFileQueue(directory, file_size, read_only=read_only)

    def load(self) -> None:
        self.files.load()

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    @property
    def flushed_offset(self) -> int:
        files = self.files.files
        flushed = files[0].start_offset if files else 0
        for mf in files:
            if mf.flushed == 0:
                break
            flushed = mf.start_offset + mf.flushed
            if mf.flushed < mf.size:
                break
        return flushed

    def segment_for(self, size: int) -> MappedFile:
        """The segment the next record of `size` bytes is written to: the last one, or a new one
        after a blank marker when the record does not fit what is left of it.

        The caller writes records at its `wrote` position while they leave BLANK_MARKER_SIZE
        bytes free, then lets the next call roll over.
        """
        assert size + rec.BLANK_MARKER_SIZE <= self.file_size
        mf = self.files.last_file()
        if mf is None:
            return self.files.create_file(0)
        if mf.remaining < size + rec.BLANK_MARKER_SIZE:
            if mf.remaining >= rec.BLANK_MARKER_SIZE:
                mf.append(rec.encode_blank_marker(mf.remaining))
            # The marker stands for the whole rest of the segment.
            mf.wrote = mf.size
            mf = self.files.create_file(mf.end_offset)
        return mf

    def _file_for(self, physical_offset: int) -> MappedFile | None:
        mf = self.files.find_file(physical_offset)
        if mf is None or physical_offset - mf.start_offset >= mf.wrote:
            return None
        return mf

    def read(self, physical_offset: int, size: int) -> bytes | None:
        """`size` bytes at `physical_offset`, or None if they are not (all) in one segment."""
        mf = self._file_for(physical_offset)
        if mf is None:
            return None
        pos = physical_offset - mf.start_offset
        if pos + size > mf.wrote:
            return None
        return mf.read(pos, size)

    def read_record(self, physical_offset: int, *, from_peer: bool = False) -> bytes | None:
        """The CRC-checked record at `physical_offset`; None if absent or not a valid record.

        No valid record where the store's own index or queue points is damage, logged as an
        error; at an offset a request named (`from_peer`: a message id, a send-back or
        END_TRANSACTION offset) it is the peer's mistake, and logging each at ERROR would let any
        client fill the log (found by tests/fuzz/test_network_fuzz.py).
        """
        mf = self._file_for(physical_offset)
        if mf is None:
            return None
        pos = physical_offset - mf.start_offset
        try:
            size = rec.check_record(mf.mm, pos)
        except CorruptRecordError as exc:
            level = logging.DEBUG if from_peer else logging.ERROR
            logger.log(level, "no valid record at physical offset %d: %s", physical_offset, exc)
            return None
        if pos + size > mf.wrote:
            return None
        return mf.read(pos, size)

    def read_raw(self, physical_offset: int, size_max: int) -> bytes:
        """Log bytes from `physical_offset` to the end of its segment's data, at most size_max."""
        mf = self._file_for(physical_offset)
        if mf is None:
            return b""
        pos = physical_offset - mf.start_offset
        return mf.read(pos, min(size_max, mf.wrote - pos))

    def flush(self) -> int:
        """Sync up to the current end, then release what is flushed and behind the resident
        tail (module docstring); returns the flushed physical offset."""
        self.files.flush()
        self.files.release(self.resident_bytes)
        return self.flushed_offset

    def truncate(self, offset: int) -> int:
        deleted = self.files.truncate(offset)
        last = self.files.last_file()
        if last is not None and last.end_offset <= offset:
            last.wrote = last.flushed = last.size
        return deleted

    def close(self) -> None:
        self.files.close()


class UnitKind(enum.Enum):
    RECORD = "record"
    BLANK = "blank"  # the segment's end marker: the rest of the segment belongs to it
    END = "end"  # zeros where a unit would start: nothing was written here
    PARTIAL = "partial"  # the buffer ends before the unit does (bytes still to come)


class Unit(NamedTuple):
    """What the log holds at one position (`unit_at`)."""

    kind: UnitKind
    # The log bytes the unit covers: a record's TOTALSIZE, a blank marker the rest of its
    # segment; 0 for END and PARTIAL.
    size: int
    message: rec.StoredMessage | None  # a RECORD's, decoded


def unit_at(buf: rec.Buffer, pos: int, offset: int, remaining: int) -> Unit:
    """The unit at `buf[pos]`, which holds the log byte at physical `offset`, `remaining` bytes
    before its segment ends. `buf` may end anywhere (PARTIAL: the rest is still to come); a
    mapped segment holds every unit whole.

    Raises:
        CorruptRecordError: nothing valid starts here: the segment ends without room for a
            marker, a marker's size is not the rest of the segment, a bad magic, a record
            that would not leave room for the marker, fails its CRC or claims another offset.
    """
    if remaining < rec.BLANK_MARKER_SIZE:
        raise CorruptRecordError("segment ends without a blank marker")
    if len(buf) - pos < rec.BLANK_MARKER_SIZE:
        return Unit(UnitKind.PARTIAL, 0, None)
    size, magic = rec.record_head_at(buf, pos)
    if magic == rec.BLANK_MAGIC and size == remaining:
        return Unit(UnitKind.BLANK, remaining, None)
    if size == 0 and magic == 0:
        return Unit(UnitKind.END, 0, None)
    if magic == rec.BLANK_MAGIC:
        raise CorruptRecordError(
            f"blank marker at offset {offset} says {size} bytes, the segment has {remaining} left"
        )
    if magic != rec.MAGIC_RECORD:
        raise CorruptRecordError(f"bad magic 0x{magic:08X} (size {size}) at offset {offset}")
    if not rec.RECORD_FIXED_SIZE <= size <= remaining - rec.BLANK_MARKER_SIZE:
        raise CorruptRecordError(
            f"record size {size} at offset {offset} does not fit its segment "
            f"({remaining} bytes left, {rec.BLANK_MARKER_SIZE} kept for the marker)"
        )
    if len(buf) - pos < size:
        return Unit(UnitKind.PARTIAL, 0, None)
    message = rec.decode_record(buf, pos, require_crc=True)
    if message.physical_offset != offset:
        raise CorruptRecordError(
            f"record at offset {offset} claims offset {message.physical_offset}"
        )
    return Unit(UnitKind.RECORD, size, message)


class LogScanner:
    """Iterates valid records from `start`; afterwards `end_offset` and `stop_reason` say where
    and why it stopped ("end" for a clean end: zeros after the last record or no more files)."""

    def __init__(self, log: CommitLog, start: int):
        self.log = log
        self.start = start
        self.end_offset = start
        self.stop_reason = "end"

    def records(self) -> Iterator[rec.StoredMessage]:
        files = [mf for mf in self.log.files.files if mf.end_offset > self.start]
        if not files:
            self.end_offset = max(self.start, self.log.files.max_offset)
            return
        offset = max(self.start, files[0].start_offset)
        for index, mf in enumerate(files):
            if not mf.start_offset <= offset < mf.end_offset:  # a mid-segment start is fine
                self._stop(offset, f"segment {mf.path.name} does not start at {offset}")
                return
            pos = offset - mf.start_offset
            if pos < mf.touched_from:
                mf.touched_from = pos
            while True:
                try:
                    unit = unit_at(mf.mm, pos, offset, mf.size - pos)
                except CorruptRecordError as exc:
                    self._stop(offset, str(exc))
                    return
                if unit.kind is UnitKind.BLANK:
                    if index + 1 == len(files):
                        # Log ends with a marker: the end is the marker (rewritten on append).
                        self._stop(offset, "end")
                        return
                    offset = mf.end_offset
                    mf.release(mf.size)  # walked through: unmap it before the next one
                    break
                if unit.message is None:  # END (a mapped segment holds every unit whole)
                    self._stop(offset, "end")
                    return
                yield unit.message
                pos += unit.size
                offset += unit.size
        self._stop(offset, "end")

    def _stop(self, offset: int, reason: str) -> None:
        self.end_offset = offset
        self.stop_reason = reason
