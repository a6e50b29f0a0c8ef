"""A controller-mode master shows no queue offset past its confirm offset: GET_MAX_OFFSET, the
bound of commits (UPDATE_CONSUMER_OFFSET and a pull's COMMIT_OFFSET), time searches and the
pull answers' max offset all name the visible end (handlers/offsets.py). Else a group started,
reset or committed past it would skip the records a failover writes at those offsets once the
unconfirmed ones are cut off. Through a real broker wired as app.py does in controller mode,
the confirm offset driven by hand; without a limit nothing changes and nothing extra is read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from broker_harness import Harness, running_broker
from test_pull_visibility import GatedHold, fields, gated_pull_handler, record_ends

from tidemq.broker import app as app_module
from tidemq.broker.handlers.offsets import OffsetHandlers
from tidemq.broker.visibility import VisibilityGate
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetMaxOffsetRequestHeader,
    PullSysFlag,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tidemq.store.consume_queue import ConsumeQueue

TOPIC = "TopicEnd"
COMMIT = PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET


@asynccontextmanager
async def gated_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Harness, VisibilityGate]]:
    """A broker whose pulls and offset handlers are limited by the gate's confirm offset."""
    gate: list[VisibilityGate] = []

    def gated_offsets(*args: Any, **kwargs: Any) -> OffsetHandlers:
        kwargs.pop("visible_end", None)  # the app's own (None outside controller mode)
        return OffsetHandlers(*args, **kwargs, visible_end=lambda: gate[0].visible_end())

    monkeypatch.setattr(app_module, "PullHoldService", GatedHold)
    monkeypatch.setattr(app_module, "PullHandler", gated_pull_handler)
    monkeypatch.setattr(app_module, "OffsetHandlers", gated_offsets)
    async with running_broker(tmp_path) as broker:
        hold = broker.app.pull_hold
        assert isinstance(hold, GatedHold)
        gate.append(hold.gate)
        yield broker, hold.gate


async def max_offset(broker: Harness) -> int:
    header = GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=0).to_fields()
    answer = await broker.call(RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=header))
    assert answer.code == ResponseCode.SUCCESS
    return int(answer.ext_fields["offset"])


async def search_offset(broker: Harness, timestamp: int) -> int:
    header = SearchOffsetRequestHeader(topic=TOPIC, queue_id=0, timestamp=timestamp).to_fields()
    code = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
    answer = await broker.call(RemotingCommand(code=code, ext_fields=header))
    assert answer.code == ResponseCode.SUCCESS
    return int(answer.ext_fields["offset"])


async def commit(broker: Harness, group: str, offset: int) -> None:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=TOPIC, queue_id=0, commit_offset=offset
    ).to_fields()
    code = RequestCode.UPDATE_CONSUMER_OFFSET
    answer = await broker.call(RemotingCommand(code=code, ext_fields=header))
    assert answer.code == ResponseCode.SUCCESS


async def committed(broker: Harness, group: str) -> int:
    header = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=TOPIC, queue_id=0)
    code = RequestCode.QUERY_CONSUMER_OFFSET
    answer = await broker.call(RemotingCommand(code=code, ext_fields=header.to_fields()))
    assert answer.code == ResponseCode.SUCCESS
    return int(answer.ext_fields["offset"])


async def send(broker: Harness, count: int) -> list[int]:
    for i in range(count):
        assert (await broker.send(TOPIC, b"m%d" % i)).code == ResponseCode.SUCCESS
    return record_ends(broker, TOPIC)


async def test_get_max_offset_counts_only_confirmed_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        ends = await send(broker, 5)
        assert await max_offset(broker) == 0  # nothing confirmed yet
        gate.advance(ends[2] + 10)  # mid-record 3
        assert await max_offset(broker) == 3
        gate.advance(ends[-1])
        assert await max_offset(broker) == 5


async def test_commits_past_the_visible_end_are_clamped_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        ends = await send(broker, 5)
        gate.advance(ends[1])
        await commit(broker, "CG_UPDATE", 5)
        assert await committed(broker, "CG_UPDATE") == 2
        await broker.pull(TOPIC, group="CG_PULL", sys_flag=COMMIT, commit_offset=4)
        assert await committed(broker, "CG_PULL") == 2
        await commit(broker, "CG_UPDATE", 1)  # below it: as it is
        assert await committed(broker, "CG_UPDATE") == 1
        gate.advance(ends[-1])
        await commit(broker, "CG_UPDATE", 10**15)
        assert await committed(broker, "CG_UPDATE") == 5


async def test_pull_answers_name_the_visible_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        ends = await send(broker, 5)
        gate.advance(ends[2])
        one = await broker.pull(TOPIC, max_msgs=1)  # stops at its count, not at the limit
        assert one.code == ResponseCode.SUCCESS
        assert (fields(one).next_begin_offset, fields(one).max_offset) == (1, 3)
        beyond = await broker.pull(TOPIC, offset=9)  # moved to the visible end
        assert beyond.code == ResponseCode.PULL_OFFSET_MOVED
        assert (fields(beyond).next_begin_offset, fields(beyond).max_offset) == (3, 3)
        refused = await broker.pull(TOPIC, sys_flag=0)  # no subscription: the error's fields
        assert refused.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
        assert fields(refused).max_offset == 3


async def test_a_time_search_stops_at_the_visible_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gated_broker(tmp_path, monkeypatch) as (broker, gate):
        ends = await send(broker, 5)
        gate.advance(ends[1])
        assert await search_offset(broker, 0) == 0
        assert await search_offset(broker, 2**62) == 2  # the last entry, 4, is not confirmed
        gate.advance(ends[-1])
        assert await search_offset(broker, 2**62) == 4


async def test_without_a_limit_nothing_changes_and_nothing_extra_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any) -> int:
        raise AssertionError("the visible end is computed without a limit")

    monkeypatch.setattr(ConsumeQueue, "max_offset_within", never)
    async with running_broker(tmp_path) as broker:
        await send(broker, 5)
        assert await max_offset(broker) == 5
        assert await search_offset(broker, 2**62) == 4
        await commit(broker, "CG_UPDATE", 10**15)
        assert await committed(broker, "CG_UPDATE") == 5
        await broker.pull(TOPIC, group="CG_PULL", sys_flag=COMMIT, commit_offset=10**12)
        assert await committed(broker, "CG_PULL") == 5
        one = await broker.pull(TOPIC, max_msgs=1)
        assert (fields(one).next_begin_offset, fields(one).max_offset) == (1, 5)
        beyond = await broker.pull(TOPIC, offset=9)
        assert (fields(beyond).next_begin_offset, fields(beyond).max_offset) == (5, 5)
