"""tidemq.testing.eventually: returns as soon as the condition holds, fails naming it."""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.testing import eventually, eventually_async


async def test_returns_once_another_task_makes_it_true() -> None:
    flag: list[bool] = []
    asyncio.get_running_loop().call_later(0.02, flag.append, True)
    started = time.monotonic()
    await eventually(lambda: bool(flag), 2)
    assert time.monotonic() - started < 0.5


async def test_times_out_naming_the_condition() -> None:
    def never() -> bool:
        return False

    with pytest.raises(TimeoutError, match="never"):
        await eventually(never, 0.05)


async def test_eventually_async_awaits_each_check_and_names_what_failed() -> None:
    calls = 0

    async def third_time() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    await eventually_async(third_time, 2)
    assert calls == 3

    async def never() -> bool:
        return False

    with pytest.raises(TimeoutError, match="the route"):
        await eventually_async(never, 0.05, what="the route")
