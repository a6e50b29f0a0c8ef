"""Route refreshes after a broker answers again, until the routes list it.

A broker that answers again after failing (a producer's or a reader's probe, a heartbeat after
its connection closed) may have been dropped from the routes meanwhile: the name servers drop a
broker whose connection closed, and a consumer's reads return to a master only once a route
lists it. The broker registers again right after it starts listening, but the name server a
client asks may hear of it later (registration is per name server, and a registration may be
retried). So one refresh is not enough: the routes are refreshed

    REFRESH_DELAY_MS_MIN after the answer, then again after twice that, four times, ... (at
    most REFRESH_DELAY_MS_MAX apart) while a route lacks the broker, for GIVE_UP_MS at most
    (after that the regular 30 s route refresh covers a broker gone for good)

    answer(addr) ─▶ +0.5 s refresh ─▶ listed? done
                                  └─▶ +1 s refresh ─▶ +2 s ─▶ +4 s ─▶ +4 s ... until 30 s

One task serves every address waiting (each with its own back-off), so brokers answering
together cost one refresh, not one each. Timing uses the event loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Final

logger = logging.getLogger(__name__)

# A broker answering again registers with the name servers right after it starts listening; the
# first route refresh waits this long so as not to precede that.
REFRESH_DELAY_MS_MIN: Final = 500
REFRESH_DELAY_MS_MAX: Final = 4_000
# How long after the answer a route that still lacks the broker is refreshed for.
GIVE_UP_MS: Final = 30_000


@dataclass(frozen=True, slots=True)
class _Waiting:
    refresh_at: float  # event loop time, s
    delay_ms: float  # the wait before refresh_at
    give_up_at: float


class RejoinRefresh:
    """`refresh()` refreshes every route; `listed(addr)` says whether a route lists `addr`;
    `spawn(coro)` runs a background task the owner cancels at its shutdown."""

    def __init__(
        self,
        refresh: Callable[[], Awaitable[None]],
        listed: Callable[[str], bool],
        spawn: Callable[[Coroutine[object, object, None]], None],
    ) -> None:
        self._refresh = refresh
        self._listed = listed
        self._spawn = spawn
        self._waiting: dict[str, _Waiting] = {}
        self._running = False
        self._wake = asyncio.Event()

    def waiting(self) -> list[str]:
        """The addresses whose return to the routes is awaited (for tests and logs)."""
        return sorted(self._waiting)

    def answered(self, addr: str) -> None:
        """`addr` answers again: refresh the routes soon, and again until they list it."""
        if addr not in self._waiting:
            now = asyncio.get_running_loop().time()
            first = REFRESH_DELAY_MS_MIN
            self._waiting[addr] = _Waiting(now + first / 1000, first, now + GIVE_UP_MS / 1000)
        if self._running:
            self._wake.set()
            return
        self._running = True
        self._spawn(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                wait_s = min(w.refresh_at for w in self._waiting.values()) - loop.time()
                if wait_s > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await self._wake.wait()  # an earlier one may have been added
                    continue
                await self._refresh()
                self._after_refresh(loop.time())
        finally:
            self._running = False

    def _after_refresh(self, now: float) -> None:
        for addr, waiting in list(self._waiting.items()):
            if self._listed(addr):
                del self._waiting[addr]
            elif now >= waiting.give_up_at:
                del self._waiting[addr]
                logger.info(
                    "broker %s answers but no route lists it after %d s: left to the regular "
                    "route refresh",
                    addr,
                    GIVE_UP_MS // 1000,
                )
            elif waiting.refresh_at <= now:
                delay_ms = min(waiting.delay_ms * 2, REFRESH_DELAY_MS_MAX)
                self._waiting[addr] = dataclasses.replace(
                    waiting, refresh_at=now + delay_ms / 1000, delay_ms=delay_ms
                )
