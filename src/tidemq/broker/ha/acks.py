"""AckWaiters: SYNC_MASTER sends waiting for a slave's acknowledgement, released as a group.

Each waiter is (end offset, callback, deadline). Durability asks in put order, so ends arrive
non-decreasing, and the timeout is the same for all, so deadlines do too: one deque in arrival
order is sorted by both. A report `release(acked)` pops from the left while the end is covered
(SUCCESS); the expiry timer pops from the left while the deadline is due (FLUSH_SLAVE_TIMEOUT;
the message stays stored on the master, as upstream). Each waiter thus costs O(1) however many
wait: no scan of those still waiting.

    add(end, cb) ──▶ ordered: deque [ (end₁,cb₁,t₁) (end₂,cb₂,t₂) … ]   end₁ ≤ end₂ ≤ …
                      │        ├─ release(acked) ─▶ popleft while end ≤ acked ─▶ cb(SUCCESS)
                      │        └─ timer at t₁ ──▶ popleft while t ≤ now ─▶ cb(FLUSH_SLAVE_TIMEOUT)
                      └─ an end below the last one (a caller out of put order): `_strays`, a
                         list in arrival order scanned by release and expiry (empty in practice)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from tidemq.protocol.codes import ResponseCode

log = logging.getLogger(__name__)

# Called on the event loop with the answer's ResponseCode (SUCCESS, FLUSH_SLAVE_TIMEOUT,
# SLAVE_NOT_AVAILABLE).
AckCallback = Callable[[int], None]
_Waiter = tuple[int, AckCallback, float]


class AckWaiters:
    def __init__(self, timeout_ms: float) -> None:
        assert timeout_ms > 0
        self._timeout_s = timeout_ms / 1000
        # Non-decreasing ends and deadlines (the module doc).
        self._waiters: deque[_Waiter] = deque()
        # Waiters whose end was below the last one's at arrival: deadlines in order, ends not.
        self._strays: list[_Waiter] = []
        self._expiry: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._waiters) + len(self._strays)

    def add(self, end: int, callback: AckCallback) -> None:
        """Wait for `release(acked)` with acked >= `end`, at most the timeout. On the loop."""
        loop = asyncio.get_running_loop()
        waiter = (end, callback, loop.time() + self._timeout_s)
        waiters = self._waiters
        if not waiters or waiters[-1][0] <= end:
            waiters.append(waiter)
        else:
            self._strays.append(waiter)
        if self._expiry is None:
            self._arm_expiry(loop)

    def release(self, acked: int) -> None:
        """Answer SUCCESS to every waiter whose end is at or below `acked`."""
        waiters = self._waiters
        released: list[AckCallback] = []
        while waiters and waiters[0][0] <= acked:
            released.append(waiters.popleft()[1])
        if self._strays:
            released += [w[1] for w in self._strays if w[0] <= acked]
            self._strays = [w for w in self._strays if w[0] > acked]
        if not released:
            return
        if not self and self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for callback in released:
            call_back(callback, ResponseCode.SUCCESS)

    def fail_all(self, code: int) -> None:
        """Answer `code` to every waiter (the master stops)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        waiters = [*self._waiters, *self._strays]
        self._waiters.clear()
        self._strays = []
        for waiter in waiters:
            call_back(waiter[1], code)

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop) -> None:
        due = [queue[0][2] for queue in (self._waiters, self._strays) if queue]
        if due:
            self._expiry = loop.call_at(min(due), self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._expiry = None
        now = loop.time()
        waiters = self._waiters
        expired: list[_Waiter] = []
        while waiters and waiters[0][2] <= now:
            expired.append(waiters.popleft())
        strays = self._strays
        due = 0
        while due < len(strays) and strays[due][2] <= now:
            due += 1
        if due:
            expired += strays[:due]
            self._strays = strays[due:]
        if expired:
            log.warning(
                "no slave acknowledged offset %d within %.0f ms (%d waiters): FLUSH_SLAVE_TIMEOUT",
                max(w[0] for w in expired),
                self._timeout_s * 1e3,
                len(expired),
            )
        for waiter in expired:
            call_back(waiter[1], ResponseCode.FLUSH_SLAVE_TIMEOUT)
        self._arm_expiry(loop)


def call_back(callback: AckCallback, code: int) -> None:
    # A waiter's failure is its own (it answers requests): the HA master carries on.
    try:
        callback(code)
    except Exception:
        log.exception("ack waiter %r failed", callback)
