"""PeriodicService, and the waiting primitives every broker service loop shares.

The broker's housekeeping (offset persistence, client expiry, file cleanup, name-server
registration, pull-hold sweep) are each one small instance of PeriodicService, wired in app.py. A
failing run is logged and the next one still happens: one bad tick must not stop the service for
good. The delay-level and timer services sleep until their next due message instead of a fixed
interval (`run_due_loop`); all of them wait and stop through the two functions below, so the
Python 3.11 cancellation pitfall they avoid is handled once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

# The tick's return value, if not awaitable, is ignored (e.g. a count of files removed).
Tick = Callable[[], Awaitable[object] | object]


async def wait_woken(wake: asyncio.Event, timeout_s: float) -> None:
    """Return when `wake` is set or after `timeout_s`, whichever is first.

    asyncio.wait never cancels the calling task: on 3.11 wait_for swallows a stop() that arrives
    as the event is set (stop then waits a whole interval), and asyncio.timeout can leave its own
    expiry's cancel pending when the event wins.
    """
    waiter = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a service's task and wait until it has finished."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def run_due_loop(wake: asyncio.Event, deliver_due: Callable[[], int]) -> None:
    """Forever: deliver what is due, then sleep until the next due time or an earlier wake-up.

    `deliver_due` returns the ms until more work is due (<= 0: more is due now, after yielding).
    """
    while True:
        wake.clear()
        wait_ms = deliver_due()
        if wait_ms <= 0:
            await asyncio.sleep(0)
            continue
        await wait_woken(wake, wait_ms / 1000)


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
        await cancel_and_wait(task)

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
            await wait_woken(self._wake, self._interval_s)
            self._wake.clear()
            await self.run_once()
