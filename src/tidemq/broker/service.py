"""PeriodicService: run one callable every N ms on the event loop, with start/stop.

The broker's housekeeping (offset persistence, client expiry, file cleanup, name-server
registration, pull-hold sweep) are each one small instance of this, wired in app.py. A failing run
is logged and the next one still happens: one bad tick must not stop the service for good.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

# The tick's return value, if not awaitable, is ignored (e.g. a count of files removed).
Tick = Callable[[], Awaitable[object] | object]


class PeriodicService:
    """Calls `tick` every `interval_ms` (the first call after one interval) until stopped."""

    def __init__(self, name: str, interval_ms: float, tick: Tick) -> None:
        assert interval_ms > 0
        self.name = name
        self._interval_s = interval_ms / 1000
        self._tick = tick
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        assert self._task is None, f"{self.name} started twice"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def trigger(self) -> None:
        """Run the next tick now instead of at the end of the interval."""
        self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def run_once(self) -> None:
        try:
            result = self._tick()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: periodic run failed", self.name)

    async def _run(self) -> None:
        while True:
            # asyncio.wait, which never cancels this task: on 3.11 wait_for swallows a stop()
            # that arrives as trigger() sets the event (stop then waits a whole interval), and
            # asyncio.timeout can leave its own expiry's cancel pending when the event wins.
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=self._interval_s)
            finally:
                waiter.cancel()
            self._wake.clear()
            await self.run_once()
