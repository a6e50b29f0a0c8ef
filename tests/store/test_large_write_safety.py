"""Crash safety of the large-record write path (append.py's LARGE_RECORD_BYTES path): a run is
written part by part with pwrite, which releases the GIL, so the flush thread may read the
segment's `wrote` at any moment. `wrote` must only ever cover whole records (a flushed offset
inside a record reads as damage below the flushed offset to recovery), and a failed part must
leave neither `wrote` nor the bytes after it inside a torn record."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from store_helpers import Opener, message, stored_as

from tidemq.store import mapped_file as mfmod

MIB = 1024 * 1024


def test_wrote_moves_once_past_whole_records(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener.open(commit_log_file_size=8 * MIB)
    assert store.put_message(message(0)).ok  # the segment exists
    segment = store._log.files.files[-1]
    before = segment.wrote
    seen: list[int] = []
    real = mfmod._pwrite_all

    def watching(fd: int, data: bytes | memoryview, pos: int) -> None:
        seen.append(segment.wrote)  # what a flush thread would read meanwhile
        real(fd, data, pos)

    monkeypatch.setattr(mfmod, "_pwrite_all", watching)
    body = os.urandom(MIB)
    results = store.put_each([message(1, body=body), message(2, body=b"x" * 100)])
    assert all(r.ok for r in results)
    assert len(seen) >= 2  # the body and the parts around it: separate writes
    assert set(seen) == {before}
    assert segment.wrote == results[-1].physical_offset + results[-1].size


def test_a_failed_part_leaves_wrote_and_the_tail_clean(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = opener.base / "eio"
    store = opener.open(root, commit_log_file_size=8 * MIB)
    first = message(0)
    assert store.put_message(first).ok
    segment = store._log.files.files[-1]
    end = segment.wrote
    real = mfmod._pwrite_all
    calls = 0

    def failing_second(fd: int, data: bytes | memoryview, pos: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            real(fd, bytes(data)[: len(data) // 2], pos)  # torn, then the error
            raise OSError(errno.EIO, "injected")
        real(fd, data, pos)

    monkeypatch.setattr(mfmod, "_pwrite_all", failing_second)
    big = message(1, body=os.urandom(MIB))
    failed = store.put_message(big)
    assert not failed.ok
    assert "injected" in failed.error
    assert segment.wrote == end  # nothing published
    assert store.max_physical_offset == end
    assert os.pread(segment._fd, 2 * MIB, end) == bytes(2 * MIB)  # the torn bytes zeroed
    monkeypatch.undo()
    # The next put lands where the failed one would have, and a crash now recovers cleanly.
    small = message(2, body=b"after" * 10)
    retried = store.put_message(small)
    assert retried.ok
    assert retried.physical_offset == end
    store.flush()
    crashed = opener.crash_copy(store, "crashed")
    reopened = opener.open(crashed, commit_log_file_size=8 * MIB)
    report = reopened.last_recovery
    assert report is not None
    assert not report.clean_stop
    assert report.log_end_offset == retried.physical_offset + retried.size
    got = reopened.get_messages("T", 0, 0, 8).records
    assert len(got) == 2
    stored_as(got[1], small, retried, 1)


def test_an_append_past_the_segment_is_refused_before_writing(tmp_path: Path) -> None:
    mf = mfmod.MappedFile.create(tmp_path / mfmod.segment_name(0), 0, 4096)
    try:
        with pytest.raises(ValueError, match="past size"):
            mf.append_parts_written([b"a" * 4000, b"b" * 200])
        assert mf.wrote == 0
        assert os.pread(mf._fd, 4096, 0) == bytes(4096)
    finally:
        mf.close()
