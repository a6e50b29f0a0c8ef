"""SilentBrokerRefresh: failed probes of a master ask for route refreshes, at most one per
interval however many probes fail (client/silent_refresh.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine

from tidemq.client.silent_refresh import SilentBrokerRefresh
from tidemq.testing import eventually_async

INTERVAL_MS = 200


class Refreshes:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def refresh(self) -> None:
        self.times.append(asyncio.get_running_loop().time())

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def test_a_burst_of_failed_probes_costs_one_refresh() -> None:
    seen = Refreshes()
    silent = SilentBrokerRefresh(seen.refresh, seen.spawn, INTERVAL_MS)
    for _ in range(50):
        silent.silent("10.0.0.1:10911")
    await eventually_async(lambda: _true(len(seen.times) == 1), 5.0)
    await asyncio.gather(*seen.tasks)
    assert len(seen.times) == 1
    assert silent.refreshes == 1


async def test_refreshes_keep_the_interval_apart() -> None:
    seen = Refreshes()
    silent = SilentBrokerRefresh(seen.refresh, seen.spawn, INTERVAL_MS)
    for expected in (1, 2, 3):
        silent.silent("10.0.0.1:10911")
        await eventually_async(lambda n=expected: _true(len(seen.times) == n), 5.0)
    gaps = [b - a for a, b in zip(seen.times, seen.times[1:], strict=False)]
    assert all(gap >= INTERVAL_MS / 1000 - 0.01 for gap in gaps), gaps


async def _true(value: bool) -> bool:
    return value
