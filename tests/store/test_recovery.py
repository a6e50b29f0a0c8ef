"""Crash and recovery: the log keeps a valid prefix and never serves a record failing its CRC."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from store_helpers import SEGMENT_BYTES, Opener, bodies, fill, message

from tidemq.errors import StoreError
from tidemq.protocol.record import decode_record
from tidemq.store import CorruptPolicy, GetStatus
from tidemq.store.tools import verify

N = 40  # records: several segments of 4 KiB, several 16-entry CQ files


def _segment_of(root: Path, physical_offset: int) -> tuple[Path, int]:
    start = physical_offset - physical_offset % SEGMENT_BYTES
    return root / "commitlog" / f"{start:020d}", physical_offset - start


def _damage(
    root: Path, physical_offset: int, *, zero_from: int | None = None, flip: int | None = None
) -> None:
    path, pos = _segment_of(root, physical_offset)
    data = bytearray(path.read_bytes())
    if zero_from is not None:
        data[pos + zero_from :] = bytes(len(data) - pos - zero_from)
    if flip is not None:
        data[pos + flip // 8] ^= 1 << (flip % 8)
    path.write_bytes(bytes(data))


def test_clean_restart_recovers_everything(opener: Opener) -> None:
    store = opener.open()
    fill(store, N)
    fill(store, 7, topic="U", queue_id=3, keys="k")
    store.shutdown()
    again = opener.open(store.config.root_dir)
    report = again.last_recovery
    assert report is not None
    assert report.clean_stop
    assert not report.full_rebuild
    assert report.scan_start_offset > 0  # only the last segment was scanned
    assert bodies(again) == [message(i).body for i in range(N)]
    assert len(bodies(again, "U", 3)) == 7
    assert len(again.query_by_key("U", "k", 100, 0, 10**15)) == 7
    assert again.put_message(message(N)).queue_offset == N


def test_kill9_recovers_all_acknowledged_records(opener: Opener) -> None:
    store = opener.open()
    fill(store, N)
    store.flush()  # a checkpoint in the middle of the run
    fill(store, 10, keys="late")
    crashed = opener.crash_copy(store, "crashed")
    again = opener.open(crashed)
    assert again.last_recovery is not None
    assert not again.last_recovery.clean_stop
    assert len(bodies(again)) == N + 10
    assert len(again.query_by_key("T", "late", 100, 0, 10**15)) == 10
    assert again.put_message(message(99)).queue_offset == N + 10


@pytest.fixture
def crashed_base(opener: Opener) -> tuple[Path, int, int]:
    """A crashed directory with N records; returns (dir, last record offset, its size)."""
    store = opener.open()
    offsets = fill(store, N)
    last = store.read_record(offsets[-1])
    assert last is not None
    return opener.crash_copy(store, "base"), offsets[-1], len(last)


def test_truncation_at_every_byte_of_last_record_keeps_the_prefix(
    opener: Opener, crashed_base: tuple[Path, int, int]
) -> None:
    base, last_offset, last_size = crashed_base
    expected = [message(i).body for i in range(N - 1)]
    for cut in range(last_size):
        target = opener.base / f"cut{cut}"
        shutil.copytree(base, target)
        _damage(target, last_offset, zero_from=cut)
        store = opener.open(target)
        assert store.last_recovery is not None
        assert store.last_recovery.log_end_offset == last_offset, cut
        assert bodies(store) == expected, cut
        assert store.read_record(last_offset) is None
        result = store.put_message(message(500))
        assert (result.queue_offset, result.physical_offset) == (N - 1, last_offset)
        store.shutdown()
        opener.opened.remove(store)
        shutil.rmtree(target)


def test_flipped_bit_in_last_record_drops_it(
    opener: Opener, crashed_base: tuple[Path, int, int]
) -> None:
    base, last_offset, last_size = crashed_base
    for byte in range(last_size):
        target = opener.base / f"flip{byte}"
        shutil.copytree(base, target)
        _damage(target, last_offset, flip=byte * 8 + byte % 8)
        store = opener.open(target)
        assert store.max_offset("T", 0) == N - 1, byte
        got = store.get_messages("T", 0, N - 2, 32)
        assert len(got.records) == 1
        assert decode_record(got.records[0]).body == message(N - 2).body
        store.shutdown()
        opener.opened.remove(store)
        shutil.rmtree(target)


def _middle_victim(opener: Opener, base: Path) -> int:
    probe = opener.open(base)
    victim = probe.get_messages("T", 0, 5, 1).records[0]
    probe.shutdown()
    opener.opened.remove(probe)
    return decode_record(victim).physical_offset


def test_flipped_bit_in_middle_record_refuses_to_start(
    opener: Opener, crashed_base: tuple[Path, int, int]
) -> None:
    base, _last_offset, _size = crashed_base
    victim_offset = _middle_victim(opener, base)
    (base / "checkpoint").unlink()  # force the scan through the whole log
    (base / "abort").touch()
    _damage(base, victim_offset, flip=100 * 8 + 3)  # a body byte
    before = sorted(p.name for p in (base / "commitlog").iterdir())
    with pytest.raises(StoreError, match=rf"corrupt at offset {victim_offset}.*store verify"):
        opener.open(base)
    # Nothing was cut or deleted.
    assert sorted(p.name for p in (base / "commitlog").iterdir()) == before
    assert not verify(base).ok


def test_flipped_bit_in_middle_record_quarantines_with_the_policy(
    opener: Opener, crashed_base: tuple[Path, int, int]
) -> None:
    base, _last_offset, _size = crashed_base
    victim_offset = _middle_victim(opener, base)
    (base / "checkpoint").unlink()
    (base / "abort").touch()
    _damage(base, victim_offset, flip=100 * 8 + 3)
    segments = {p.name: p.read_bytes() for p in (base / "commitlog").iterdir()}
    store = opener.open(base, corrupt_policy=CorruptPolicy.QUARANTINE)
    assert store.last_recovery is not None
    assert store.last_recovery.log_end_offset == victim_offset
    assert bodies(store) == [message(i).body for i in range(5)]
    assert store.max_physical_offset == victim_offset
    assert len(list((base / "commitlog").iterdir())) == 1 + victim_offset // SEGMENT_BYTES
    # Every affected segment survives byte for byte in quarantine/.
    quarantined = {p.name: p.read_bytes() for p in (base / "quarantine").iterdir()}
    damaged = victim_offset - victim_offset % SEGMENT_BYTES
    assert quarantined == {n: b for n, b in segments.items() if int(n) >= damaged}
    store.shutdown()
    opener.opened.remove(store)
    assert verify(base).ok


def test_flipped_bit_after_clean_stop_is_never_served(opener: Opener) -> None:
    """A restart after a clean stop scans from the checkpoint (issue 11 item 4: it costs the
    records after it, not the last segment's), so bit rot in durable records is not looked for
    at start, in the last segment as in any other. It is caught where it matters: every read
    checks the CRC (the record is not served) and `tidemq store verify` reports it."""
    store = opener.open()
    offsets = fill(store, N)
    store.shutdown()
    root = store.config.root_dir
    victim = next(o for o in offsets if o >= offsets[-1] - offsets[-1] % SEGMENT_BYTES)
    _damage(root, victim, flip=90 * 8 + 1)
    again = opener.open(root)
    damaged = offsets.index(victim)
    assert bodies(again) == [message(i).body for i in range(N) if i != damaged]
    assert not verify(root).ok


def test_bad_record_followed_by_a_valid_one_is_not_a_torn_tail(
    opener: Opener, crashed_base: tuple[Path, int, int]
) -> None:
    base, last_offset, _size = crashed_base
    # The one before the last: beyond the flushed offset, but a valid record follows.
    checkpoint = (base / "checkpoint").read_bytes()
    probe = opener.open(base)
    before_last = decode_record(probe.get_messages("T", 0, N - 2, 1).records[0]).physical_offset
    probe.shutdown()
    opener.opened.remove(probe)
    (base / "checkpoint").write_bytes(checkpoint)  # as the crash left it
    (base / "abort").touch()
    assert before_last // SEGMENT_BYTES == last_offset // SEGMENT_BYTES
    _damage(base, before_last, flip=70 * 8)
    with pytest.raises(StoreError, match=f"valid record follows it at offset {last_offset}"):
        opener.open(base)


def test_corrupt_record_in_old_segment_is_never_served_after_clean_stop(opener: Opener) -> None:
    store = opener.open()
    offsets = fill(store, N)
    store.shutdown()
    root = store.config.root_dir
    _damage(root, offsets[3], flip=95 * 8)
    assert not verify(root).ok
    again = opener.open(root)
    got = again.get_messages("T", 0, 0, 32)
    served = [decode_record(r).body for r in got.records]
    assert message(3).body not in served
    assert served[:3] == [message(i).body for i in range(3)]
    assert again.read_record(offsets[3]) is None


def test_lost_checkpoint_rebuilds_queues(opener: Opener) -> None:
    store = opener.open()
    fill(store, N, keys="kk")
    store.shutdown()
    root = store.config.root_dir
    (root / "checkpoint").unlink()
    shutil.rmtree(root / "index")
    for cq_file in (root / "consumequeue" / "T" / "0").iterdir():
        cq_file.write_bytes(bytes(cq_file.stat().st_size))  # zeroed, not deleted
    again = opener.open(root)
    assert again.last_recovery is not None
    assert again.last_recovery.full_rebuild
    assert bodies(again) == [message(i).body for i in range(N)]
    assert len(again.query_by_key("T", "kk", 100, 0, 10**15)) == N


def test_lost_consume_queue_directory_is_rebuilt(opener: Opener) -> None:
    store = opener.open()
    fill(store, N)
    fill(store, 5, topic="V", queue_id=2)
    store.shutdown()
    root = store.config.root_dir
    shutil.rmtree(root / "consumequeue")
    again = opener.open(root)
    assert bodies(again) == [message(i).body for i in range(N)]
    assert again.max_offset("V", 2) == 5


def test_lost_single_queue_triggers_full_rebuild(opener: Opener) -> None:
    store = opener.open()
    fill(store, N)
    fill(store, 3, topic="V")
    store.shutdown()
    root = store.config.root_dir
    shutil.rmtree(root / "consumequeue" / "T")
    again = opener.open(root)
    assert again.last_recovery is not None
    assert again.last_recovery.full_rebuild
    assert bodies(again) == [message(i).body for i in range(N)]


def test_consume_queue_entries_beyond_log_end_are_dropped(opener: Opener) -> None:
    store = opener.open()
    offsets = fill(store, N)
    crashed = opener.crash_copy(store, "crashed")
    # The log loses its last 3 records (e.g. power loss) but the CQ kept their entries.
    _damage(crashed, offsets[-3], zero_from=0)
    again = opener.open(crashed)
    assert again.max_offset("T", 0) == N - 3
    assert again.last_recovery is not None
    assert again.last_recovery.consume_queue_entries_dropped == 3
    assert again.get_messages("T", 0, N - 3, 1).status is GetStatus.OFFSET_OVERFLOW_ONE


def test_damaged_checkpoint_counts_as_lost(opener: Opener) -> None:
    store = opener.open()
    fill(store, 10)
    store.shutdown()
    root = store.config.root_dir
    data = bytearray((root / "checkpoint").read_bytes())
    data[10] ^= 0xFF
    (root / "checkpoint").write_bytes(bytes(data))
    again = opener.open(root)
    assert again.last_recovery is not None
    assert again.last_recovery.full_rebuild
    assert len(bodies(again)) == 10


def test_later_segments_after_a_hole_are_deleted(opener: Opener) -> None:
    store = opener.open()
    offsets = fill(store, N)
    crashed = opener.crash_copy(store, "crashed")
    # Zero a whole middle segment's tail: records after it in later segments must go.
    first_in_seg1 = next(o for o in offsets if o >= SEGMENT_BYTES)
    _damage(crashed, first_in_seg1, zero_from=0)
    again = opener.open(crashed)
    assert again.max_physical_offset == first_in_seg1
    assert len(list((crashed / "commitlog").iterdir())) == 2
    assert bodies(again) == [message(i).body for i in range(offsets.index(first_in_seg1))]
