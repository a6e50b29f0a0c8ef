"""A restart costs the records the last segment holds, not the size of the segment.

Issue 11, item 4: with 1 GiB segments a clean restart of a store holding 2 messages took 7.4 s
and left ~1 GiB resident, because start-up read the whole rest of the last segment to check it
was zero. These tests use 256 MiB segments (preallocated, not written: no disk is filled) and
read what the kernel has mapped for the segment from /proc/self/smaps, so they fail if start-up
touches the tail, however fast the machine. The safety the check gave is tested too: garbage
past the end (a torn tail) is still zeroed, and a valid record far past a bad one is still
found (not a torn tail: the start is refused).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from store_helpers import Opener, bodies, message

from tidemq.errors import StoreError
from tidemq.protocol import record as rec
from tidemq.store import FileMessageStore
from tidemq.store.tools import verify
from tidemq.testing.resident import SMAPS, mapped_rss_by_file

pytestmark = pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux /proc/self/smaps")

SEGMENT = 256 * 1024 * 1024
RESIDENT = 4 * 1024 * 1024  # commitLogResidentBytes for these stores


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of `path` (smaps, per mapping)."""
    return mapped_rss_by_file().get(str(path), 0)


def open_big(opener: Opener, root: Path | None = None) -> FileMessageStore:
    return opener.open(root, commit_log_file_size=SEGMENT, commit_log_resident_bytes=RESIDENT)


def segment_path(store: FileMessageStore) -> Path:
    return store.config.root_dir / "commitlog" / f"{0:020d}"


def test_clean_restart_does_not_touch_the_segment_past_the_end(opener: Opener) -> None:
    store = open_big(opener)
    for i in range(2):
        assert store.put_message(message(i)).ok
    store.shutdown()
    again = open_big(opener, store.config.root_dir)
    assert again.last_recovery is not None
    assert again.last_recovery.records_scanned == 0  # from the checkpoint: nothing after it
    # Before the fix the zero check mapped all 256 MiB of the segment.
    assert mapped_rss(segment_path(again)) <= RESIDENT
    assert bodies(again) == [message(0).body, message(1).body]
    assert again.put_message(message(2)).ok


def record_at(i: int, queue_offset: int, physical_offset: int) -> bytes:
    """A valid record of `message(i)` claiming `physical_offset` (CRC and all)."""
    msg = message(i)
    return rec.encode_record(
        topic=msg.topic,
        queue_id=msg.queue_id,
        body=msg.body,
        flag=msg.flag,
        properties=msg.properties,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        store_timestamp=msg.born_timestamp,
        store_host=msg.store_host,
        reconsume_times=0,
        prepared_transaction_offset=0,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
    )


def _write_at(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def test_a_torn_tail_is_zeroed_without_reading_the_segment(opener: Opener) -> None:
    store = open_big(opener)
    for i in range(3):
        assert store.put_message(message(i)).ok
    crashed = opener.crash_copy(store, "crashed")
    end = store.max_physical_offset
    # A torn record after the last one: a length and garbage, no valid CRC (a kill -9 mid-copy).
    _write_at(crashed / "commitlog" / f"{0:020d}", end, b"\x00\x00\x01\x00" + b"\xab" * 200)
    again = open_big(opener, crashed)
    assert again.last_recovery is not None
    assert again.last_recovery.log_end_offset == end
    assert mapped_rss(segment_path(again)) <= RESIDENT
    assert again.read_raw(end, 64) == b""
    again.shutdown()
    opener.opened.remove(again)
    # The garbage is gone from the file, so the next scan and verify see a clean end.
    report = verify(crashed)
    assert report.ok, report.problems
    assert not report.trailing_garbage


def test_a_valid_record_far_past_a_bad_one_still_refuses_the_start(opener: Opener) -> None:
    """Kept safety (passes before and after the fix): out-of-order writeback after a power loss
    can leave the last record's page lost and a later page written; a valid record there means
    the bad one is not a torn tail, and the search for it must reach that far."""
    store = open_big(opener)
    for i in range(3):
        assert store.put_message(message(i)).ok
    crashed = opener.crash_copy(store, "crashed")
    last = store.get_messages("T", 0, 2, 1).records[0]
    last_offset = store.max_physical_offset - len(last)
    far = 100 * 1024 * 1024
    seg = crashed / "commitlog" / f"{0:020d}"
    _write_at(seg, last_offset, b"\xff" * 64)
    _write_at(seg, far, record_at(9, 3, far))
    with pytest.raises(StoreError, match=f"valid record follows it at offset {far}"):
        open_big(opener, crashed)


def test_verify_finds_garbage_far_past_the_end(opener: Opener) -> None:
    store = open_big(opener)
    assert store.put_message(message(0)).ok
    store.shutdown()
    root = store.config.root_dir
    _write_at(root / "commitlog" / f"{0:020d}", 200 * 1024 * 1024, b"\x01garbage")
    report = verify(root)
    assert report.trailing_garbage
    assert not report.ok


def test_a_crash_restart_scans_only_the_records_after_the_checkpoint(opener: Opener) -> None:
    store = open_big(opener)
    for i in range(50):
        assert store.put_message(message(i)).ok
    store.flush()  # the checkpoint: the 50 records are durable and dispatched
    for i in range(50, 53):
        assert store.put_message(message(i)).ok
    crashed = opener.crash_copy(store, "crashed")  # kill -9: abort marker, page cache content
    again = open_big(opener, crashed)
    assert again.last_recovery is not None
    assert not again.last_recovery.clean_stop
    assert again.last_recovery.records_scanned == 3  # not the 53 the segment holds
    assert bodies(again) == [message(i).body for i in range(53)]
