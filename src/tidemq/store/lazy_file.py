"""Segments that cost nothing while idle: the consume queues' files.

A broker holds one consume queue per (topic, queue id), thousands of them, most written a few
times. A preallocated, permanently mapped segment (mapped_file.py, right for the one commit log)
would cost each of them its full size on disk (6 MB by default), two descriptors (ours and the
one `mmap` duplicates on CPython < 3.13) and a mapping. Here instead:

- Disk. A new file is sparse (ftruncate to its full size: holes read as zeros, which a consume
  queue reads as unused entries). Blocks are reserved with posix_fallocate ahead of the writes,
  in steps that double from one page up to GROW_STEP_MAX_BYTES, so a queue with one entry takes
  one block. A reservation that fails is skipped (`_write`): the pwrite needs only the blocks
  it fills and fails with ENOSPC itself if even those are missing (no write goes through the
  mapping into a hole, so never a SIGBUS). A file shorter than its size at load (a kill before
  the ftruncate, a power loss) is extended the same way: holes, read as unused entries.
- Writes go through pwrite, not the mapping: the first write to a page through a shared
  mapping takes a write fault (page_mkwrite), measured at 4-10 ms a page on this machine's ext4
  while other processes flush, against ~20 us for pwrite of the same bytes; a queue's first
  entry always lands on a fresh page. The page cache is one, so the mapping reads them at once.
- Descriptors. Only the WRITE_DESCRIPTORS_MAX most recently written files keep one (for those
  pwrites); every other operation that needs one (a flush's fdatasync on the flush thread, the
  load's SEEK_DATA) opens its own for the call. A mapping needs none.
- Mappings. A file is mapped on first use and stays mapped while among the `MappingCache`'s
  most recently used; past the cache's limit the least recently used is unmapped (CPython's
  mmap keeps a duplicated descriptor per mapping, so the limit bounds descriptors too). An
  unmapped page loses nothing: its bytes, dirty or not, live in the page cache of the file, and
  the next flush's fdatasync (on its own descriptor) writes them.
- Directory entry. Creating a file no longer fsyncs its directory on the writer's thread: the
  file's first flush does (flush thread), before the checkpoint that relies on it is written.
- Syncing many. Each fdatasync of a file with new blocks commits the filesystem's journal
  (2-5 ms on this machine's ext4 under load): a stop after creating 10,000 queues took minutes.
  `sync_files` syncs a burst of SYNCFS_MIN_FILES or more NEW dirty files with one syncfs(2)
  of their filesystem instead (data, inodes and directory entries alike); every other dirty
  file (the steady state) with its own fdatasync, whose writeback errors are its own.

Threads: the event-loop thread maps, reads, writes and evicts (under the store's start, the
starting thread). The flush thread never maps: it syncs through its own descriptor and releases
pages (MappedFile.release) under the file's `_map_lock`, which eviction also takes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

from tidemq.errors import StoreError
from tidemq.store.mapped_file import MappedFile, MappedFileQueue, _pwrite_all, fsync_dir

logger = logging.getLogger(__name__)

_PAGE: Final = mmap.PAGESIZE
# Reservation ahead of a growing file stops doubling here: one fallocate per this many bytes.
GROW_STEP_MAX_BYTES: Final = 1 << 20
# Consume-queue files kept mapped per store (and so descriptors, one per mapping): enough for
# the queues a broker writes and reads at once; more only costs a remap (~20 us) per return.
CONSUME_QUEUE_MAPPINGS_MAX: Final = 512
# Descriptors kept for writing, per store: the queues being written at once (a hot queue's
# pwrite then costs no open/close).
WRITE_DESCRIPTORS_MAX: Final = 64
# From this many dirty files on, one syncfs instead of one fdatasync each (module docstring).
SYNCFS_MIN_FILES: Final = 32


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        syncfs: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    return syncfs


_SYNCFS: Final = _load_syncfs()


def sync_files(files: Sequence[LazyMappedFile]) -> None:
    """`flush` each dirty file: one by one, except a burst of SYNCFS_MIN_FILES or more new
    files (directory entry not synced yet, as after creating many queues), which one syncfs
    covers. Steady state is fdatasync per file: a syncfs would sync the whole filesystem
    (other processes' dirty data too), and its writeback errors are per filesystem, so
    another process's syncfs or fsync could take the error meant for ours."""
    dirty = [mf for mf in files if mf.wrote > mf.flushed and not mf.read_only]
    new = [(mf, mf.wrote) for mf in dirty if not mf._dir_synced]
    if len(new) >= SYNCFS_MIN_FILES and _SYNCFS is not None:
        fd = os.open(new[0][0].path.parent, os.O_RDONLY)
        try:
            if _SYNCFS(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs: {os.strerror(err)}")
        finally:
            os.close(fd)
        for mf, wrote in new:  # `wrote` as read before the sync: what it covers
            mf.flushed = wrote
            mf._dir_synced = True
    for mf in dirty:
        mf.flush()  # nothing left to do for those the syncfs covered


class MappingCache:
    """The mapped `LazyMappedFile`s, least recently used first; at most `limit` of them."""

    def __init__(
        self, limit: int = CONSUME_QUEUE_MAPPINGS_MAX, fd_limit: int = WRITE_DESCRIPTORS_MAX
    ):
        if limit < 1 or fd_limit < 1:
            raise ValueError(f"mapping limit {limit} or descriptor limit {fd_limit} < 1")
        self.limit = limit
        self.fd_limit = fd_limit
        self._files: OrderedDict[LazyMappedFile, None] = OrderedDict()
        self._fds: OrderedDict[LazyMappedFile, int] = OrderedDict()  # for writing, LRU first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._files)

    def touch(self, mf: LazyMappedFile) -> None:
        with self._lock:
            self._files[mf] = None
            self._files.move_to_end(mf)

    def mapped(self, mf: LazyMappedFile) -> None:
        """`mf` was just mapped: note it, and unmap the least recently used beyond the limit."""
        with self._lock:
            self._files[mf] = None
            self._files.move_to_end(mf)
            victims = []
            while len(self._files) > self.limit:
                victims.append(self._files.popitem(last=False)[0])
        for victim in victims:  # outside the lock: unmapping takes the victim's own lock
            if not victim.unmap():  # still viewed: back at the front, to be tried again next
                with self._lock:
                    self._files[victim] = None
                    self._files.move_to_end(victim, last=False)

    def write_fd(self, mf: LazyMappedFile) -> int:
        """A descriptor to write `mf` with, kept while `mf` is among the most recently written.
        Writers are on one thread (the event loop): a descriptor closed here is in no use."""
        with self._lock:
            fd = self._fds.get(mf)
            if fd is not None:
                self._fds.move_to_end(mf)
                return fd
            fd = os.open(mf.path, os.O_RDWR)
            self._fds[mf] = fd
            while len(self._fds) > self.fd_limit:
                os.close(self._fds.popitem(last=False)[1])
            return fd

    def forget(self, mf: LazyMappedFile) -> None:
        with self._lock:
            self._files.pop(mf, None)
            fd = self._fds.pop(mf, None)
        if fd is not None:
            os.close(fd)


class LazyMappedFile(MappedFile):
    """A `MappedFile` mapped only while in use, with no descriptor kept, grown on disk lazily."""

    def __init__(
        self,
        path: Path,
        start_offset: int,
        size: int,
        cache: MappingCache,
        *,
        read_only: bool = False,
        dir_synced: bool = True,
    ):
        # Not MappedFile.__init__: that maps the file and keeps its descriptor.
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self.read_only = read_only
        self.wrote = self.flushed = self.released = 0
        self.touched_from = size
        actual = path.stat().st_size
        if actual < size and not read_only:
            # A kill between the creation and the ftruncate (create_sparse), or a power loss
            # before the size was durable: extended, the missing part is holes, which read
            # as unused entries (the queue's end is found, and recovery refills it, as ever).
            logger.warning("%s: %d bytes, expected %d: extended (sparse)", path, actual, size)
            os.truncate(path, size)
        elif actual != size:
            raise StoreError(f"{path}: {actual} bytes, expected {size} (segment size changed?)")
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._cache = cache
        self._map_lock = threading.Lock()
        self._dir_synced = dir_synced
        self._allocated = 0  # bytes from 0 reserved on disk by this object (see _grow)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @classmethod
    def create_sparse(
        cls, path: Path, start_offset: int, size: int, cache: MappingCache
    ) -> LazyMappedFile:
        """A sparse file with its first page reserved (a new file is made to be written): a
        full disk fails the creation, as a preallocated segment's does."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        first = min(size, _PAGE)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, first)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        made = cls(path, start_offset, size, cache, dir_synced=False)
        made._allocated = first
        return made

    @property
    def mm(self) -> mmap.mmap:
        mm = self._mm
        if mm is None:
            return self._map()
        self._cache.touch(self)
        return mm

    @mm.setter
    def mm(self, value: mmap.mmap) -> None:  # pragma: no cover - never assigned
        raise AttributeError("a lazy segment maps itself")

    def _map(self) -> mmap.mmap:
        with self._descriptor() as fd:
            access = mmap.ACCESS_READ if self.read_only else mmap.ACCESS_WRITE
            mm = mmap.mmap(fd, self.size, access=access)
        with self._map_lock:
            self._mm = mm
        self._cache.mapped(self)
        return mm

    def unmap(self) -> bool:
        """Drop the mapping (the bytes stay in the page cache); the next use maps again. False
        if it stays mapped: a view of it (a memoryview, a buffer export) is still alive."""
        with self._map_lock:
            mm, self._mm = self._mm, None
            if mm is None:
                return True
            try:
                mm.close()
            except BufferError:  # keep it mapped a while longer
                self._mm = mm
                return False
            # Released pages no longer exist in this process: a new mapping starts empty.
            self.released = self.size
            self.touched_from = self.size
            return True

    def peek(self, pos: int, length: int) -> bytes:
        mm = self._mm
        if mm is not None:
            return mm[pos : pos + length]
        with self._descriptor() as fd:
            return os.pread(fd, length, pos)

    @property
    def is_mapped(self) -> bool:
        return self._mm is not None

    @contextlib.contextmanager
    def _descriptor(self) -> Iterator[int]:
        if self._fd >= 0:  # within held_open
            yield self._fd
            return
        fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def held_open(self) -> Iterator[None]:
        """One descriptor for every operation within (a start's few looks at the file). The
        thread that holds it must be the only one using this file meanwhile."""
        if self._fd >= 0:
            yield
            return
        self._fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        try:
            yield
        finally:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _write(self, pos: int, data: bytes | memoryview) -> None:
        """pwrite `data` at `pos`, reserving blocks ahead first (module docstring).

        A reservation that fails (ENOSPC: the step ahead does not fit; a filesystem without
        fallocate) is skipped, not raised: it is an optimisation (fewer, larger extents), and
        the pwrite needs only the blocks it fills. Writes never go through the mapping into a
        hole, so no SIGBUS either way; a disk too full for the pwrite itself raises ENOSPC,
        which the store answers as a failed dispatch and retries with backoff
        (store/dispatch_retry.py) while the broker's disk guard refuses new puts.
        """
        end = pos + len(data)
        if pos < 0 or end > self.size:
            raise ValueError(f"{self.path}: write of [{pos}, {end}) outside [0, {self.size})")
        fd = self._cache.write_fd(self)
        if end > self._allocated:
            self._reserve(fd, end)
        _pwrite_all(fd, data, pos)

    def _reserve(self, fd: int, end: int) -> None:
        """Reserve blocks up to `end` and a step beyond (`_write`); skipped if that fails."""
        step = min(max(self._allocated, _PAGE), GROW_STEP_MAX_BYTES)
        target = min(self.size, max(-(-end // _PAGE) * _PAGE, self._allocated + step))
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, self._allocated, target - self._allocated)
            except OSError as exc:
                logger.debug("%s: no reservation up to %d (%s)", self.path, target, exc)
                return  # tried again by the next write past `_allocated`
        self._allocated = target

    def append(self, data: bytes | memoryview) -> int:
        pos = self.wrote
        self._write(pos, data)
        self.wrote = pos + len(data)
        return pos

    def write_at(self, pos: int, data: bytes) -> None:
        self._write(pos, data)

    def append_parts_written(  # pragma: no cover - the log's only
        self, parts: Sequence[bytes | memoryview]
    ) -> int:
        raise NotImplementedError("lazy segments are written with `append`")

    def flush(self) -> int:
        wrote = self.wrote
        if wrote > self.flushed and not self.read_only:
            with self._descriptor() as fd:
                os.fdatasync(fd)
            self._sync_dir()
            self.flushed = wrote
        return self.flushed

    def flush_all(self) -> None:
        if not self.read_only:
            wrote = self.wrote
            with self._descriptor() as fd:
                os.fdatasync(fd)
            self._sync_dir()
            self.flushed = wrote

    def _sync_dir(self) -> None:
        if not self._dir_synced:
            fsync_dir(self.path.parent)
            self._dir_synced = True

    def release(self, limit: int, step: int = 0) -> int:
        """MappedFile.release, of the mapping if there is one: an unmapped file holds no page."""
        with self._map_lock:
            mm = self._mm
            if mm is None or mm.closed:
                return 0
            return self._release_from(mm, limit, step)

    def close(self) -> None:
        self.unmap()
        self._cache.forget(self)


class LazyFileQueue(MappedFileQueue):
    """A `MappedFileQueue` of `LazyMappedFile`s sharing one `MappingCache`."""

    def __init__(
        self,
        directory: Path,
        file_size: int,
        cache: MappingCache,
        *,
        read_only: bool = False,
    ):
        super().__init__(directory, file_size, read_only=read_only)
        self.cache = cache

    def _open_file(self, path: Path, start_offset: int) -> MappedFile:
        size = self.file_size
        return LazyMappedFile(path, start_offset, size, self.cache, read_only=self.read_only)

    def _create_file(self, path: Path, start_offset: int) -> MappedFile:
        return LazyMappedFile.create_sparse(path, start_offset, self.file_size, self.cache)
