"""The key index: `<topic>#<key>` to commit-log offsets, in fixed-size hash files.

    index/<20-digit physical offset of the file's first entry>

    header (40 bytes)
    +-----------------+---------------+-----------------+---------------+-----------+-----------+
    | begin_ts_ms:i64 | end_ts_ms:i64 | begin_phys: i64 | end_phys: i64 | slots:i32 | count:i32 |
    +-----------------+---------------+-----------------+---------------+-----------+-----------+
    slots: `slots` x int32, the number of the newest entry whose key hashes there (0 = none)
    entries: `entries` x 20 bytes, entry 0 unused, so count starts at 1
    +----------------+-----------------+-------------------+-------------------+
    | key hash: u32  | phys: i64       | time diff s: i32  | previous: i32     |
    +----------------+-----------------+-------------------+-------------------+

This is RocketMQ's design (slots + chained entries) with crc32 as the key hash: the hash never
leaves the store, so it need not be Java's. Each file is bounded (`slots`, `entries`), so memory
and disk are bounded per file; a full file is closed and a new one started. Lookups walk the
chain newest-first; hashes collide, so callers confirm each hit against the record itself (the
store reads the record and compares topic and keys), which also makes stale entries beyond a
truncated log harmless.

Resident memory: only the newest file is written. A full file's `wrote` is set to its size, so
once flushed, `flush` releases its pages from the broker's resident set (and again after a
query touched them; mapped_file.py): the index's share of RSS is about one file.
"""

from __future__ import annotations

import logging
import shutil
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from tidemq.errors import StoreError
from tidemq.store.mapped_file import SEGMENT_NAME_DIGITS, MappedFile, segment_name

logger = logging.getLogger(__name__)

INDEX_HEADER: Final = struct.Struct(">qqqqii")
assert INDEX_HEADER.size == 40
INDEX_SLOT: Final = struct.Struct(">i")
assert INDEX_SLOT.size == 4
INDEX_ENTRY: Final = struct.Struct(">Iqii")
assert INDEX_ENTRY.size == 20


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode())


class IndexFile:
    def __init__(self, mf: MappedFile, slot_count: int, entry_count: int):
        self.mf = mf
        self.slot_count = slot_count
        self.entry_count = entry_count
        header: tuple[int, int, int, int, int, int] = INDEX_HEADER.unpack_from(mf.mm, 0)
        self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, slots, self.count = header
        if self.count == 0 and slots == 0:  # fresh file
            self.count = 1
        elif slots != slot_count or not 1 <= self.count <= entry_count:
            raise StoreError(f"{mf.path}: index header slots={slots} count={self.count} invalid")
        if self.full:
            mf.wrote = mf.size  # no more writes: all of it is released once flushed

    @staticmethod
    def file_size(slot_count: int, entry_count: int) -> int:
        return INDEX_HEADER.size + slot_count * INDEX_SLOT.size + entry_count * INDEX_ENTRY.size

    @property
    def full(self) -> bool:
        return self.count >= self.entry_count

    def _entry_pos(self, n: int) -> int:
        return INDEX_HEADER.size + self.slot_count * INDEX_SLOT.size + n * INDEX_ENTRY.size

    def put(self, key: str, physical_offset: int, store_ts_ms: int) -> None:
        assert not self.full
        self.put_entries([(key, physical_offset, store_ts_ms)], 0)

    def put_entries(self, entries: Sequence[tuple[str, int, int]], start: int) -> int:
        """Put (key, physical offset, store time) entries from `start` until the file is full;
        returns the index of the first entry not put. The header is written once, at the end."""
        mm = self.mf.mm
        slot_count = self.slot_count
        slot_base, slot_size = INDEX_HEADER.size, INDEX_SLOT.size
        entry_size = INDEX_ENTRY.size
        entry_at = self._entry_pos(0)
        unpack_slot, pack_slot = INDEX_SLOT.unpack_from, INDEX_SLOT.pack_into
        pack_entry = INDEX_ENTRY.pack_into
        crc32 = zlib.crc32
        n = self.count
        stop = min(len(entries), start + self.entry_count - n)
        if start >= stop:
            return start
        if n == 1:
            _key, self.begin_phys, self.begin_ts = entries[start]
        begin_ts, end_ts, end_phys = self.begin_ts, self.end_ts, self.end_phys
        entry_at += n * entry_size
        for index in range(start, stop):
            key, physical_offset, store_ts_ms = entries[index]
            h = crc32(key.encode())  # key_hash
            slot_pos = slot_base + (h % slot_count) * slot_size
            (previous,) = unpack_slot(mm, slot_pos)
            pack_entry(mm, entry_at, h, physical_offset, (store_ts_ms - begin_ts) // 1000, previous)
            pack_slot(mm, slot_pos, n)
            n += 1
            entry_at += entry_size
            if store_ts_ms > end_ts:
                end_ts = store_ts_ms
            if physical_offset > end_phys:
                end_phys = physical_offset
        self.end_ts, self.end_phys = end_ts, end_phys
        self.count = n
        self.write_header()
        if self.full:
            self.mf.wrote = self.mf.size  # after the bytes it covers, as for appends
        return stop

    def write_header(self) -> None:
        INDEX_HEADER.pack_into(
            self.mf.mm,
            0,
            self.begin_ts,
            self.end_ts,
            self.begin_phys,
            self.end_phys,
            self.slot_count,
            self.count,
        )

    def lookup(self, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Physical offsets of entries for `key` (hash matches), newest first."""
        h = key_hash(key)
        slot_pos = INDEX_HEADER.size + (h % self.slot_count) * INDEX_SLOT.size
        self.mf.touched_from = 0  # the chain may lead anywhere in the file
        (n,) = INDEX_SLOT.unpack_from(self.mf.mm, slot_pos)
        found: list[int] = []
        steps = 0
        while 0 < n < self.count and len(found) < limit and steps < self.entry_count:
            entry_hash, phys, diff_s, previous = INDEX_ENTRY.unpack_from(
                self.mf.mm, self._entry_pos(n)
            )
            ts = self.begin_ts + diff_s * 1000
            # Seconds granularity: widen by one second; the caller checks the exact time.
            if entry_hash == h and begin_ms - 1000 <= ts <= end_ms:
                found.append(phys)
            if previous >= n:  # chains only go back; anything else is damage
                break
            n = previous
            steps += 1
        return found


class IndexService:
    def __init__(
        self, directory: Path, slot_count: int, entry_count: int, *, read_only: bool = False
    ):
        self.directory = directory
        self.slot_count = slot_count
        self.entry_count = entry_count
        self.read_only = read_only
        self.files: list[IndexFile] = []

    def load(self) -> bool:
        """Map the index files; False (and nothing loaded) if any is damaged."""
        if not self.directory.is_dir():
            return True
        size = IndexFile.file_size(self.slot_count, self.entry_count)
        try:
            for path in sorted(self.directory.iterdir()):
                if len(path.name) != SEGMENT_NAME_DIGITS or not path.name.isdigit():
                    continue
                mf = MappedFile(path, int(path.name), size, read_only=self.read_only)
                try:
                    self.files.append(IndexFile(mf, self.slot_count, self.entry_count))
                except StoreError:
                    mf.close()
                    raise
        except StoreError as exc:
            logger.warning("index not usable (%s); it will be rebuilt", exc)
            self.close()
            self.files = []
            return False
        return True

    def put(self, key: str, physical_offset: int, store_ts_ms: int) -> None:
        self.put_many([(key, physical_offset, store_ts_ms)])

    def put_many(self, entries: Sequence[tuple[str, int, int]]) -> None:
        """(key, physical offset, store time) entries in order; one header write per file."""
        index = 0
        while index < len(entries):
            current = self.files[-1] if self.files else None
            if current is None or current.full:
                current = self._next_file(current, entries[index][1])
            index = current.put_entries(entries, index)

    def _next_file(self, current: IndexFile | None, physical_offset: int) -> IndexFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        size = IndexFile.file_size(self.slot_count, self.entry_count)
        # Named by the first entry's offset; re-indexing after a crash may revisit offsets
        # an older file already starts at, so keep names increasing.
        name_offset = physical_offset
        if current is not None:
            name_offset = max(name_offset, current.mf.start_offset + 1)
        path = self.directory / segment_name(name_offset)
        created = IndexFile(
            MappedFile.create(path, name_offset, size), self.slot_count, self.entry_count
        )
        self.files.append(created)
        return created

    def query(self, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Candidate physical offsets for `key`, newest first, at most `max_count`."""
        found: list[int] = []
        for index_file in reversed(self.files):
            if len(found) >= max_count:
                break
            if index_file.count <= 1:
                continue
            if index_file.end_ts < begin_ms - 1000 or index_file.begin_ts > end_ms:
                continue
            found.extend(index_file.lookup(key, begin_ms, end_ms, max_count - len(found)))
        return found

    def delete_below(self, log_min: int) -> int:
        """Delete index files (not the newest) that only point below `log_min`."""
        removed = 0
        while len(self.files) > 1 and self.files[0].end_phys < log_min:
            self.files.pop(0).mf.destroy()
            removed += 1
        return removed

    def flush(self) -> None:
        """Sync every file; release the full ones' flushed pages (the newest stays mapped)."""
        files = list(self.files)
        for index_file in files:
            index_file.mf.flush_all()
        for index_file in files:
            index_file.mf.release(index_file.mf.size)

    def close(self) -> None:
        for index_file in self.files:
            index_file.mf.close()

    def destroy_all(self) -> None:
        self.close()
        self.files = []
        shutil.rmtree(self.directory, ignore_errors=True)
