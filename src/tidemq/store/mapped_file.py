"""Preallocated, memory-mapped segment files and ordered queues of them.

Both the commit log and every consume queue are a directory of equal-sized segments, each named
by the byte offset of its first byte as 20 decimal digits:

    commitlog/00000000000000000000   bytes [0, size)
    commitlog/00000000000000004096   bytes [size, 2*size)          (size = segment size)

A segment is allocated at full size when created (posix_fallocate where available, so a full
disk fails the creation instead of a later page fault), mapped read-write, and written through
the map. `wrote` is the position up to which the segment holds data; `flushed` the position up
to which a flush has returned. The queue's owner sets `wrote` on load (recovery finds the end).
Consume queues use lazy_file.py's subclass instead: sparse, no descriptor kept, mapped on use.

Threads: the event-loop thread appends; a flush thread calls `flush`. The segment list is
guarded by `lock` for structural changes (add, delete, close); writes to a mapped page need no
lock, and `flush` only reads `wrote`, whose update follows the bytes it covers.

Resident pages. Every page written or read through a mapping stays in the process's resident
set (RssFile) until unmapped, so without help the broker's RSS would grow with the backlog it
has touched. `release` gives pages back with madvise(MADV_DONTNEED) after they are flushed:

    segment   [ released | flushed, not yet released  | unflushed (dirty) ]
              0          released                     flushed            wrote
              `-- not mapped: a read faults the page back in from the page cache (~0.2 us/page)

The owner (the flush thread, after a flush) releases the flushed pages further than a kept
tail behind the write position, each page once, and again the pages readers faulted back in
below that point: `find_file` notes the lowest position looked up since the last pass in
`touched_from` (catch-up consumers, key queries, recovery scans). A reader that walks a whole
file (the log scanner, a consume queue read to its end) releases it at once. Releasing from two
threads is harmless: at worst a range is released twice or a touched page waits a pass.

Only flushed ranges are released. On Linux, MADV_DONTNEED on a MAP_SHARED file mapping only
drops this process's page table entries: the data lives in the page cache, and a dirty page's
dirty bit moves to the page cache page (zap_pte_range marks the folio dirty), so even an
unflushed page would keep its bytes and still be written back (tests/store/test_resident.py
reads one back through the map and through read()). We release only flushed ranges anyway:
nothing then depends on that kernel detail, and a flushed page is clean, so dropping it costs no
writeback. Private or anonymous mappings would lose data this way; ours are all MAP_SHARED.
Where MADV_DONTNEED is missing (not Linux), `release` does nothing.

Past the end. A segment is preallocated, so its bytes past the last record are zeros unless
something wrote there: a torn tail left by a crash. Recovery must find and zero such bytes (a
later scan would otherwise read them as records) but must not read the whole rest of a 1 GiB
segment to do so: that costs seconds and pages the segment into the page cache and, through
the mapping, into RSS. `written_ranges` asks the filesystem where data may lie (SEEK_DATA /
SEEK_HOLE): a hole reads as zeros by definition, and preallocated-but-unwritten extents are
reported as holes by ext4, xfs and btrfs unless cached pages cover them, so only what was
written (plus what is cached) is read. A filesystem that cannot tell reports everything as
data: the check is then as complete as before, only slower. The tail is read with pread, not
through the mapping, and given back to the kernel afterwards, so it never joins the RSS.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Final

from tidemq.errors import StoreError

logger = logging.getLogger(__name__)

SEGMENT_NAME_DIGITS: Final = 20
_PAGE: Final = mmap.PAGESIZE
# A read fault maps the cached pages around it too, this many bytes aligned (Linux's default
# fault_around_bytes), so a touched position releases from this boundary below it.
_FAULT_AROUND_BYTES: Final = 64 * 1024
# madvise needs a page-aligned start; our offsets are relative to the page-aligned mapping.
assert _FAULT_AROUND_BYTES % _PAGE == 0
_MADV_DONTNEED: Final[int | None] = getattr(mmap, "MADV_DONTNEED", None)
_SEEK_DATA: Final[int | None] = getattr(os, "SEEK_DATA", None)
_SEEK_HOLE: Final[int | None] = getattr(os, "SEEK_HOLE", None)
# The tail past the end is checked for non-zero bytes this many bytes per pread: large enough
# for few system calls, small enough not to hold much memory.
_ZERO_CHECK_CHUNK_BYTES: Final = 1 << 20
_ZEROS: Final = bytes(_ZERO_CHECK_CHUNK_BYTES)


def data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of [start, end) of `fd`'s file that may hold data: everything else is a hole
    and reads as zeros. Conservative: without SEEK_DATA support, the whole range."""
    if _SEEK_DATA is None or _SEEK_HOLE is None:  # pragma: no cover - not Linux
        yield start, end
        return
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, _SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # only holes from `pos` to the end of the file
            yield pos, end  # the filesystem cannot tell
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, _SEEK_HOLE), end)
        yield data, hole
        pos = hole


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    """pwrite all of `data` at `pos` (a regular file takes all of it, barring a signal)."""
    with memoryview(data) as view:
        done = os.pwrite(fd, view, pos)
        while done < len(view):
            done += os.pwrite(fd, view[done:], pos + done)


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{SEGMENT_NAME_DIGITS}d}"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MappedFile:
    """One segment: `size` bytes mapped, covering offsets [start_offset, start_offset + size)."""

    def __init__(self, path: Path, start_offset: int, size: int, *, read_only: bool = False):
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self.read_only = read_only
        self.wrote = 0
        self.flushed = 0
        # Pages below `released` were released once flushed (writer side, see module docstring).
        self.released = 0
        # Lowest position looked up since the last release pass; `size` when none was.
        self.touched_from = size
        actual = path.stat().st_size
        if actual != size:
            raise StoreError(f"{path}: {actual} bytes, expected {size} (segment size changed?)")
        flags = os.O_RDONLY if read_only else os.O_RDWR
        fd = os.open(path, flags)
        try:
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self.mm = mmap.mmap(fd, size, access=access)
        except BaseException:
            os.close(fd)
            raise
        # The descriptor stays open for flushing: fdatasync on it writes the shared mapping's
        # dirty pages (one page cache on Linux) and releases the GIL, where mmap.flush (msync)
        # measured 10x less progress for the event-loop thread while it ran.
        self._fd = fd

    @classmethod
    def create(cls, path: Path, start_offset: int, size: int) -> MappedFile:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - non-Linux
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        fsync_dir(path.parent)
        return cls(path, start_offset, size)

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    def append(self, data: bytes | memoryview) -> int:
        """Write at `wrote`, advance it, and return the position written at (relative)."""
        pos = self.wrote
        end = pos + len(data)
        assert end <= self.size, (pos, len(data), self.size)
        self.mm[pos:end] = data
        self.wrote = end
        return pos

    def append_written(self, data: bytes | memoryview) -> int:
        """`append` through the file descriptor (pwrite), not the mapping: the same page cache,
        so the mapping shows the bytes at once (Linux, and any system with a unified buffer
        cache). For a large append to fresh pages (a slave's runs, store/replica.py) this
        skips the page fault per page of the writer's mapping (~3x less CPU per MiB), and the
        pages join the process's RSS only when read through the mapping."""
        return self.append_parts_written((data,))

    def append_parts_written(self, parts: Sequence[bytes | memoryview]) -> int:
        """`append_written` of `parts`, one after the other, with `wrote` moved ONCE, after the
        last: a flush thread reads `wrote` unlocked (pwrite releases the GIL), and a flushed
        offset inside a record would make a crash mid-write look like damage below the flushed
        offset to recovery. On an error `wrote` stays where it was, and the bytes written past
        it are zeroed (best effort: if that fails too they are a torn tail, which recovery's
        CRC check finds and zeroes; the next append overwrites them from `wrote` anyway)."""
        start = pos = self.wrote
        end = start + sum(map(len, parts))
        if end > self.size:
            raise ValueError(f"{self.path}: append of [{start}, {end}) past size {self.size}")
        try:
            for data in parts:
                _pwrite_all(self._fd, data, pos)
                pos += len(data)
        except OSError:
            self._zero_torn(start, end)
            raise
        self.wrote = end
        return start

    def _zero_torn(self, start: int, end: int) -> None:
        """Zero [start, end) after a failed append (`append_parts_written`), best effort."""
        try:
            for at in range(start, end, _ZERO_CHECK_CHUNK_BYTES):
                _pwrite_all(self._fd, _ZEROS[: min(_ZERO_CHECK_CHUNK_BYTES, end - at)], at)
        except OSError as exc:
            logger.error(
                "%s: could not zero [%d, %d) after a failed append (%s): a torn tail that "
                "recovery will find and zero",
                self.path,
                start,
                end,
                exc,
            )

    def write_at(self, pos: int, data: bytes) -> None:
        assert pos >= 0
        assert pos + len(data) <= self.size
        self.mm[pos : pos + len(data)] = data

    def read(self, pos: int, length: int) -> bytes:
        return self.mm[pos : pos + length]

    def peek(self, pos: int, length: int) -> bytes:
        """`read` for a one-off look (a start's scan): a lazy segment (lazy_file.py) reads it
        without mapping itself."""
        return self.mm[pos : pos + length]

    @contextlib.contextmanager
    def _descriptor(self) -> Iterator[int]:
        """A descriptor of the file for one operation: ours (lazy_file.py opens one per call)."""
        yield self._fd

    @contextlib.contextmanager
    def held_open(self) -> Iterator[None]:
        """Within: one descriptor serves every operation (lazy_file.py; here one always does)."""
        yield

    def written_ranges(self, pos: int) -> list[tuple[int, int]]:
        """The ranges of [pos, size) that may hold non-zero bytes (module docstring)."""
        with self._descriptor() as fd:
            return list(data_ranges(fd, pos, self.size))

    def nonzero_chunks(self, pos: int) -> Generator[tuple[int, int], None, None]:
        """(position, length) of each chunk of [pos, size) holding a non-zero byte, read with
        pread over `written_ranges` only: the cost is what was written, not the segment size."""
        advise = hasattr(os, "posix_fadvise")
        with self._descriptor() as fd:
            if advise:
                # No readahead past what we ask: it would only make more of the tail look
                # written. The mode belongs to the open file, which the mapping shares: reset it.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            try:
                for start, end in list(data_ranges(fd, pos, self.size)):
                    at = start
                    while at < end:
                        n = min(_ZERO_CHECK_CHUNK_BYTES, end - at)
                        data = os.pread(fd, n, at)
                        if data != (_ZEROS if n == _ZERO_CHECK_CHUNK_BYTES else bytes(n)):
                            yield at, n
                        at += n
            finally:
                if advise and fd >= 0 and self._fd == fd:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)

    def zero_from(self, pos: int) -> None:
        """Zero [pos, size) and set wrote = pos (truncation).

        Reads only `written_ranges` (module docstring), zeroes the chunks that are not zero
        already and makes those zeros durable, so the old bytes cannot come back after a power
        loss once new records are written before them. Then drops the tail's whole pages from
        this mapping and from the page cache: nothing should keep them resident, and cached
        pages would make the tail look written to the next `written_ranges`.
        """
        dirty = False
        for at, n in list(self.nonzero_chunks(pos)):
            self.mm[at : at + n] = bytes(n)
            dirty = True
        if dirty and not self.read_only:
            with self._descriptor() as fd:
                os.fdatasync(fd)
        self._drop_tail(pos)
        self.wrote = pos
        self.flushed = min(self.flushed, pos)
        self.released = min(self.released, pos - pos % _PAGE)

    def _drop_tail(self, pos: int) -> None:
        """Forget the clean pages wholly at or past `pos` (nothing is there but zeros)."""
        start = -(-pos // _PAGE) * _PAGE
        if start >= self.size:
            return
        if _MADV_DONTNEED is not None and not self.mm.closed:
            self.mm.madvise(_MADV_DONTNEED, start, self.size - start)
        if hasattr(os, "posix_fadvise"):
            with self._descriptor() as fd:
                os.posix_fadvise(fd, start, self.size - start, os.POSIX_FADV_DONTNEED)

    def flush(self) -> int:
        """Make the bytes written since the last flush durable; returns the flushed position."""
        wrote = self.wrote
        if wrote > self.flushed and not self.read_only:
            os.fdatasync(self._fd)
            self.flushed = wrote
        return self.flushed

    def flush_all(self) -> None:
        if not self.read_only:
            wrote = self.wrote  # before the sync: a later `wrote` may cover unsynced bytes
            os.fdatasync(self._fd)
            self.flushed = wrote

    def release(self, limit: int, step: int = 0) -> int:
        """Unmap from this process the flushed pages below `limit` (relative position): those not
        released before, and those touched since the last call. Returns the bytes released.

        The pages stay in the page cache; a later read faults them back in. Ranges at or above
        `flushed` are never released, and a partial last page only once the whole file is.
        Unless pages were touched or the file is done, nothing happens until at least `step`
        bytes can go (one madvise per step, not one per group-commit flush).
        """
        return self._release_from(self.mm, limit, step)

    def _release_from(self, mm: mmap.mmap, limit: int, step: int) -> int:
        if self.released >= self.size and self.touched_from >= self.size:
            return 0  # all released and nothing touched since: the common case of old files
        end = min(limit, self.flushed)
        if end < self.size:
            end -= end % _PAGE
        start = self.released
        touched = self.touched_from
        if touched < end:
            # This pass covers every touched page below `end` (those above are released when
            # the writer side reaches them). Reset first: a racing read marks for the next pass.
            self.touched_from = self.size
            start = min(start, touched - touched % _FAULT_AROUND_BYTES)
        elif end - start < step and end < self.size:
            return 0
        if end <= start or mm.closed or _MADV_DONTNEED is None:
            return 0
        try:
            mm.madvise(_MADV_DONTNEED, start, end - start)
        except OSError as exc:
            # Only memory is at stake: keep the pages mapped rather than fail the flush.
            logger.warning("%s: madvise of [%d, %d) failed: %s", self.path, start, end, exc)
            return 0
        if end > self.released:
            self.released = end
        return end - start

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class MappedFileQueue:
    """The ordered segments of one directory. Offsets are global byte offsets."""

    def __init__(self, directory: Path, file_size: int, *, read_only: bool = False):
        self.directory = directory
        self.file_size = file_size
        self.read_only = read_only
        self.files: list[MappedFile] = []
        self.lock = threading.Lock()

    def load(self) -> None:
        """Map every segment; all are marked full until the owner sets the end."""
        try:  # scandir: the entries' types come with the listing, no stat per file
            names = sorted(Path(e.path) for e in os.scandir(self.directory) if e.is_file())
        except (FileNotFoundError, NotADirectoryError):
            return
        for path in names:
            if len(path.name) != SEGMENT_NAME_DIGITS or not path.name.isdigit():
                logger.warning("ignoring stray file %s", path)
                continue
            start = int(path.name)
            if start % self.file_size:
                raise StoreError(f"{path}: start offset not a multiple of {self.file_size}")
            if self.files and start != self.files[-1].end_offset:
                logger.error(
                    "gap in %s before %s: segments from here on are not trusted",
                    self.directory,
                    path.name,
                )
            mf = self._open_file(path, start)
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Global offset just after the last written byte."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.start_offset + last.wrote

    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def create_file(self, start_offset: int) -> MappedFile:
        assert not self.read_only
        assert start_offset % self.file_size == 0
        assert not self.files or start_offset == self.files[-1].end_offset
        self.directory.mkdir(parents=True, exist_ok=True)
        mf = self._create_file(self.directory / segment_name(start_offset), start_offset)
        with self.lock:
            self.files.append(mf)
        return mf

    def _open_file(self, path: Path, start_offset: int) -> MappedFile:
        return MappedFile(path, start_offset, self.file_size, read_only=self.read_only)

    def _create_file(self, path: Path, start_offset: int) -> MappedFile:
        return MappedFile.create(path, start_offset, self.file_size)

    def find_file(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files or offset < files[0].start_offset:
            return None
        index = (offset - files[0].start_offset) // self.file_size
        if index < len(files) and files[index].start_offset <= offset < files[index].end_offset:
            mf = files[index]
        else:
            for mf in files:  # a gap on load: fall back to a linear search
                if mf.start_offset <= offset < mf.end_offset:
                    break
            else:
                return None
        # Readers come through here: note how far down this segment was touched (`release`).
        pos = offset - mf.start_offset
        if pos < mf.touched_from:
            mf.touched_from = pos
        return mf

    def truncate(self, offset: int) -> int:
        """Drop everything at and after `offset`; returns how many segments were deleted."""
        deleted = 0
        with self.lock:
            keep: list[MappedFile] = []
            for mf in self.files:
                if mf.start_offset > offset:
                    mf.destroy()
                    deleted += 1
                elif mf.end_offset > offset:
                    mf.zero_from(offset - mf.start_offset)
                    keep.append(mf)
                else:
                    keep.append(mf)
            self.files = keep
        return deleted

    def delete_first(self, count: int) -> int:
        with self.lock:
            victims, self.files = self.files[:count], self.files[count:]
        for mf in victims:
            mf.destroy()
        return len(victims)

    def flush(self) -> None:
        with self.lock:
            files = list(self.files)
        for mf in files:
            mf.flush()

    def release(self, keep_bytes: int) -> int:
        """Release flushed pages more than `keep_bytes` behind the end (see MappedFile.release),
        in steps of an eighth of that, so at most 9/8 of it stays; returns the bytes released.
        Called by the flush thread under the owner's flush lock, which also guards against
        segments being closed meanwhile."""
        with self.lock:
            files = list(self.files)
        if not files:
            return 0
        limit = files[-1].start_offset + files[-1].wrote - keep_bytes
        step = keep_bytes // 8
        released = 0
        for mf in files:
            released += mf.release(limit - mf.start_offset, step)
        return released

    def close(self) -> None:
        with self.lock:
            for mf in self.files:
                mf.close()

    def destroy(self) -> None:
        with self.lock:
            for mf in self.files:
                mf.destroy()
            self.files = []
