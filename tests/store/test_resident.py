"""Resident memory: flushed pages behind the tail leave the process's RSS, and nothing is lost.

RSS is read per mapping from /proc/self/smaps (Linux), so these tests see what the kernel has
mapped for each segment file, not what the store believes it released.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
from store_helpers import Opener, bodies, message

from tidemq.protocol.record import decode_record
from tidemq.store import FileMessageStore, StoreConfig
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.consume_queue import CONSUME_QUEUE_RESIDENT_BYTES
from tidemq.store.mapped_file import MappedFile, MappedFileQueue
from tidemq.testing.resident import SMAPS, mapped_rss_by_file

pytestmark = pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux /proc/self/smaps")

PAGE = mmap.PAGESIZE
SEGMENT = 256 * 1024  # 64 pages per commit-log segment
TAIL = 64 * 1024
BODY = b"b" * 1000


def segment_rss(directory: Path) -> dict[str, int]:
    """Resident bytes of each segment file under `directory` (0 for files not mapped)."""
    rss = mapped_rss_by_file()
    return {
        str(path.relative_to(directory)): rss.get(str(path), 0)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def put(store: FileMessageStore, first: int, count: int, keys: str | None = None) -> None:
    for i in range(first, first + count):
        result = store.put_message(message(i, body=BODY + str(i).encode(), keys=keys))
        assert result.ok, result


def expected(first: int, count: int) -> list[bytes]:
    return [BODY + str(i).encode() for i in range(first, first + count)]


def open_store(opener: Opener, root: Path | None = None, **overrides: object) -> FileMessageStore:
    values: dict[str, object] = {
        "commit_log_file_size": SEGMENT,
        "commit_log_resident_bytes": TAIL,
        "consume_queue_file_entries": 1024,  # 20 KiB files
    }
    values.update(overrides)
    return opener.open(root, **values)


def test_flushed_log_pages_behind_the_tail_are_released(opener: Opener) -> None:
    store = open_store(opener)
    put(store, 0, 800)  # ~850 KiB: four segments
    log_dir = store.config.root_dir / "commitlog"
    written = sum(segment_rss(log_dir).values())
    assert written >= 800 * len(BODY)  # every page written is mapped, none flushed yet
    store.flush()
    rss = segment_rss(log_dir)
    *older, last = rss.values()
    assert len(older) >= 3
    assert older == [0] * len(older)
    # The tail behind the write position stays mapped (released in steps of TAIL / 8), plus the
    # page being written.
    assert TAIL - PAGE <= last <= TAIL + TAIL // 8 + PAGE
    assert bodies(store) == expected(0, 800)


def test_every_record_reads_back_after_releases_and_recovery(opener: Opener) -> None:
    store = open_store(opener, commit_log_resident_bytes=0)
    count = 0
    for _ in range(6):  # write, release, read back: every round crosses a segment
        put(store, count, 150, keys="k")
        count += 150
        store.flush()
        assert sum(segment_rss(store.config.root_dir / "commitlog").values()) <= PAGE
        assert bodies(store) == expected(0, count)
    assert len(store.query_by_key("T", "k", 2000, 0, 10**15)) == count
    crashed = opener.crash_copy(store, "crashed")
    store.shutdown()
    for root in (store.config.root_dir, crashed):  # a clean restart and a kill -9
        again = open_store(opener, root, commit_log_resident_bytes=0)
        assert bodies(again) == expected(0, count)
        assert len(again.query_by_key("T", "k", 2000, 0, 10**15)) == count
        put(again, count, 10)
        again.flush()
        assert bodies(again) == expected(0, count + 10)
        again.shutdown()


def test_pages_read_back_in_are_released_by_the_next_flush(opener: Opener) -> None:
    store = open_store(opener, consume_queue_file_entries=256)  # 5 KiB files
    put(store, 0, 800)
    store.flush()
    root = store.config.root_dir
    before = segment_rss(root / "commitlog")
    assert bodies(store) == expected(0, 800)  # a consumer catching up from the start
    during = segment_rss(root / "commitlog")
    assert sum(during.values()) > sum(before.values()) + 512 * 1024
    # Consume-queue files read through to their end are released at once.
    *queue_files, _last = segment_rss(root / "consumequeue").values()
    assert len(queue_files) >= 2
    assert queue_files == [0] * len(queue_files)
    store.flush()
    assert segment_rss(root / "commitlog") == before


def test_consume_queue_and_index_files_are_released(opener: Opener) -> None:
    store = open_store(opener, index_entry_count=256)  # ~5 KiB index files
    put(store, 0, 3000, keys="k")
    store.flush()
    root = store.config.root_dir
    queue_rss = list(segment_rss(root / "consumequeue" / "T" / "0").values())
    assert len(queue_rss) >= 3
    assert queue_rss[:-1] == [0] * (len(queue_rss) - 1)
    assert queue_rss[-1] <= CONSUME_QUEUE_RESIDENT_BYTES + PAGE
    index_rss = list(segment_rss(root / "index").values())
    assert len(index_rss) >= 3
    assert index_rss[:-1] == [0] * (len(index_rss) - 1)
    # A key query walks old index files back in; the next flush releases them again.
    found = store.query_by_key("T", "k", 10_000, 0, 10**15)
    assert len(found) == 3000
    assert decode_record(found[-1]).body == BODY + b"0"
    assert sum(segment_rss(root / "index").values()) > index_rss[-1]
    store.flush()
    assert list(segment_rss(root / "index").values()) == index_rss


def test_unflushed_pages_are_never_released(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path, 16 * PAGE)
    mf = files.create_file(0)
    path = str(mf.path)
    try:
        mf.append(b"x" * (2 * PAGE + 100))
        assert files.release(0) == 0  # nothing flushed yet
        assert mapped_rss_by_file()[path] == 3 * PAGE
        files.flush()
        assert files.release(0) == 2 * PAGE  # not the page still being written
        assert mapped_rss_by_file()[path] == PAGE
        found = files.find_file(0)  # a reader: faults the pages back in
        assert found is mf
        assert mf.read(0, 2 * PAGE + 100) == b"x" * (2 * PAGE + 100)
        # The read fault maps its neighbours too (fault-around), here the rest of the file.
        mapped = mapped_rss_by_file()[path]
        assert mapped >= 3 * PAGE
        mf.append(b"y" * 10)
        assert files.release(0) == 2 * PAGE  # the pages read back in, again
        assert mapped_rss_by_file()[path] == mapped - 2 * PAGE
        assert mf.read(2 * PAGE + 100, 10) == b"y" * 10
    finally:
        files.close()


def test_small_advances_wait_for_a_step(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path, 64 * PAGE)
    mf = files.create_file(0)
    keep = 16 * PAGE  # released in steps of 2 pages
    try:
        mf.append(b"x" * 40 * PAGE)
        files.flush()
        assert files.release(keep) == 24 * PAGE
        mf.append(b"x" * PAGE)
        files.flush()
        assert files.release(keep) == 0  # one page is less than a step
        mf.append(b"x" * PAGE)
        files.flush()
        assert files.release(keep) == 2 * PAGE
        assert mapped_rss_by_file()[str(mf.path)] == keep
    finally:
        files.close()


def test_dontneed_on_a_shared_mapping_keeps_dirty_data(tmp_path: Path) -> None:
    """The kernel behaviour mapped_file.py relies on only as a safety net: dropping a dirty
    page of a MAP_SHARED file mapping moves its dirty state to the page cache, losing nothing."""
    path = tmp_path / "file"
    mf = MappedFile.create(path, 0, 4 * PAGE)
    try:
        mf.write_at(PAGE, b"dirty, never synced")
        mf.mm.madvise(mmap.MADV_DONTNEED, 0, mf.size)
        assert mapped_rss_by_file().get(str(path), 0) == 0
        assert mf.read(PAGE, 19) == b"dirty, never synced"
        with path.open("rb") as f:
            f.seek(PAGE)
            assert f.read(19) == b"dirty, never synced"
    finally:
        mf.close()


def test_scanner_unmaps_each_segment_it_walked_through(opener: Opener) -> None:
    store = open_store(opener)
    put(store, 0, 800)
    store.shutdown()
    log = CommitLog(store.config.root_dir / "commitlog", SEGMENT, read_only=True)
    log.load()
    try:
        scanner = LogScanner(log, 0)
        assert sum(1 for _ in scanner.records()) == 800
        *older, _last = segment_rss(store.config.root_dir / "commitlog").values()
        assert len(older) >= 3
        assert older == [0] * len(older)
    finally:
        log.close()


def test_resident_bytes_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="commit_log_resident_bytes"):
        StoreConfig(root_dir=tmp_path, commit_log_resident_bytes=-1)
