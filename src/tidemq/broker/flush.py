"""FlushService: makes appended commit-log bytes durable, off the event loop.

    ASYNC_FLUSH   every flush_interval_ms, one `store.flush()` in a worker thread; sends never wait.
    SYNC_FLUSH    group commit: a send awaits `wait_flushed(end)`; one flush in a worker thread
                  releases every waiter whose end offset is at or below the flushed offset, so N
                  concurrent sends cost one fsync, not N. A waiter not released within
                  sync_flush_timeout_ms gets False (the handler answers FLUSH_DISK_TIMEOUT; the
                  message is stored and will be flushed by a later round).
                  A round that serves waiters syncs only the commit log (`flush_log`): consume
                  queues, index and checkpoint are derived from the log and rebuilt from it by
                  recovery, so they follow on the full flush every flush_interval_ms (as
                  RocketMQ's GroupCommitService flushes only the commit log). One fdatasync per
                  round instead of one per touched file is what makes the group commit cheap.
                  The full flush runs as its own task, beside the rounds: a send never waits
                  behind the consume-queue, index and checkpoint syncs (they took tens of ms
                  after a large backlog and showed as the p99 of acknowledgements).

A waiter is a callback (`on_flushed`), called on the event loop with True once flushed or False
at its timeout: a group of sends stored together waits as one callback, with no task or future
(broker/handlers/send_coalesce.py). `wait_flushed` is the awaitable form, for handlers that await.

SYNC rounds run on a dedicated thread, not through asyncio.to_thread: the loop kicks it (a
threading.Event) when a waiter arrives, and it starts the next fdatasync as soon as it is kicked,
with no executor submit and no task wake-up in between; it hands each round's flushed offset
back with one call_soon_threadsafe. The hop cost 0.1-0.4 ms of a ~1 ms round at 50 connections
with one send in flight each, and rounds are what such a load waits for.

At most one round runs at a time; waiters that arrive during a round kick the next one, since
the running round may have captured the log's end before their bytes were appended.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from tidemq.broker.service import cancel_and_wait

log = logging.getLogger(__name__)

# Called with True once the log is durable up to the waiter's end, False at its timeout.
FlushCallback = Callable[[bool], None]


class FlushService:
    def __init__(
        self,
        flush: Callable[[], int],
        *,
        sync: bool,
        interval_ms: float,
        sync_timeout_ms: float,
        flush_log: Callable[[], int] | None = None,
    ) -> None:
        """`flush` is the store's thread-safe full flush; `flush_log` (default: `flush`) syncs
        only the commit log. Both return the flushed physical offset."""
        assert interval_ms > 0
        assert sync_timeout_ms > 0
        self._flush = flush
        self._flush_log = flush_log or flush
        self._sync = sync
        self._interval_s = interval_ms / 1000
        self._sync_timeout_s = sync_timeout_ms / 1000
        # (end offset, callback, deadline in loop time), in arrival order: the timeout is the
        # same for all, so the first waiter is always the one due first.
        self._waiters: list[tuple[int, FlushCallback, float]] = []
        # One timer for the oldest waiter, not one per waiter (one wait per sync send).
        self._expiry: asyncio.TimerHandle | None = None
        # SYNC: the round thread, set by the loop when a waiter arrives, cleared by the thread
        # before it captures the log's end (a waiter kicking after that gets the next round).
        self._kick = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # The full flush every interval, in both modes.
        self._task: asyncio.Task[None] | None = None
        self._flushed_offset = 0

    @property
    def sync(self) -> bool:
        return self._sync

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    def start(self) -> None:
        assert self._task is None
        assert self._thread is None
        loop = asyncio.get_running_loop()
        if self._sync:
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run_rounds, args=(loop,), name="flush-service-rounds", daemon=True
            )
            self._thread.start()
        self._task = loop.create_task(self._run(), name="flush-service")

    async def stop(self) -> None:
        """Stop the loops and run one last flush, releasing every waiter it covers."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._kick.set()
            await asyncio.to_thread(thread.join)
        await self._flush_once()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        # Not flushed by the last flush (it failed): each is told so, as at a timeout.
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _call(waiter[1], False)

    @property
    def waiting(self) -> int:
        """Waiters not yet released (a group of sends counts once)."""
        return len(self._waiters)

    def on_flushed(self, physical_end: int, callback: FlushCallback) -> None:
        """Call `callback(True)` once the log is durable up to `physical_end` (at once in ASYNC
        mode or when it already is), or `callback(False)` after sync_flush_timeout_ms. Called on
        the event loop; an exception it raises is logged."""
        if not self._sync or physical_end <= self._flushed_offset:
            _call(callback, True)
            return
        loop = asyncio.get_running_loop()
        self._waiters.append((physical_end, callback, loop.time() + self._sync_timeout_s))
        if not self._kick.is_set():
            self._kick.set()
        if self._expiry is None:
            self._arm_expiry(loop)

    async def wait_flushed(self, physical_end: int) -> bool:
        """In SYNC mode wait until the log is durable up to `physical_end`; False on timeout."""
        if not self._sync or physical_end <= self._flushed_offset:
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def release(flushed: bool) -> None:
            if not future.done():
                future.set_result(flushed)

        self.on_flushed(physical_end, release)
        return await future

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop) -> None:
        """Time out the oldest waiter when it is due (a timer, not asyncio.wait_for: that costs
        a task per waiter); at expiry, every waiter due is failed and the next one armed."""
        if self._waiters:
            self._expiry = loop.call_at(self._waiters[0][2], self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._expiry = None
        now = loop.time()
        waiters = self._waiters
        due = 0
        while due < len(waiters) and waiters[due][2] <= now:
            due += 1
        self._waiters = waiters[due:]
        if due:
            log.warning(
                "flush to offset %d not done within %.0f ms (%d waiters)",
                waiters[due - 1][0],
                self._sync_timeout_s * 1e3,
                due,
            )
        for waiter in waiters[:due]:
            _call(waiter[1], False)
        self._arm_expiry(loop)

    def _run_rounds(self, loop: asyncio.AbstractEventLoop) -> None:
        # SYNC, on its own thread: a group-commit round of the log alone each time it is kicked
        # (back to back while waiters keep coming); _run does the rest beside them. The
        # interval wake-up retries a failed round for the waiters it left.
        kick = self._kick
        while True:
            kick.wait(self._interval_s)
            if self._stopping:
                return
            if not kick.is_set() and not self._waiters:
                continue
            kick.clear()
            try:
                flushed = self._flush_log()
            except Exception:
                # Waiters stay queued: they time out (FLUSH_DISK_TIMEOUT) unless a later round
                # works.
                log.exception("commit-log flush failed")
                continue
            try:
                loop.call_soon_threadsafe(self._release, flushed)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    async def _run(self) -> None:
        # Both modes: a full flush every interval (in SYNC, beside the rounds).
        while True:
            await asyncio.sleep(self._interval_s)
            await self._flush_once()

    async def _flush_once(self) -> None:
        try:
            flushed = await asyncio.to_thread(self._flush)
        except Exception:
            # Waiters stay queued: they time out (FLUSH_DISK_TIMEOUT) unless a later flush works.
            log.exception("commit-log flush failed")
            return
        self._release(flushed)

    def _release(self, flushed: int) -> None:
        """On the loop: note a flush that reached `flushed`; call back the waiters it covers."""
        self._flushed_offset = flushed_offset = max(self._flushed_offset, flushed)
        released: list[FlushCallback] = []
        remaining: list[tuple[int, FlushCallback, float]] = []
        for waiter in self._waiters:
            if waiter[0] <= flushed_offset:
                released.append(waiter[1])
            else:
                remaining.append(waiter)
        self._waiters = remaining
        for callback in released:
            _call(callback, True)


def _call(callback: FlushCallback, flushed: bool) -> None:
    # A waiter's failure is its own (it answers requests): the flush service carries on.
    try:
        callback(flushed)
    except Exception:
        log.exception("flush waiter %r failed", callback)
