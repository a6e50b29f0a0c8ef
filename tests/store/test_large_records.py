"""Records of large bodies (issue 18): written part by part through the descriptor (append.py's
LARGE_RECORD_BYTES path) and with the whole-record CRC combined from BODYCRC (protocol/crc.py),
they must be the same bytes the joined path writes, read back and survive a restart (the
recovery scan checks every CRC)."""

from __future__ import annotations

import os

import pytest
from store_helpers import Opener, message, stored_as

from tidemq.store import append

MIB = 1024 * 1024


def _mixed() -> list[bytes]:
    """Bodies on both sides of the thresholds, in one run (small between large)."""
    big = append.LARGE_RECORD_BYTES
    return [os.urandom(n) for n in (MIB, 10, big, big - 1, 300, MIB // 2 + 7)]


def test_large_and_small_records_read_back_and_survive_a_restart(opener: Opener) -> None:
    root = opener.base / "large"
    store = opener.open(root, commit_log_file_size=8 * MIB)
    msgs = [message(i, body=body) for i, body in enumerate(_mixed())]
    results = store.put_each(msgs)
    assert all(r.ok for r in results)
    for i, (msg, result) in enumerate(zip(msgs, results, strict=True)):
        record = store.read_record(result.physical_offset)
        assert record is not None
        stored_as(record, msg, result, i)
    # Each put alone: a run of one record, large ones through the descriptor only.
    for msg in msgs:
        assert store.put_message(msg).ok
    store.shutdown()
    opener.opened.remove(store)
    reopened = opener.open(root, commit_log_file_size=8 * MIB)
    got = reopened.get_messages("T", 0, 0, 32)
    assert len(got.records) == 2 * len(msgs)
    for i, (msg, result) in enumerate(zip(msgs, results, strict=True)):
        stored_as(got.records[i], msg, result, i)


def test_large_records_are_the_bytes_the_joined_path_writes(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    msgs = [message(i, body=body) for i, body in enumerate(_mixed())]
    large = opener.open(opener.base / "parts", commit_log_file_size=8 * MIB)
    large.put_each(msgs)
    monkeypatch.setattr(append, "LARGE_RECORD_BYTES", 1 << 62)  # every run joined
    joined = opener.open(opener.base / "joined", commit_log_file_size=8 * MIB)
    joined.put_each(msgs)
    a = large.get_messages("T", 0, 0, 32).records
    b = joined.get_messages("T", 0, 0, 32).records
    assert len(a) == len(msgs)
    # Same store timestamps (the opener's fake clock), same offsets: the same bytes.
    assert a == b
