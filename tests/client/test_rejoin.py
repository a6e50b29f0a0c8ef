"""Route refreshes after a broker answers again, until a route lists it (client/rejoin.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine

import pytest

from tidemq.client import rejoin
from tidemq.client.rejoin import RejoinRefresh
from tidemq.testing import eventually


class Harness:
    def __init__(self) -> None:
        self.listed: set[str] = set()
        self.refreshed_at: list[float] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.refresher = RejoinRefresh(self.refresh, self.listed.__contains__, self.spawn)

    async def refresh(self) -> None:
        self.refreshed_at.append(asyncio.get_running_loop().time())

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        self.tasks.append(asyncio.create_task(coro))

    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in itertools.pairwise(self.refreshed_at)]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rejoin, "REFRESH_DELAY_MS_MIN", 20)
    monkeypatch.setattr(rejoin, "REFRESH_DELAY_MS_MAX", 80)
    monkeypatch.setattr(rejoin, "GIVE_UP_MS", 400)


async def test_routes_are_refreshed_with_back_off_until_they_list_the_broker(fast: None) -> None:
    h = Harness()
    h.refresher.answered("m:1")
    await eventually(lambda: len(h.refreshed_at) == 3, 2.0)
    h.listed.add("m:1")  # the name server has it now
    await eventually(lambda: not h.refresher.waiting(), 2.0)
    await asyncio.sleep(0.2)
    assert len(h.refreshed_at) == 4
    first, second, *_ = h.gaps_ms()  # 20 ms, then doubling: 40, 80
    assert 35 <= first < second
    assert second >= 75


async def test_refreshes_stop_after_the_give_up_time(fast: None) -> None:
    h = Harness()
    loop = asyncio.get_running_loop()
    started = loop.time()
    h.refresher.answered("m:1")
    await eventually(lambda: not h.refresher.waiting(), 2.0)
    count = len(h.refreshed_at)
    await asyncio.sleep(0.2)
    assert len(h.refreshed_at) == count  # no more after giving up
    assert h.refreshed_at[-1] - started >= 0.4
    assert len(h.refreshed_at) <= 8  # 20, 40, 80, 80, 80, 80 ms: capped at REFRESH_DELAY_MS_MAX


async def test_a_listed_broker_costs_one_refresh_and_answers_together_share_it(
    fast: None,
) -> None:
    h = Harness()
    h.listed.update({"a:1", "b:1"})
    h.refresher.answered("a:1")
    h.refresher.answered("b:1")
    await eventually(lambda: not h.refresher.waiting(), 2.0)
    await asyncio.sleep(0.1)
    assert len(h.refreshed_at) == 1
    await asyncio.gather(*h.tasks)
