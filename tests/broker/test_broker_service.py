"""PeriodicService: stop() right after trigger() returns at once (no lost cancellation)."""

from __future__ import annotations

import asyncio

from tidemq.broker.service import PeriodicService


async def test_stop_right_after_trigger_does_not_wait_an_interval() -> None:
    ticks: list[int] = []
    service = PeriodicService("t", 60_000, lambda: ticks.append(1))
    service.start()
    await asyncio.sleep(0)  # the loop is now waiting for the interval or a trigger
    service.trigger()
    await asyncio.wait_for(service.stop(), 2)
    assert not service.running
