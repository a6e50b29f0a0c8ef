"""Consume-queue files (lazy_file.py, consume_queue.py) under the conditions a crash or a full
disk leaves: short files at load, failed block reservations, mappings still viewed when the
cache evicts them, syncs of many files, and `correct_min`'s cost on an unmapped queue."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from store_helpers import Opener, message

from tidemq.store import consume_queue as cqmod
from tidemq.store import lazy_file, message_store, queue_manifest
from tidemq.store.consume_queue import ConsumeQueue, PutAt
from tidemq.store.lazy_file import LazyMappedFile, MappingCache


def _cq_file(root: Path, topic: str) -> Path:
    files = sorted((root / "consumequeue" / topic / "0").iterdir())
    assert len(files) == 1
    return files[0]


@pytest.mark.parametrize("keep", [0, 7])
def test_a_short_queue_file_is_extended_and_refilled_by_recovery(opener: Opener, keep: int) -> None:
    """A kill between O_CREAT and ftruncate (0 bytes), or a power loss before the size was
    durable (short): the broker starts, and recovery writes the entries again."""
    store = opener.open()
    assert store.put_message(message(0)).ok
    store.flush()  # checkpoint before the new queue's record
    new = message(1, topic="N")
    put = store.put_message(new)
    assert put.ok
    crashed = opener.crash_copy(store, f"crashed-{keep}")
    path = _cq_file(crashed, "N")
    os.truncate(path, keep)
    reopened = opener.open(crashed)
    assert path.stat().st_size == 16 * cqmod.CONSUME_QUEUE_ENTRY.size
    got = reopened.get_messages("N", 0, 0, 8)
    assert len(got.records) == 1
    assert reopened.max_offset("N", 0) == 1


def test_a_write_outside_the_file_raises(tmp_path: Path) -> None:
    cache = MappingCache()
    mf = LazyMappedFile.create_sparse(tmp_path / "f", 0, 4096, cache)
    try:
        with pytest.raises(ValueError, match="outside"):
            mf.write_at(4090, b"0123456789")
        with pytest.raises(ValueError, match="outside"):
            mf.write_at(-1, b"x")
        assert (tmp_path / "f").read_bytes() == bytes(4096)
    finally:
        mf.close()


def test_a_failed_reservation_does_not_fail_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, 1000)
    assert cq.put_at(0, 100, 10, 0) is PutAt.APPENDED
    mf = cq.files.files[0]
    assert isinstance(mf, LazyMappedFile)
    allocated = mf._allocated

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "no space for the reservation")

    monkeypatch.setattr(os, "posix_fallocate", full)
    for i in range(1, 600):  # well past the first page: reservations are due and fail
        assert cq.put_at(i, 100 + 10 * i, 10, 0) is PutAt.APPENDED
    assert mf._allocated == allocated  # skipped, tried again by later writes
    monkeypatch.undo()
    assert cq.put_at(600, 6100, 10, 0) is PutAt.APPENDED
    assert mf._allocated > 600 * cqmod.CONSUME_QUEUE_ENTRY.size
    assert cq.get(599) == (100 + 10 * 599, 10, 0)
    cq.close()


def test_an_evicted_mapping_still_viewed_stays_in_the_cache(tmp_path: Path) -> None:
    cache = MappingCache(limit=1)
    a = LazyMappedFile.create_sparse(tmp_path / "a", 0, 4096, cache)
    b = LazyMappedFile.create_sparse(tmp_path / "b", 0, 4096, cache)
    c = LazyMappedFile.create_sparse(tmp_path / "c", 0, 4096, cache)
    view = memoryview(a.mm)  # an export: a's mapping cannot be closed
    b.mm  # noqa: B018 - maps b, evicting a, which refuses
    assert a.is_mapped
    assert len(cache) == 2  # a is still counted, first in line
    view.release()
    c.mm  # noqa: B018 - maps c: the cache goes back to its limit
    assert not a.is_mapped
    assert not b.is_mapped
    assert len(cache) == 1
    for mf in (a, b, c):
        mf.close()


def test_syncfs_only_for_a_burst_of_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if lazy_file._SYNCFS is None:
        pytest.skip("no syncfs here")
    real = lazy_file._SYNCFS
    syncfs_calls = 0

    def counting(fd: int) -> int:
        nonlocal syncfs_calls
        syncfs_calls += 1
        return real(fd)

    monkeypatch.setattr(lazy_file, "_SYNCFS", counting)
    cache = MappingCache()
    count = lazy_file.SYNCFS_MIN_FILES
    files = [
        LazyMappedFile.create_sparse(tmp_path / f"{n:03d}", 0, 4096, cache) for n in range(count)
    ]
    for mf in files:
        mf.append(b"new")
    lazy_file.sync_files(files)
    assert syncfs_calls == 1
    assert all(mf.flushed == mf.wrote == 3 for mf in files)
    for mf in files:  # the steady state: the same files written again
        mf.append(b"more")
    lazy_file.sync_files(files)
    assert syncfs_calls == 1  # fdatasync each
    assert all(mf.flushed == mf.wrote == 7 for mf in files)
    for mf in files:
        mf.close()


def test_correct_min_binary_searches_an_unmapped_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, 1000)
    used = [i for i in range(5000) if not 2000 <= i < 2600]  # a gap: unused entries
    for i in used:
        cq.put_at(i, 100 * i, 100, 0)
    cq.close()
    peeks = 0
    real = LazyMappedFile.peek

    def counting(self: LazyMappedFile, pos: int, length: int) -> bytes:
        nonlocal peeks
        peeks += 1
        return real(self, pos, length)

    monkeypatch.setattr(LazyMappedFile, "peek", counting)
    for log_min in (0, 50, 100 * 1999, 100 * 1999 + 1, 100 * 2300, 100 * 2600, 100 * 4999 + 1):
        loaded = ConsumeQueue(tmp_path, "T", 0, 1000)
        loaded.load()
        peeks = 0
        loaded.correct_min(log_min)
        expected = next((i for i in used if 100 * i >= log_min), 5000)
        assert loaded.min_offset == expected, log_min
        assert peeks <= 40, (log_min, peeks)  # not one per entry
        assert not any(mf.is_mapped for mf in loaded.files.files)  # type: ignore[attr-defined]
        loaded.close()


def test_a_failed_queue_flush_leaves_the_manifest_to_the_next(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener.open()
    assert store.put_message(message(0, topic="NEW")).ok
    manifest = store.config.root_dir / "consumequeue" / queue_manifest.QUEUE_MANIFEST_NAME

    def failing(queues: list[ConsumeQueue]) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(message_store, "flush_queues", failing)
    with pytest.raises(OSError, match="injected"):
        store.flush()
    assert "NEW/0" not in manifest.read_text()
    monkeypatch.undo()
    store.flush()
    assert "NEW/0" in manifest.read_text().splitlines()
