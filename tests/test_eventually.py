"""tidemq.testing.eventually: returns as soon as the condition holds, fails naming it."""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.testing import eventually


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
