"""What a consume queue costs while idle (issue 18): disk blocks, descriptors, mappings.

A queue with one entry used to cost its whole file on disk (posix_fallocate of 6 MB) and two
descriptors; now its file is sparse and grown as it fills, no descriptor is kept, and at most
the store's MappingCache limit of files stays mapped (store/lazy_file.py). These tests run real
stores on real files and check the figures with du-style block counts and /proc/self/fd, and
that nothing written is lost by an unmapped file or a stop without a flush.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from store_helpers import bodies, make_config, message

from tidemq.clock import FakeClock
from tidemq.store import FileMessageStore, PutStatus
from tidemq.store.lazy_file import LazyMappedFile, MappingCache

# Production's consume-queue file: 300,000 entries of 20 bytes (6 MB).
PRODUCTION_ENTRIES: Final = 300_000
QUEUES: Final = 120
SMALL_LIMIT: Final = 8


def allocated(path: Path) -> int:
    """Bytes of disk blocks of the files under `path` (what du counts, directories aside)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def open_fds(under: Path | None = None) -> int:
    """Descriptors of this process (those of files under `under`, if given)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        count += under is None or target.startswith(f"{under}/")
    return count


def open_store(root: Path, limit: int | None = None) -> FileMessageStore:
    store = FileMessageStore(
        make_config(root, consume_queue_file_entries=PRODUCTION_ENTRIES), FakeClock()
    )
    if limit is not None:
        # The production limits (512, 64) would need too many queues here.
        store._mappings.limit = store._mappings.fd_limit = limit
    store.start()
    return store


def put_one_per_queue(store: FileMessageStore, queues: int) -> None:
    for n in range(queues):
        put = store.put_message(message(n, topic=f"T{n:04d}"))
        assert put.status is PutStatus.PUT_OK


def test_a_queue_with_one_entry_takes_one_block_not_its_file_size(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        put_one_per_queue(store, QUEUES)
        store.flush()
        files = list((tmp_path / "consumequeue").glob("*/*/*"))
        assert len(files) == QUEUES
        assert all(f.stat().st_size == PRODUCTION_ENTRIES * 20 for f in files)
        per_queue = allocated(tmp_path / "consumequeue") / QUEUES
        assert per_queue <= 8192, per_queue  # one page reserved; was 6 MB
    finally:
        store.shutdown()


def test_a_growing_queue_reserves_blocks_ahead_and_reads_back(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        count = 1000  # 20,000 bytes of entries: past the first page
        for n in range(count):
            assert store.put_message(message(n, body=b"b%d" % n)).status is PutStatus.PUT_OK
        store.flush()
        assert bodies(store) == [b"b%d" % n for n in range(count)]
        cq_bytes = allocated(tmp_path / "consumequeue")
        assert count * 20 <= cq_bytes <= 64 * 1024, cq_bytes
    finally:
        store.shutdown()
    store = open_store(tmp_path)  # the end is found from the entries, holes read as unused
    try:
        assert store.max_offset("T", 0) == count
        assert store.put_message(message(count, body=b"last")).status is PutStatus.PUT_OK
        assert bodies(store)[-1] == b"last"
    finally:
        store.shutdown()


def test_descriptors_and_mappings_stay_bounded_however_many_queues(tmp_path: Path) -> None:
    before = open_fds()
    store = open_store(tmp_path, limit=SMALL_LIMIT)
    try:
        put_one_per_queue(store, QUEUES)
        assert len(store._mappings) <= SMALL_LIMIT
        # One descriptor per mapped file (CPython's mmap keeps a duplicate) and per file among
        # the last written, none per queue.
        assert 0 < open_fds(tmp_path / "consumequeue") <= 2 * SMALL_LIMIT
        for n in range(QUEUES):  # every queue readable, remapped on demand
            assert len(bodies(store, topic=f"T{n:04d}")) == 1
        assert len(store._mappings) <= SMALL_LIMIT
        assert 0 < open_fds(tmp_path / "consumequeue") <= 2 * SMALL_LIMIT
    finally:
        store.shutdown()
    assert open_fds() == before  # nothing left open by a stop


def test_unmapped_unflushed_entries_survive_a_stop_and_a_restart(tmp_path: Path) -> None:
    """Entries written through a mapping that was then evicted, before any flush: the bytes
    live in the page cache and the stop's flush syncs them through a fresh descriptor."""
    store = open_store(tmp_path, limit=SMALL_LIMIT)
    put_one_per_queue(store, QUEUES)  # no flush: most of these files were unmapped dirty
    store.shutdown()
    store = open_store(tmp_path, limit=SMALL_LIMIT)
    try:
        assert store.last_recovery is not None
        for n in range(QUEUES):
            assert store.max_offset(f"T{n:04d}", 0) == 1
            assert len(bodies(store, topic=f"T{n:04d}")) == 1
    finally:
        store.shutdown()


def test_the_cache_unmaps_the_least_recently_used(tmp_path: Path) -> None:
    cache = MappingCache(limit=2)
    files = [
        LazyMappedFile.create_sparse(tmp_path / f"{n:020d}", 0, 4096 * 4, cache) for n in range(3)
    ]
    for f, byte in zip(files, b"abc", strict=True):
        f.append(bytes([byte]) * 20)  # written with pwrite: nothing mapped yet
    assert [f.is_mapped for f in files] == [False, False, False]
    assert files[0].read(0, 20) == b"a" * 20
    assert files[1].read(0, 20) == b"b" * 20
    assert files[0].read(0, 20) == b"a" * 20  # 0 is now the most recent: 1 goes when 2 maps
    assert files[2].read(0, 20) == b"c" * 20
    assert [f.is_mapped for f in files] == [True, False, True]
    assert files[1].read(0, 20) == b"b" * 20  # back from the page cache
    assert [f.is_mapped for f in files] == [False, True, True]
    for f in files:
        f.flush()
        f.close()
    assert len(cache) == 0
