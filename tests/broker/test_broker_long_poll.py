"""Long polling: a held pull is woken by a matching send, times out otherwise, never blocks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from broker_harness import Harness, eventually, messages, running_broker

from tidemq.broker.pull_hold import PULL_SUSPEND_MS_MAX, PullHoldService
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import PullSysFlag
from tidemq.remoting.client import RemotingClient
from tidemq.store.types import DispatchEvent

HOLD = PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND


async def _wait_held(broker: Harness) -> None:
    await eventually(lambda: broker.app.pull_hold.held_count > 0)


async def test_held_pull_is_woken_by_a_send(broker: Harness) -> None:
    await broker.send("TopicL", b"first")
    pull = asyncio.create_task(
        broker.pull("TopicL", offset=1, sys_flag=HOLD, suspend_ms=20_000, timeout_ms=30_000)
    )
    await _wait_held(broker)
    assert not pull.done()
    # The same connection keeps serving while the pull is held.
    assert (await broker.send("TopicL", b"second")).code == ResponseCode.SUCCESS
    response = await asyncio.wait_for(pull, 2)
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in messages(response)] == [b"second"]
    assert broker.app.pull_hold.held_count == 0


async def test_held_pull_on_a_new_queue_at_offset_0(broker: Harness) -> None:
    await broker.send("TopicN", b"x", queue_id=0)
    pull = asyncio.create_task(
        broker.pull("TopicN", queue_id=3, sys_flag=HOLD, suspend_ms=20_000, timeout_ms=30_000)
    )
    await _wait_held(broker)
    await broker.send("TopicN", b"y", queue_id=3)
    response = await asyncio.wait_for(pull, 2)
    assert [m.body for m in messages(response)] == [b"y"]


async def test_held_pull_times_out_with_19(broker: Harness) -> None:
    await broker.send("TopicT", b"x")
    started = time.monotonic()
    response = await broker.pull("TopicT", offset=1, sys_flag=HOLD, suspend_ms=300)
    elapsed = time.monotonic() - started
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert response.ext_fields["nextBeginOffset"] == "1"
    assert response.ext_fields["maxOffset"] == "1"
    assert 0.25 <= elapsed < 3


async def test_held_pull_ignores_records_its_filter_rejects(broker: Harness) -> None:
    await broker.send("TopicF", b"x", properties={"TAGS": "TagA"})
    pull = asyncio.create_task(
        broker.pull("TopicF", offset=1, subscription="TagA", sys_flag=HOLD, suspend_ms=400)
    )
    await _wait_held(broker)
    await broker.send("TopicF", b"b", properties={"TAGS": "TagB"})
    await asyncio.sleep(0.1)
    assert not pull.done()  # a TagB record does not wake a TagA pull
    response = await asyncio.wait_for(pull, 3)
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY  # scanned, nothing matched


async def test_without_suspend_bit_the_pull_answers_at_once(broker: Harness) -> None:
    await broker.send("TopicS", b"x")
    started = time.monotonic()
    response = await broker.pull("TopicS", offset=1, suspend_ms=20_000)
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert time.monotonic() - started < 1


async def test_short_polling_holds_without_waking(tmp_path: Path) -> None:
    async with running_broker(
        tmp_path, longPollingEnable="false", shortPollingTimeMills="300"
    ) as broker:
        await broker.send("TopicP", b"x")
        started = time.monotonic()
        pull = asyncio.create_task(
            broker.pull("TopicP", offset=1, sys_flag=HOLD, suspend_ms=20_000)
        )
        await _wait_held(broker)
        await broker.send("TopicP", b"y")
        response = await asyncio.wait_for(pull, 3)
        assert time.monotonic() - started >= 0.25
        assert [m.body for m in messages(response)] == [b"y"]


async def test_suspend_timeout_is_clamped() -> None:
    assert PullHoldService(long_polling=True)._suspend_ms_max == PULL_SUSPEND_MS_MAX == 30_000
    hold = PullHoldService(long_polling=True, suspend_ms_max=50)
    hold.start()
    # Asked for 10**12 ms (about 31 years), the hold ends after the maximum.
    woken = await asyncio.wait_for(hold.hold("T", 0, 0, 10**12, lambda event: True), 2)
    assert woken is False
    assert hold.held_count == 0


async def test_client_vanishing_during_a_held_pull(broker: Harness) -> None:
    await broker.send("TopicV", b"x")
    other = RemotingClient()
    pull = asyncio.create_task(
        Harness(broker.app, other).pull(
            "TopicV", offset=1, sys_flag=HOLD, suspend_ms=20_000, timeout_ms=30_000
        )
    )
    await _wait_held(broker)
    await other.close()
    assert isinstance((await asyncio.gather(pull, return_exceptions=True))[0], Exception)
    # The abandoned hold is released when its connection closes, with no arrival needed.
    await eventually(lambda: broker.app.pull_hold.held_count == 0)
    assert (await broker.send("TopicV", b"y")).code == ResponseCode.SUCCESS
    assert [m.body for m in messages(await broker.pull("TopicV"))] == [b"x", b"y"]


async def test_a_filter_that_raises_wakes_the_pull_and_a_bug_propagates() -> None:
    hold = PullHoldService(long_polling=True)
    hold.start()
    event = DispatchEvent(
        topic="T",
        queue_id=0,
        queue_offset=0,
        physical_offset=0,
        size=1,
        tags_code=0,
        store_timestamp=0,
        properties={},
    )

    def bad_value(_event: DispatchEvent) -> bool:
        raise ValueError("cannot compare")

    waiting = asyncio.create_task(hold.hold("T", 0, 0, 5_000, bad_value))
    await eventually(lambda: hold.held_count == 1)
    hold.on_dispatch(event)
    assert await asyncio.wait_for(waiting, 2) is True

    def bug(_event: DispatchEvent) -> bool:
        raise KeyError("a programming error")

    waiting = asyncio.create_task(hold.hold("T", 0, 0, 5_000, bug))
    await eventually(lambda: hold.held_count == 1)
    with pytest.raises(KeyError):
        hold.on_dispatch(event)
    waiting.cancel()
