"""The epoch file: its order rules, atomic rewrites, and refusal of a malformed file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import StoreError
from tidemq.store.epochs import EPOCH_FILE_NAME, Epoch, EpochFile


def test_missing_file_is_an_empty_history(tmp_path: Path) -> None:
    epochs = EpochFile(tmp_path / "epochs")
    assert epochs.entries == ()
    assert epochs.last_epoch == 0
    assert not (tmp_path / "epochs").exists()  # loading writes nothing


def test_round_trip(tmp_path: Path) -> None:
    epochs = EpochFile.for_store(tmp_path)
    epochs.append(1, 0)
    epochs.append(2, 4096)
    epochs.append(5, 4096)  # an epoch that wrote nothing before the next one
    assert (tmp_path / EPOCH_FILE_NAME).read_text() == "1 0\n2 4096\n5 4096\n"
    again = EpochFile(tmp_path / EPOCH_FILE_NAME)
    assert again.entries == (Epoch(1, 0), Epoch(2, 4096), Epoch(5, 4096))
    assert again.entries == ((1, 0), (2, 4096), (5, 4096))  # plain tuples compare too
    assert again.last_epoch == 5
    assert not (tmp_path / "epochs.tmp").exists()


@pytest.mark.parametrize(
    ("epoch", "start", "why"),
    [
        (3, 200, "does not follow"),  # same epoch
        (2, 300, "does not follow"),  # older epoch
        (4, 199, "before epoch 3"),  # start going back
        (0, 0, "< 1"),
        (4, -1, "< 0"),
    ],
)
def test_append_refuses_out_of_order(tmp_path: Path, epoch: int, start: int, why: str) -> None:
    epochs = EpochFile(tmp_path / "epochs")
    epochs.append(3, 200)
    with pytest.raises(ValueError, match=why):
        epochs.append(epoch, start)
    assert epochs.entries == ((3, 200),)
    assert EpochFile(tmp_path / "epochs").entries == ((3, 200),)


def test_cut_after_keeps_the_entry_covering_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    path.write_text("1 0\n2 100\n3 100\n4 250\n")
    epochs = EpochFile(path)
    assert epochs.cut_after(250) == 0  # epoch 4 starts at the cut: kept, file untouched
    assert epochs.cut_after(249) == 1
    assert epochs.entries == ((1, 0), (2, 100), (3, 100))
    assert epochs.cut_after(100) == 0
    assert epochs.cut_after(99) == 2
    assert EpochFile(path).entries == ((1, 0),)
    assert path.read_text() == "1 0\n"
    assert EpochFile(path).last_epoch == 1


def test_cut_after_without_change_does_not_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    path.write_text("1 0\n")
    before = path.stat().st_ino
    assert EpochFile(path).cut_after(10) == 0
    assert path.stat().st_ino == before  # a rewrite renames a new inode in


def test_rewrite_replaces_the_file_and_ignores_a_stale_tmp(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    (tmp_path / "epochs.tmp").write_text("garbage left by a crash mid-write\n")
    epochs = EpochFile(path)
    assert epochs.entries == ()  # the tmp file is never read
    epochs.append(1, 0)
    inode = path.stat().st_ino
    epochs.append(2, 10)
    assert path.stat().st_ino != inode  # renamed over, not written in place
    assert path.read_text() == "1 0\n2 10\n"
    assert not (tmp_path / "epochs.tmp").exists()


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("1 0\n2 x\n", 2, "malformed"),
        ("1 0\n\n2 5\n", 2, "malformed"),
        ("1 0\n2  5\n", 2, "malformed"),
        ("1 0 7\n", 1, "malformed"),
        ("-1 0\n", 1, "malformed"),
        ("1 0\n2 5", None, None),  # no final newline: still fine
        ("2 5\n1 9\n", 2, "does not follow"),
        ("1 5\n2 4\n", 2, "before epoch 1"),
        ("0 0\n", 1, "< 1"),
    ],
)
def test_load_refuses_a_malformed_line_naming_file_and_line(
    tmp_path: Path, text: str, line: int | None, what: str | None
) -> None:
    path = tmp_path / "epochs"
    path.write_text(text)
    if line is None:
        assert EpochFile(path).entries == ((1, 0), (2, 5))
        return
    with pytest.raises(StoreError, match=f"{path} line {line} is .*{what}"):
        EpochFile(path)


def test_load_refuses_binary(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    path.write_bytes(b"1 0\n\xff\xfe\n")
    with pytest.raises(StoreError, match=str(path)):
        EpochFile(path)


_step = st.tuples(st.integers(-2, 5), st.integers(-50, 200))


@given(steps=st.lists(_step, max_size=30), cut=st.integers(-10, 3000))
def test_appends_keep_the_rules_and_survive_reload(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, int]], cut: int
) -> None:
    """Random appends (epoch delta, start delta): accepted exactly when the rules allow, the
    file reloads to the same history, and a cut keeps exactly the entries at or below it."""
    path = tmp_path_factory.mktemp("epochs") / "epochs"
    epochs = EpochFile(path)
    model: list[tuple[int, int]] = []
    for epoch_delta, start_delta in steps:
        last_epoch, last_start = model[-1] if model else (0, 0)
        epoch, start = last_epoch + epoch_delta, last_start + start_delta
        ok = epoch > last_epoch and epoch >= 1 and start >= 0 and (not model or start >= last_start)
        if ok:
            epochs.append(epoch, start)
            model.append((epoch, start))
        else:
            with pytest.raises(ValueError):
                epochs.append(epoch, start)
        assert epochs.entries == tuple(model)
    assert EpochFile(path).entries == tuple(model)
    epochs.cut_after(cut)
    kept = tuple(e for e in model if e[1] <= cut)
    assert epochs.entries == kept
    assert EpochFile(path).entries == kept
    assert EpochFile(path).last_epoch == (kept[-1][0] if kept else 0)
