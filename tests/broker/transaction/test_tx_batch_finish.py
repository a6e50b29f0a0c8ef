"""batch_finish.py over a real store: one finisher per batch, its decision read once.

Covers: two END_BATCH requests of one batch arriving while its halves are being resolved chunk
by chunk both answer after every committed message of the batch is stored and with the full
counts (durability asked for the whole batch); a request of another decision waits for the
running one; the batch's decision is not read back from disk between chunks when its sink left
the index's LRU meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_tx_batch import COMMIT, ROLLBACK, SINK, Sink
from tx_harness import World

from tidemq.broker.transaction import batch_finish
from tidemq.clock import FakeClock
from tidemq.protocol.codes import ResponseCode

HALVES = 100


@pytest.fixture
def sink(tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    monkeypatch.setattr(batch_finish, "FINISH_CHUNK_MAX", 16)
    monkeypatch.setattr(batch_finish, "FINISH_TURN_BUDGET_S", 0.0)  # a chunk per turn
    world = World(tmp_path, clock)
    yield Sink(world)
    world.close()


def _halves(sink: Sink, batch: int = 0) -> list[str]:
    for index in range(HALVES):
        sink.half(batch, f"{index % 5}/0", body=f"row-{index}".encode())
    sink.half(batch, "9/9")  # not listed: rolled back
    return [f"{p}/0" for p in range(5)]


class Durability:
    """Answers SUCCESS, noting the log end each answer waited for and what was stored then."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.waits: list[tuple[int, int]] = []  # (end asked, real messages stored)

    async def __call__(self, end: int) -> tuple[int, str]:
        self.waits.append((end, len(self.sink.visible())))
        return ResponseCode.SUCCESS, ""


async def _until(predicate: Any) -> None:
    """Turn by turn until `predicate()` (a finisher does a chunk per turn here)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def _stored_end(sink: Sink) -> int:
    return max(m.physical_offset + m.total_size for m in sink.world.real_messages())


async def test_a_repeat_during_the_finish_awaits_it_and_answers_every_count(sink: Sink) -> None:
    txns = _halves(sink)
    durable = Durability(sink)
    first = asyncio.ensure_future(sink.end(0, COMMIT, txns, durable=durable))
    await _until(lambda: len(sink.visible()) > 0)
    assert len(sink.visible()) < HALVES  # the first is mid-way
    repeat = asyncio.ensure_future(sink.end(0, COMMIT, txns, durable=durable))
    answers = await asyncio.gather(first, repeat)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2
    counts = [(a.ext_fields["committed"], a.ext_fields["rolledBack"]) for a in answers]
    assert counts == [(str(HALVES), "1")] * 2
    assert [a.ext_fields["alreadyCommitted"] for a in answers] == ["false", "true"]
    assert len(durable.waits) == 2
    for end, stored in durable.waits:
        assert stored == HALVES  # answered only once every committed message was stored
        assert end >= _stored_end(sink)  # and durability asked for all of them
    assert sink.visible() == sorted(f"row-{index}".encode() for index in range(HALVES))
    assert sink.world.ledger.in_flight == 0
    assert len(sink.records()) == 1


async def test_another_decision_waits_for_the_running_finish(sink: Sink) -> None:
    """A ROLLBACK runs; the final ROLLBACK of the batch (another decision: it closes the batch)
    arrives meanwhile: it starts once the first is done, so the counts do not split, and its
    durability covers the first's op messages too."""
    _halves(sink)
    durable, durable_closing = Durability(sink), Durability(sink)
    first = asyncio.ensure_future(sink.end(0, ROLLBACK, [], durable=durable))
    await _until(lambda: sink.world.ledger.in_flight < HALVES + 1)
    assert sink.world.ledger.in_flight > 0  # the first is mid-way
    closing = asyncio.ensure_future(sink.end(0, ROLLBACK, [], durable=durable_closing, final=True))
    rolled, closed = await asyncio.gather(first, closing)
    assert (rolled.code, closed.code) == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert (rolled.ext_fields["rolledBack"], closed.ext_fields["rolledBack"]) == (
        str(HALVES + 1),
        "0",
    )
    assert durable_closing.waits[0][0] >= durable.waits[0][0]
    assert [r.final for r in sink.records()] == [False, True]
    assert sink.world.ledger.in_flight == 0
    assert sink.visible() == []


async def test_the_decision_is_read_once_not_from_disk_between_chunks(
    sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    txns = _halves(sink)
    index = sink.batches.index
    monkeypatch.setattr(index, "sinks_max", 1)
    store = sink.batches.store
    reads: list[str] = []
    real_query = store.query_by_key

    def counted(topic: str, key: str, *args: Any) -> Any:
        reads.append(key)
        return real_query(topic, key, *args)

    monkeypatch.setattr(store, "query_by_key", counted)
    evicting = True

    async def evict() -> None:  # another sink's records push this one out, turn after turn
        while evicting:
            index.restore("other-sink", [])
            await asyncio.sleep(0)

    task = asyncio.create_task(evict())
    try:
        index.restore("other-sink", [])
        answer = await sink.end(0, COMMIT, txns)
    finally:
        evicting = False
        await task
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert answer.ext_fields["committed"] == str(HALVES)
    assert reads == [SINK]  # once, by the request's record; never per chunk
