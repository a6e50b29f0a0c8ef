"""Truncating a stopped store: the log, consume queues and epochs end at the cut, the records
below it are intact, new records land at the cut, and a kill at any step recovers the same."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_helpers import SEGMENT_BYTES, Opener, make_config, message

from tidemq.errors import StoreError
from tidemq.protocol.record import decode_record
from tidemq.store import FileMessageStore, PutResult
from tidemq.store.epochs import EpochFile
from tidemq.store.lock import StoreLockedError
from tidemq.store.truncate import STEPS, pending_truncation, redo_pending, truncate_store

KILL_SCRIPT = Path(__file__).with_name("truncate_kill.py")
QUEUES = (("T", 0), ("T", 1), ("U", 3))
N = 120  # records over the three queues: about six 4 KiB segments


@dataclass(frozen=True)
class Written:
    index: int
    topic: str
    queue_id: int
    result: PutResult
    record: bytes  # as read back before any cut (CRC-checked)


def _build(opener: Opener, name: str = "store") -> tuple[Path, list[Written]]:
    """A cleanly stopped store of N records over QUEUES, keyed, and a three-epoch history."""
    store = opener.open(opener.base / name)
    written: list[Written] = []
    for i in range(N):
        topic, queue_id = QUEUES[i % 3]
        result = store.put_message(message(i, topic=topic, queue_id=queue_id, keys=f"k{i}"))
        assert result.ok, result
        record = store.read_record(result.physical_offset)
        assert record is not None
        written.append(Written(i, topic, queue_id, result, record))
        if i == N // 2:
            store.flush()
    root = store.config.root_dir
    store.shutdown()
    epochs = EpochFile.for_store(root)
    for epoch, w in ((1, written[0]), (2, written[40]), (3, written[90])):
        epochs.append(epoch, w.result.physical_offset)
    return root, written


def _segments(root: Path) -> list[int]:
    return sorted(int(p.name) for p in (root / "commitlog").iterdir())


def _queue_records(store: FileMessageStore, topic: str, queue_id: int) -> list[bytes]:
    got = store.get_messages(topic, queue_id, 0, 1000, max_bytes=1 << 24)
    return list(got.records)


def _check_truncated(store: FileMessageStore, written: list[Written], cut: int) -> None:
    """The store ends at `cut`: everything below it as written, nothing at or past it."""
    kept = [w for w in written if w.result.physical_offset < cut]
    gone = [w for w in written if w.result.physical_offset >= cut]
    assert kept
    assert gone
    assert store.max_physical_offset == cut
    for w in kept:
        assert store.read_record(w.result.physical_offset) == w.record  # CRC-checked read
    for w in gone:
        assert store.read_record(w.result.physical_offset) is None
        assert store.query_by_key(w.topic, f"k{w.index}", 10, 0, 2**62) == []
    for topic, queue_id in QUEUES:
        mine = [w.record for w in kept if (w.topic, w.queue_id) == (topic, queue_id)]
        assert store.max_offset(topic, queue_id) == len(mine)
        assert _queue_records(store, topic, queue_id) == mine
    assert store.query_by_key("T", "k0", 10, 0, 2**62) == [kept[0].record]
    report = store.last_recovery
    assert report is not None
    assert not report.clean_stop  # recovery ran as after a crash
    assert report.log_end_offset == cut


def _check_appends_land_at_the_cut(store: FileMessageStore, written: list[Written]) -> None:
    cut = store.max_physical_offset
    topic, queue_id = "U", 3
    before = store.max_offset(topic, queue_id)
    result = store.put_message(message(999, topic=topic, queue_id=queue_id, keys="fresh"))
    assert result.ok, result
    assert result.queue_offset == before
    expected = cut
    if cut % SEGMENT_BYTES + result.size + 8 > SEGMENT_BYTES:
        expected = cut - cut % SEGMENT_BYTES + SEGMENT_BYTES  # rolled over after a marker
    assert result.physical_offset == expected
    record = store.read_record(result.physical_offset)
    assert record is not None
    assert decode_record(record, require_crc=True).queue_offset == before
    assert _queue_records(store, topic, queue_id)[-1] == record
    assert store.query_by_key(topic, "fresh", 10, 0, 2**62) == [record]


def _pick(written: list[Written], segment: int, nth: int) -> int:
    """The physical offset of the `nth` record of commit-log segment `segment` (not its first
    for nth > 0: a mid-segment cut)."""
    inside = [
        w.result.physical_offset
        for w in written
        if w.result.physical_offset // SEGMENT_BYTES == segment
    ]
    return inside[nth]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the lock, by relative path: what a refusal must not touch."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def _state(store: FileMessageStore) -> dict[str, object]:
    """What a started store serves and holds, to compare a killed truncation with a clean one."""
    root = store.config.root_dir
    return {
        "pending": pending_truncation(root),
        "end": store.max_physical_offset,
        "log": {p.name: p.read_bytes() for p in sorted((root / "commitlog").iterdir())},
        "queues": {
            q: (store.min_offset(*q), store.max_offset(*q), _queue_records(store, *q))
            for q in QUEUES
        },
        "epochs": EpochFile.for_store(root).entries,
    }


def _truncate(root: Path, offset: int) -> bool:
    return truncate_store(root, make_config(root), offset)


@pytest.mark.parametrize("from_end", [1, 2])
def test_truncate_mid_segment(opener: Opener, from_end: int) -> None:
    """In the last segment (below the checkpoint of the clean stop, in the same segment: the
    scan must not start there), and in the one before (the last is deleted)."""
    root, written = _build(opener)
    segments = _segments(root)
    assert len(segments) >= 5
    cut = _pick(written, len(segments) - from_end, 1)
    assert _truncate(root, cut)
    assert pending_truncation(root) is None
    assert _segments(root) == segments[: len(segments) - from_end + 1]
    epochs = [(1, written[0]), (2, written[40]), (3, written[90])]  # as _build appends them
    starts = [(e, w.result.physical_offset) for e, w in epochs]
    kept = tuple((e, start) for e, start in starts if start <= cut)
    assert EpochFile.for_store(root).entries == kept
    store = opener.open(root)
    _check_truncated(store, written, cut)
    _check_appends_land_at_the_cut(store, written)


def test_truncate_across_segments_keeps_only_the_first(opener: Opener) -> None:
    root, written = _build(opener)
    cut = _pick(written, 0, 5)
    assert _truncate(root, cut)
    assert _segments(root) == [0]
    assert EpochFile.for_store(root).entries == ((1, 0),)
    store = opener.open(root)
    _check_truncated(store, written, cut)
    _check_appends_land_at_the_cut(store, written)
    store.shutdown()
    again = opener.open(root)  # the appended record survives a clean restart
    assert again.max_physical_offset > cut
    assert again.last_recovery is not None
    assert again.last_recovery.clean_stop


def test_truncate_at_a_segment_start(opener: Opener) -> None:
    root, written = _build(opener)
    cut = 2 * SEGMENT_BYTES
    assert _pick(written, 2, 0) == cut
    assert _truncate(root, cut)
    assert _segments(root) == [0, SEGMENT_BYTES, cut]  # kept, empty
    store = opener.open(root)
    _check_truncated(store, written, cut)
    _check_appends_land_at_the_cut(store, written)


def test_truncate_at_a_blank_marker(opener: Opener) -> None:
    root, written = _build(opener)
    first_of_2 = next(i for i, w in enumerate(written) if w.result.physical_offset >= 2 * 4096)
    last_of_1 = written[first_of_2 - 1].result
    marker = last_of_1.physical_offset + last_of_1.size
    assert marker < 2 * SEGMENT_BYTES
    with pytest.raises(StoreError, match="past the blank marker"):
        _truncate(root, marker + 8)
    assert _truncate(root, marker)
    assert _segments(root) == [0, SEGMENT_BYTES]
    store = opener.open(root)
    _check_truncated(store, written, marker)
    _check_appends_land_at_the_cut(store, written)


def test_the_checkpoint_is_lowered_to_the_cut(opener: Opener) -> None:
    from tidemq.store.checkpoint import read_checkpoint

    root, written = _build(opener)
    before = read_checkpoint(root / "checkpoint")
    assert before is not None
    cut = _pick(written, 1, 2)
    assert before.logic_flushed_offset > cut
    assert _truncate(root, cut)
    after = read_checkpoint(root / "checkpoint")
    assert after == type(before)(cut, cut, before.timestamp_ms)


def test_refuses_offsets_that_are_no_record_boundary(opener: Opener) -> None:
    root, written = _build(opener)
    end = written[-1].result.physical_offset + written[-1].result.size
    tree = _tree(root)
    last_segment_end = _segments(root)[-1] + SEGMENT_BYTES
    refusals = {
        written[7].result.physical_offset + 1: "not a record boundary",
        written[7].result.physical_offset + written[7].result.size - 4: "not a record boundary",
        end + 100: "past the log end",
        last_segment_end: "past the log end",
        last_segment_end + 5000: "outside the commit log",
        -1: "outside the commit log",
    }
    for offset, why in refusals.items():
        with pytest.raises(StoreError, match=why):
            _truncate(root, offset)
    assert _tree(root) == tree  # nothing written, not even the marker or `abort`


def test_truncate_to_the_end_is_a_no_op(opener: Opener) -> None:
    root, written = _build(opener)
    end = written[-1].result.physical_offset + written[-1].result.size
    tree = _tree(root)
    assert not _truncate(root, end)
    assert _tree(root) == tree
    store = opener.open(root)
    assert store.max_physical_offset == end
    assert store.last_recovery is not None
    assert store.last_recovery.clean_stop


def test_refuses_a_running_store(opener: Opener) -> None:
    root, written = _build(opener)
    store = opener.open(root)
    with pytest.raises(StoreLockedError):
        _truncate(root, written[3].result.physical_offset)
    assert store.max_physical_offset == written[-1].result.physical_offset + written[-1].result.size


def test_truncate_a_crashed_store(opener: Opener) -> None:
    """A store killed (not stopped) before the cut: its checkpoint lags, recovery still ends at
    the cut and the records in between are kept."""
    store = opener.open(opener.base / "live")
    written: list[Written] = []
    for i in range(N):
        topic, queue_id = QUEUES[i % 3]
        result = store.put_message(message(i, topic=topic, queue_id=queue_id, keys=f"k{i}"))
        record = store.read_record(result.physical_offset)
        assert record is not None
        written.append(Written(i, topic, queue_id, result, record))
        if i == 20:
            store.flush()
    root = opener.crash_copy(store, "crashed")
    cut = _pick(written, 4, 1)
    assert cut > written[21].result.physical_offset  # above the checkpoint
    assert _truncate(root, cut)
    _check_truncated(opener.open(root), written, cut)


def _kill_at(root: Path, offset: int, step: str, mode: str = "truncate") -> None:
    args = [str(root), str(SEGMENT_BYTES), str(offset), step, mode]
    done = subprocess.run(
        [sys.executable, str(KILL_SCRIPT), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_any_step_recovers_as_the_clean_truncation(opener: Opener, step: str) -> None:
    base, written = _build(opener)
    clean = opener.base / "clean"
    killed = opener.base / "killed"
    shutil.copytree(base, clean)
    shutil.copytree(base, killed)
    cut = _pick(written, 1, 4)
    assert _truncate(clean, cut)
    _kill_at(killed, cut, step)
    if step != "done":
        assert pending_truncation(killed) == cut  # redone at start
    if step == "deleted":  # killed after the first of several deletions
        assert len(_segments(killed)) > len(_segments(clean)) + 1
    store = opener.open(killed)
    _check_truncated(store, written, cut)
    state = _state(store)
    assert state["pending"] is None
    assert state == _state(opener.open(clean))
    _check_appends_land_at_the_cut(store, written)


def test_a_kill_during_the_redo_is_finished_by_the_next_start(opener: Opener) -> None:
    base, written = _build(opener)
    clean = opener.base / "clean"
    killed = opener.base / "killed"
    shutil.copytree(base, clean)
    shutil.copytree(base, killed)
    cut = _pick(written, 1, 4)
    assert _truncate(clean, cut)
    _kill_at(killed, cut, "marked")
    _kill_at(killed, cut, "deleted", "redo")
    assert pending_truncation(killed) == cut
    store = opener.open(killed)
    _check_truncated(store, written, cut)
    assert _state(store) == _state(opener.open(clean))


def test_a_pending_truncation_blocks_another_offset(opener: Opener) -> None:
    root, written = _build(opener)
    cut = _pick(written, 1, 4)
    _kill_at(root, cut, "marked")
    with pytest.raises(StoreError, match=f"truncation to {cut} is pending"):
        _truncate(root, written[2].result.physical_offset)
    assert _truncate(root, cut)  # the same offset finishes it
    assert pending_truncation(root) is None
    assert redo_pending(root, make_config(root)) is None
    _check_truncated(opener.open(root), written, cut)


def test_a_malformed_marker_refuses_the_start(opener: Opener) -> None:
    root, _written = _build(opener)
    (root / "truncate").write_text("12x\n")
    with pytest.raises(StoreError, match=r"truncation marker .* is malformed"):
        opener.open(root)
