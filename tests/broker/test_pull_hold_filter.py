"""The pull-hold service's topic filter for the store: a topic is wanted exactly while a pull
is held on one of its queues (with long polling), so sends to other topics build no event."""

from __future__ import annotations

import asyncio

from tidemq.broker.pull_hold import PullHoldService
from tidemq.store.types import DispatchEvent
from tidemq.testing import eventually


def _event(topic: str, queue_id: int) -> DispatchEvent:
    return DispatchEvent(topic, queue_id, 0, 0, 100, 0, 0, {})


async def test_a_topic_is_wanted_while_a_pull_is_held_on_it() -> None:
    hold = PullHoldService(long_polling=True)
    hold.start()
    assert not hold.wants_topic("T")
    first = asyncio.create_task(hold.hold("T", 0, 0, 10_000, lambda event: True))
    second = asyncio.create_task(hold.hold("T", 1, 0, 10_000, lambda event: True))
    await eventually(lambda: hold.held_count == 2)
    assert hold.wants_topic("T")
    assert not hold.wants_topic("U")
    hold.on_dispatch(_event("T", 0))
    assert await first is True
    assert hold.wants_topic("T")  # queue 1's pull is still held
    hold.on_dispatch(_event("T", 1))
    assert await second is True
    assert not hold.wants_topic("T")
    assert hold.held_count == 0


async def test_timed_out_holds_leave_no_topic_wanted() -> None:
    hold = PullHoldService(long_polling=True)
    hold.start()
    results = await asyncio.gather(*(hold.hold("T", q, 0, 1, lambda e: True) for q in range(3)))
    assert results == [False, False, False]
    assert not hold.wants_topic("T")


async def test_short_polling_wants_no_topic() -> None:
    hold = PullHoldService(long_polling=False)
    hold.start()
    held = asyncio.create_task(hold.hold("T", 0, 0, 10_000, lambda event: True))
    await eventually(lambda: hold.held_count == 1)
    assert not hold.wants_topic("T")  # short polling is never woken by arrivals
    await hold.stop()
    assert await held is False
