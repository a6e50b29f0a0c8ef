"""Consume queues: per (topic, queue id), the index from queue offset to commit-log record.

    consumequeue/<topic>/<queueId>/<20-digit start byte offset>   (entries_per_file * 20 bytes)

    entry n (at byte 20 * n):
    +---------------------------+--------------+---------------------------+
    | physical offset: int64    | size: int32  | tags code: int64          |
    +---------------------------+--------------+---------------------------+

The queue offset is the entry index; `max_offset` is the entry count (the next offset to write).
A zero entry (size 0) is unused: files start as holes, which read as zeros, so on load the end
is the first zero entry after the first used one. `min_offset` is the first entry whose record
is still in the commit log; it moves up when old segments are deleted.

Entries are written at the index the record itself names (its QUEUEOFFSET), which makes
re-dispatching a record during recovery idempotent.

Cost per queue: the files are sparse, reserved on disk as they fill, hold no descriptor and are
mapped only while among the store's most recently used (lazy_file.py), so an idle queue costs
one block and no descriptor or mapping.

Resident memory: `flush` releases flushed pages more than CONSUME_QUEUE_RESIDENT_BYTES behind
the queue's end, and those readers touched below it (mapped_file.py), so a queue's share of
the broker's RSS does not grow with its backlog.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import logging
import shutil
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from tidemq.limits import CONSUME_QUEUE_ENTRY_SIZE
from tidemq.store.lazy_file import LazyFileQueue, LazyMappedFile, MappingCache, sync_files
from tidemq.store.mapped_file import MappedFile

logger = logging.getLogger(__name__)

CONSUME_QUEUE_ENTRY: Final = struct.Struct(">qiq")  # physical offset, size, tags code
assert CONSUME_QUEUE_ENTRY.size == CONSUME_QUEUE_ENTRY_SIZE == 20
_ENTRY = CONSUME_QUEUE_ENTRY_SIZE


@functools.lru_cache(maxsize=256)
def _entries_struct(count: int) -> struct.Struct:
    """`count` consecutive entries, packed by one call (a batch's entries are written at once)."""
    return struct.Struct(">" + "qiq" * count)


# entries() reads the mapping this many bytes (128 entries) at a time.
ENTRIES_READ_CHUNK_BYTES: Final = 128 * _ENTRY
# Entries `max_offset_within` reads back from a queue's end before it binary-searches: the
# records a controller-mode master has not confirmed yet are normally the last few.
WITHIN_TAIL_SCAN_ENTRIES: Final = 32
# Bytes behind a queue's end kept mapped (about 800 entries): consumers near the tail read them
# without a page fault. Per queue, so small; refaulting a page of 204 entries costs ~0.2 us.
CONSUME_QUEUE_RESIDENT_BYTES: Final = 16 * 1024
# A start reads a queue's file this many bytes (a whole number of entries) at a time.
_SCAN_CHUNK_BYTES: Final = 3276 * _ENTRY
# A binary search's probe (correct_min) reads this many bytes: the entries of about one page.
_PROBE_BYTES: Final = 204 * _ENTRY


class PutAt(enum.Enum):
    APPENDED = "appended"  # new entry at the end
    PRESENT = "present"  # the same entry was already there
    REPLACED = "replaced"  # a different entry was overwritten
    GAP = "gap"  # written past the end, leaving unused entries before it
    BELOW = "below"  # before the first file: not written
    STARTED = "started"  # first entry of an empty queue, at an offset above 0


class ConsumeQueue:
    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        entries_per_file: int,
        *,
        read_only: bool = False,
        mappings: MappingCache | None = None,
    ):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = root / topic / str(queue_id)
        self.files = LazyFileQueue(
            self.directory,
            entries_per_file * _ENTRY,
            mappings if mappings is not None else MappingCache(),
            read_only=read_only,
        )
        self._min_index = 0
        self._max_index = 0

    # --- load -------------------------------------------------------------------------------

    def load(self) -> None:
        self.files.load()
        files = self.files.files
        if not files:
            return
        with files[0].held_open(), files[-1].held_open():
            self._find_ends(files)

    def _find_ends(self, files: list[MappedFile]) -> None:
        if len(files) == 1:  # most queues: one read of what may hold data finds both ends
            self._find_ends_in_one(files[0])
            return
        first_used = self._first_used(files[0])
        self._min_index = (files[0].start_offset + (first_used or 0) * _ENTRY) // _ENTRY
        last = files[-1]
        end = self._first_unused(last)
        last.wrote = last.flushed = end * _ENTRY
        self._max_index = (last.start_offset + end * _ENTRY) // _ENTRY

    def _find_ends_in_one(self, mf: MappedFile) -> None:
        ranges = mf.written_ranges(0)
        begin = ranges[0][0] - ranges[0][0] % _ENTRY if ranges else 0
        stop = min(mf.size, -(-ranges[-1][1] // _ENTRY) * _ENTRY) if ranges else 0
        used = unused = None
        entries = CONSUME_QUEUE_ENTRY.iter_unpack(mf.peek(begin, stop - begin))
        for n, (_phys, size, _tags) in enumerate(entries, begin // _ENTRY):
            if used is None:
                if size:
                    used = n
            elif not size:
                unused = n
                break
        if used is None:
            used = unused = 0
        elif unused is None:
            unused = stop // _ENTRY
        self._min_index = (mf.start_offset + used * _ENTRY) // _ENTRY
        self._max_index = (mf.start_offset + unused * _ENTRY) // _ENTRY
        mf.wrote = mf.flushed = unused * _ENTRY

    @staticmethod
    def _first_used(mf: MappedFile) -> int | None:
        """The first used entry; read with `peek` (no mapping) over what may hold data only."""
        for start, end in mf.written_ranges(0):
            pos = start - start % _ENTRY
            while pos < end:
                length = min(_SCAN_CHUNK_BYTES, mf.size - pos, -(-(end - pos) // _ENTRY) * _ENTRY)
                chunk = mf.peek(pos, length)
                for n, (_phys, size, _tags) in enumerate(CONSUME_QUEUE_ENTRY.iter_unpack(chunk)):
                    if size:
                        return pos // _ENTRY + n
                pos += len(chunk)
        return None

    @staticmethod
    def _first_unused(mf: MappedFile) -> int:
        """The first zero entry. Only the part of the file the filesystem may hold data in is
        read (MappedFile.written_ranges): past it every entry is zero, so a restart costs the
        entries written, not the file size, per queue."""
        ranges = mf.written_ranges(0)
        if not ranges:
            return 0
        stop = min(mf.size, -(-ranges[-1][1] // _ENTRY) * _ENTRY)
        pos = 0
        while pos < stop:
            chunk = mf.peek(pos, min(_SCAN_CHUNK_BYTES, stop - pos))
            for n, (_phys, size, _tags) in enumerate(CONSUME_QUEUE_ENTRY.iter_unpack(chunk)):
                if size == 0:
                    return pos // _ENTRY + n
            pos += len(chunk)
        return stop // _ENTRY

    # --- offsets ------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self._min_index

    @property
    def max_offset(self) -> int:
        return self._max_index

    # --- write --------------------------------------------------------------------------------

    def _file_for_index(self, index: int, *, create: bool) -> MappedFile | None:
        byte_offset = index * _ENTRY
        mf = self.files.find_file(byte_offset)
        if mf is not None or not create or byte_offset < self.files.min_offset:
            return mf
        file_size = self.files.file_size
        last = self.files.last_file()
        if last is None:
            start = byte_offset - byte_offset % file_size
            self._min_index = index
            return self.files.create_file(start)
        while True:
            last.wrote = last.size
            last = self.files.create_file(last.end_offset)
            if last.end_offset > byte_offset:
                return last

    def put_at(self, index: int, physical_offset: int, size: int, tags_code: int) -> PutAt:
        """Write the entry for queue offset `index`."""
        assert size > 0
        entry = CONSUME_QUEUE_ENTRY.pack(physical_offset, size, tags_code)
        was_empty = self._max_index == self._min_index and not self.files.files
        mf = self._file_for_index(index, create=True)
        if mf is None:
            return PutAt.BELOW
        pos = index * _ENTRY - mf.start_offset
        if index < self._max_index:
            if mf.read(pos, _ENTRY) == entry:
                return PutAt.PRESENT
            mf.write_at(pos, entry)
            return PutAt.REPLACED
        if was_empty:
            outcome = PutAt.STARTED if index > 0 else PutAt.APPENDED
        else:
            outcome = PutAt.APPENDED if index == self._max_index else PutAt.GAP
        if mf.wrote > pos:  # a gap inside this file was left zero; keep `wrote` monotonic
            mf.write_at(pos, entry)
        else:
            mf.wrote = pos
            mf.append(entry)
        self._max_index = index + 1
        if was_empty:
            self._min_index = index
        return outcome

    def put_run(self, index: int, entries: Sequence[tuple[int, int, int]]) -> None:
        """`put_at` for consecutive queue offsets from `index`: one write when they append to
        the current file, else entry by entry."""
        if not self.append_run(index, entries):
            for n, (physical_offset, size, tags_code) in enumerate(entries):
                self.put_at(index + n, physical_offset, size, tags_code)

    def append_run(self, index: int, entries: Sequence[tuple[int, int, int]]) -> bool:
        """Append `entries` at queue offsets from `index` with one write, if they continue a
        queue that has entries, in its current file (each one's `put_at` outcome: APPENDED);
        False, and nothing written, otherwise."""
        last = self.files.last_file()
        if (
            last is not None
            and index == self._max_index > self._min_index
            and last.start_offset + last.wrote == index * _ENTRY
            and last.wrote + len(entries) * _ENTRY <= last.size
        ):
            last.append(_entries_struct(len(entries)).pack(*itertools.chain(*entries)))
            self._max_index = index + len(entries)
            return True
        return False

    # --- read ---------------------------------------------------------------------------------

    def get(self, index: int) -> tuple[int, int, int] | None:
        """(physical offset, size, tags code) at `index`, None if outside or unused."""
        if not self._min_index <= index < self._max_index:
            return None
        mf = self.files.find_file(index * _ENTRY)
        if mf is None:
            return None
        phys, size, tags = CONSUME_QUEUE_ENTRY.unpack_from(mf.mm, index * _ENTRY - mf.start_offset)
        if size <= 0:
            return None
        return phys, size, tags

    def max_offset_within(self, log_end: int) -> int:
        """The queue's end for a reader shown only records that end at or below `log_end` (a
        controller-mode master's confirm offset, broker/visibility.py): the offset just past
        the last entry whose record does.

        Entries are in log order, so those past `log_end` are the queue's tail: read back
        entry by entry (normally a few, or none: one read), then, for a tail longer than
        WITHIN_TAIL_SCAN_ENTRIES (e.g. before the first confirm), binary-searched. An unused
        entry counts as past `log_end`: never shown too early.

            entries  | min ... | k-1 | k | ... | max-1 |     k-1 ends <= log_end < k's end
            answer                     k
        """
        lo, index = self._min_index, self._max_index
        stop = max(lo, index - WITHIN_TAIL_SCAN_ENTRIES)
        while index > stop:
            if self._ends_within(index - 1, log_end):
                return index
            index -= 1
        while lo < index:  # [index, max) end past log_end: find the first of [lo, index) that does
            mid = (lo + index) // 2
            if self._ends_within(mid, log_end):
                lo = mid + 1
            else:
                index = mid
        return lo

    def _ends_within(self, index: int, log_end: int) -> bool:
        mf = self.files.find_file(index * _ENTRY)
        if mf is None:  # its file was deleted meanwhile (retention): an old record
            return True
        phys: int
        size: int
        phys, size, _tags = CONSUME_QUEUE_ENTRY.unpack_from(mf.mm, index * _ENTRY - mf.start_offset)
        return size > 0 and phys + size <= log_end

    def entries(self, start: int, count: int) -> Iterator[tuple[int, int, int, int]]:
        """(index, physical offset, size, tags code) from `start`, at most `count` indexes."""
        index = max(start, self._min_index)
        stop = min(self._max_index, start + count)
        while index < stop:
            mf = self.files.find_file(index * _ENTRY)
            if mf is None:
                index += 1
                continue
            first = index * _ENTRY - mf.start_offset
            # Read a chunk at a time: callers usually stop after a few dozen entries.
            last = min(mf.size, (stop * _ENTRY) - mf.start_offset, first + ENTRIES_READ_CHUNK_BYTES)
            for phys, size, tags in CONSUME_QUEUE_ENTRY.iter_unpack(mf.read(first, last - first)):
                if size > 0:
                    yield index, phys, size, tags
                index += 1
            if last == mf.size:
                # Read through to the file's end: a reader moving on (a catch-up consumer, verify)
                # leaves nothing of it mapped. Only its flushed part goes (MappedFile.release).
                mf.release(mf.size)

    # --- maintenance --------------------------------------------------------------------------

    def truncate_physical(self, log_end: int) -> int:
        """Drop trailing entries whose record starts at or after `log_end`; returns how many."""
        dropped = 0
        while self._max_index > self._min_index:
            index = self._max_index - 1
            mf = self.files.find_file(index * _ENTRY)
            assert mf is not None
            pos = index * _ENTRY - mf.start_offset
            phys, size, _tags = CONSUME_QUEUE_ENTRY.unpack(mf.peek(pos, _ENTRY))
            if size and phys < log_end:
                break
            self._max_index = index
            dropped += 1
        if dropped:
            self.files.truncate(self._max_index * _ENTRY)
            if self._max_index == self._min_index:
                self.files.destroy()
        return dropped

    def delete_below_physical(self, log_min: int) -> int:
        """Forget entries whose record is below `log_min`; returns CQ files deleted."""
        files = self.files.files
        deletable = 0
        for mf in files[:-1]:
            last_index = mf.end_offset // _ENTRY - 1
            mf.touched_from = min(mf.touched_from, mf.size - _ENTRY)
            entry = CONSUME_QUEUE_ENTRY.unpack_from(mf.mm, mf.size - _ENTRY)
            if entry[1] and entry[0] >= log_min and last_index < self._max_index:
                break
            deletable += 1
        removed = self.files.delete_first(deletable)
        self.correct_min(log_min)
        return removed

    def correct_min(self, log_min: int) -> None:
        """Move `min_offset` to the first used entry whose record starts at or after `log_min`
        (`max_offset` if none).

        Entries are in log order, so a binary search: ~17 probes for 100,000 entries, each one
        pread of a page (`peek`: a start's pass over every queue maps none of them) through one
        descriptor per file (`held_open`), instead of one open+pread+close per entry. An unused
        entry (a hole left by a gap) is judged by the first used entry after it.
        """
        lo = max(self._min_index, self.files.min_offset // _ENTRY)
        hi = self._max_index
        with contextlib.ExitStack() as held:
            for mf in self.files.files[:1] + self.files.files[-1:]:
                held.enter_context(mf.held_open())
            # Invariant: every used entry below `lo` starts below `log_min`; the first used
            # entry at or after `hi` (if any) starts at or after it.
            while lo < hi:
                mid = (lo + hi) // 2
                found = self._first_used_from(mid, hi)
                if found is None or found[1] >= log_min:
                    hi = mid
                else:
                    lo = found[0] + 1
            found = self._first_used_from(lo, self._max_index)
        self._min_index = found[0] if found is not None else self._max_index

    def _first_used_from(self, index: int, stop: int) -> tuple[int, int] | None:
        """(index, physical offset) of the first used entry in [index, stop), read a page of
        entries at a time with `peek`."""
        while index < stop:
            mf = self.files.find_file(index * _ENTRY)
            if mf is None:  # a gap between files (load): no entries there
                index += 1
                continue
            pos = index * _ENTRY - mf.start_offset
            end = min(mf.size, stop * _ENTRY - mf.start_offset, pos + _PROBE_BYTES)
            for phys, size, _tags in CONSUME_QUEUE_ENTRY.iter_unpack(mf.peek(pos, end - pos)):
                if size > 0:
                    return index, phys
                index += 1
        return None

    def flush(self) -> None:
        """Sync the entries written, then release the flushed pages behind the resident tail."""
        flush_queues([self])

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
        shutil.rmtree(self.directory, ignore_errors=True)


def flush_queues(queues: Sequence[ConsumeQueue]) -> None:
    """`flush` every queue, syncing their files together (lazy_file.sync_files: one syncfs
    when many are dirty, as after a burst of new queues)."""
    files: list[LazyMappedFile] = []
    for cq in queues:
        with cq.files.lock:
            files.extend(cq.files.files)  # type: ignore[arg-type]  # a LazyFileQueue's
    sync_files(files)
    for cq in queues:
        cq.files.release(CONSUME_QUEUE_RESIDENT_BYTES)
