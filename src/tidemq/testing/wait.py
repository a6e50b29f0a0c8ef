"""`eventually()`: wait for a condition that another task makes true, for tests.

Most conditions tests wait on (a held pull registered, a message consumed, a counter bumped) live
in another part's task and have no event to await, so they are polled. One helper does it for
every test: it starts polling at once and backs off (1 ms doubling to 50 ms), so a fast condition
costs almost nothing and a slow one does not spin, and it fails with TimeoutError naming what it
waited for instead of a bare timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

POLL_INTERVAL_S_MIN: Final = 0.001
# Upper bound of the back-off: keeps a waiting test at most this late after its condition holds.
POLL_INTERVAL_S_MAX: Final = 0.05


async def eventually(
    predicate: Callable[[], bool], timeout_s: float = 10.0, *, what: str | None = None
) -> None:
    """Return once `predicate()` is true; raise TimeoutError after `timeout_s` seconds.

    Args:
        predicate: a cheap check of state another task changes.
        timeout_s: how long to wait in all.
        what: the condition's description for the error (default: the predicate's name).
    """

    async def check() -> bool:
        return predicate()

    name = what or getattr(predicate, "__qualname__", repr(predicate))
    await eventually_async(check, timeout_s, what=name)


async def eventually_async(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, *, what: str | None = None
) -> None:
    """`eventually()` for a condition that needs a round trip to check (a route a name server
    serves, a broker's client table): the same back-off, each check awaited in turn.

    Raises:
        TimeoutError: naming `what` (or the predicate) after `timeout_s` seconds.
    """
    interval_s = POLL_INTERVAL_S_MIN
    try:
        async with asyncio.timeout(timeout_s):
            while not await predicate():
                await asyncio.sleep(interval_s)
                interval_s = min(interval_s * 2, POLL_INTERVAL_S_MAX)
    except TimeoutError:
        name = what or getattr(predicate, "__qualname__", repr(predicate))
        raise TimeoutError(f"not true after {timeout_s} s: {name}") from None
