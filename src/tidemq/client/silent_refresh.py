"""Route refreshes while a broker's master does not answer: it may have been replaced.

Under controller mode (issue 14) a group's master can move to another replica: the old address
stops answering and the name servers publish the new one within seconds. A client that only
probed the old address until the 30 s route refresh would be stuck that long, so each failed
probe of an address (the producer's fault probe, the read router's probe) asks for a refresh of
every route, at most one per SILENT_REFRESH_INTERVAL_MS however many probes fail:

    probe(addr) fails ─▶ silent(addr) ─▶ a refresh now, or when the interval since the last
                                          one has passed (one pending at most)

With a plain 4.x group the refresh finds the same address and costs one name-server round
trip a second while a master is down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Final

logger = logging.getLogger(__name__)

SILENT_REFRESH_INTERVAL_MS: Final = 1_000


class SilentBrokerRefresh:
    """`refresh()` refreshes every route; `spawn(coro)` runs a task its owner cancels."""

    def __init__(
        self,
        refresh: Callable[[], Awaitable[None]],
        spawn: Callable[[Coroutine[object, object, None]], None],
        interval_ms: float = SILENT_REFRESH_INTERVAL_MS,
    ) -> None:
        self._refresh = refresh
        self._spawn = spawn
        self._interval_s = interval_ms / 1000
        self._last = float("-inf")  # event-loop time of the last refresh's start
        self._pending = False
        self.refreshes = 0  # for tests

    def silent(self, addr: str) -> None:
        """A probe of `addr` got no answer: refresh the routes soon (see the module doc)."""
        if self._pending:
            return
        self._pending = True
        self._spawn(self._run(addr))

    async def _run(self, addr: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            wait_s = self._last + self._interval_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self._last = loop.time()
            self.refreshes += 1
            logger.debug("%s does not answer: refreshing routes", addr)
            await self._refresh()
        finally:
            self._pending = False
