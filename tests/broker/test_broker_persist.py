"""Config writes (persist.py): fsync off the event loop, coalesced, newest snapshot wins."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from tidemq.broker import persist
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.clock import FakeClock


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int]]:
    """Every write_atomic call as (path, thread id)."""
    seen: list[tuple[Path, int]] = []
    real = persist.write_atomic

    def recording(path: Path, data: bytes) -> None:
        seen.append((path, threading.get_ident()))
        real(path, data)

    monkeypatch.setattr(persist, "write_atomic", recording)
    return seen


async def test_group_changes_are_written_off_the_loop_and_coalesced(
    tmp_path: Path, writes: list[tuple[Path, int]]
) -> None:
    groups = SubscriptionGroupTable(tmp_path, FakeClock(), auto_create=True)
    for i in range(50):
        groups.find_or_create(f"G{i}")
    assert writes == []  # nothing written on the loop, inside the handler's call
    await groups.flush()
    assert 1 <= len(writes) <= 2
    assert all(thread != threading.get_ident() for _path, thread in writes)
    table = orjson.loads((tmp_path / "subscriptionGroup.json").read_bytes())
    assert len(table["subscriptionGroupTable"]) == 50


async def test_periodic_offsets_write_in_a_thread_and_shutdown_write_wins(
    tmp_path: Path, writes: list[tuple[Path, int]]
) -> None:
    offsets = ConsumerOffsetTable(tmp_path)
    offsets.commit("G", "T", 0, 5)
    assert offsets.persist_if_dirty()
    assert not offsets.dirty
    offsets.commit("G", "T", 0, 6)
    offsets.persist()  # shutdown: synchronous, supersedes the background snapshot
    assert writes[-1][1] == threading.get_ident()
    again = ConsumerOffsetTable(tmp_path)
    again.load()
    assert again.offsets("G", "T") == {0: 6}


def test_without_a_loop_writes_at_once(tmp_path: Path, writes: list[tuple[Path, int]]) -> None:
    groups = SubscriptionGroupTable(tmp_path, FakeClock(), auto_create=True)
    groups.find_or_create("G")
    assert len(writes) == 1
