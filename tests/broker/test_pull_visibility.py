"""A controller-mode master serves pulls only up to its confirm offset (store/get.py phys_limit,
PullHandler visible_end) and wakes held pulls when the confirm offset passes their records
(broker/visibility.py). Here through a real broker with the wiring app.py does in controller
mode, the confirm offset driven by hand; without a limit nothing changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from broker_harness import Harness, eventually, messages, running_broker

from tidemq.broker import app as app_module
from tidemq.broker.handlers.pull import PullHandler
from tidemq.broker.pull_hold import PullHoldService
from tidemq.broker.visibility import VisibilityGate
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import PullMessageResponseHeader, PullSysFlag
from tidemq.protocol.record import physical_offset_at
from tidemq.store.types import DispatchEvent, GetStatus

HOLD = PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND


class GatedHold(PullHoldService):
    """The pull hold as a controller-mode master wires it: the store's dispatch notifications
    reach it through the gate."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = VisibilityGate(super().on_dispatch, super().wants_topic, limited=True)

    def on_dispatch(self, event: DispatchEvent) -> None:
        self.gate.on_dispatch(event)

    def wants_topic(self, topic: str) -> bool:
        return self.gate.wants_topic(topic)


def gated_pull_handler(*args: Any, **kwargs: Any) -> PullHandler:
    hold = kwargs.get("hold", args[-1])
    assert isinstance(hold, GatedHold)
    kwargs.pop("visible_end", None)  # the app's own (None outside controller mode)
    return PullHandler(*args, **kwargs, visible_end=hold.gate.visible_end)


@asynccontextmanager
async def gated_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Harness, VisibilityGate]]:
    monkeypatch.setattr(app_module, "PullHoldService", GatedHold)
    monkeypatch.setattr(app_module, "PullHandler", gated_pull_handler)
    async with running_broker(tmp_path) as broker:
        hold = broker.app.pull_hold
        assert isinstance(hold, GatedHold)
        yield broker, hold.gate


def record_ends(broker: Harness, topic: str) -> list[int]:
    """Each stored record's end offset in the log, in queue order (read without a limit)."""
    result = broker.app.store.get_messages(topic, 0, 0, 32)
    return [physical_offset_at(record) + len(record) for record in result.records]


def fields(answer: Any) -> PullMessageResponseHeader:
    return PullMessageResponseHeader.from_fields(answer.ext_fields)


async def test_records_past_the_visible_end_are_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        for i in range(5):
            assert (await broker.send("TopicVis", b"m%d" % i)).code == ResponseCode.SUCCESS
        ends = record_ends(broker, "TopicVis")
        nothing = await broker.pull("TopicVis")
        assert nothing.code == ResponseCode.PULL_NOT_FOUND
        header = fields(nothing)
        assert (header.next_begin_offset, header.max_offset) == (0, 0)  # the consumer stays
        gate.advance(ends[2] + 10)  # mid-record 3: records 0..2 whole below it
        some = await broker.pull("TopicVis")
        assert some.code == ResponseCode.SUCCESS
        assert [m.body for m in messages(some)] == [b"m0", b"m1", b"m2"]
        assert (fields(some).next_begin_offset, fields(some).max_offset) == (3, 3)
        at_limit = await broker.pull("TopicVis", offset=3)
        assert at_limit.code == ResponseCode.PULL_NOT_FOUND
        assert fields(at_limit).next_begin_offset == 3
        gate.advance(ends[-1])
        rest = await broker.pull("TopicVis", offset=3)
        assert [m.body for m in messages(rest)] == [b"m3", b"m4"]
        assert fields(rest).max_offset == 5


@pytest.mark.parametrize("sent_first", [True, False])
async def test_a_held_pull_wakes_when_the_limit_covers_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent_first: bool
) -> None:
    """Sent before the pull: the record's event waits in the gate, though no pull was held at
    its dispatch. Sent after: the pull is held at the queue's end as usual."""
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        assert (await broker.send("TopicWake", b"first")).code == ResponseCode.SUCCESS
        gate.advance(record_ends(broker, "TopicWake")[0])
        if sent_first:
            assert (await broker.send("TopicWake", b"second")).code == ResponseCode.SUCCESS
        pull = asyncio.ensure_future(
            broker.pull("TopicWake", offset=1, sys_flag=HOLD, suspend_ms=20_000, timeout_ms=30_000)
        )
        await eventually(lambda: broker.app.pull_hold.held_count == 1)
        if not sent_first:
            assert (await broker.send("TopicWake", b"second")).code == ResponseCode.SUCCESS
        end = record_ends(broker, "TopicWake")[1]
        assert gate.pending == 1
        gate.advance(end - 1)  # not the whole record: still held back
        assert gate.pending == 1
        assert not pull.done()
        gate.advance(end)
        assert gate.pending == 0
        answer = await asyncio.wait_for(pull, 5)  # woken, not at its 20 s timeout
        assert answer.code == ResponseCode.SUCCESS
        assert [m.body for m in messages(answer)] == [b"second"]


async def test_without_a_limit_the_broker_serves_everything(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        for i in range(3):
            assert (await broker.send("TopicFree", b"m%d" % i)).code == ResponseCode.SUCCESS
        answer = await broker.pull("TopicFree")
        assert [m.body for m in messages(answer)] == [b"m0", b"m1", b"m2"]


async def test_the_store_get_stops_at_the_limit(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        for i in range(4):
            assert (await broker.send("TopicGet", b"m%d" % i)).code == ResponseCode.SUCCESS
        store = broker.app.store
        ends = record_ends(broker, "TopicGet")
        whole = store.get_messages("TopicGet", 0, 0, 32)
        assert store.get_messages("TopicGet", 0, 0, 32, phys_limit=None) == whole
        assert store.get_messages("TopicGet", 0, 0, 32, phys_limit=ends[-1]) == whole
        cut = store.get_messages("TopicGet", 0, 1, 32, phys_limit=ends[2])
        assert (cut.status, len(cut.records), cut.next_begin_offset) == (GetStatus.FOUND, 2, 3)
        assert (cut.min_offset, cut.max_offset) == (0, 3)
        # Visible entries none of which match, then a hidden one: retry at the hidden one.
        unmatched = store.get_messages(
            "TopicGet", 0, 0, 32, tag_codes=frozenset(), phys_limit=ends[1]
        )
        assert (unmatched.status, unmatched.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 2)
        first = store.get_messages("TopicGet", 0, 2, 32, phys_limit=ends[1])
        assert first.status == GetStatus.OFFSET_OVERFLOW_ONE
        assert (first.records, first.next_begin_offset, first.max_offset) == ([], 2, 2)


def _event(topic: str, physical_offset: int, size: int) -> DispatchEvent:
    return DispatchEvent(topic, 0, 0, physical_offset, size, 0, 0, {})


def test_an_unlimited_gate_passes_everything_through() -> None:
    got: list[DispatchEvent] = []
    gate = VisibilityGate(got.append, lambda topic: topic == "held", limited=False)
    event = _event("T", 0, 100)
    gate.on_dispatch(event)
    assert got == [event]
    assert gate.wants_topic("held")
    assert not gate.wants_topic("other")


def test_a_limited_gate_delivers_in_order_as_the_limit_advances() -> None:
    got: list[int] = []
    gate = VisibilityGate(lambda e: got.append(e.physical_offset), lambda t: False, limited=True)
    assert gate.wants_topic("any")  # module doc: a later pull needs the event
    for offset in (0, 100, 200):
        gate.on_dispatch(_event("T", offset, 100))
    gate.advance(150)
    assert got == [0]
    gate.advance(100)  # never back
    gate.advance(300)
    assert got == [0, 100, 200]
    gate.on_dispatch(_event("T", 250, 50))  # already covered: at once
    assert got[-1] == 250
