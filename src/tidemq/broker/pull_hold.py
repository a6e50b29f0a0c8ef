"""Long polling: park a PULL that found nothing until a message arrives or the hold expires.

    PULL ──▶ store: nothing at offset ──▶ hold(topic, qid, offset, timeout, filter)
                                              │                       │
             store dispatch of a matching ────┘ (woken: True)         └─ timeout (False)
             record at/after the offset
    then the pull handler evaluates the request once more and answers (SUCCESS or 19).

The hold runs inside the request's own task (remoting runs each request as a task), so the
connection keeps serving other requests meanwhile. The store dispatches synchronously inside
put_message on the event-loop thread, and the pull handler registers the hold right after its
empty read without awaiting in between, so a message cannot slip between the read and the hold.

With longPollingEnable=false the request is held for shortPollingTimeMills and not woken by
arrivals (RocketMQ's short polling). The number of held requests is bounded by HELD_PULLS_MAX;
beyond it `hold` returns at once and the client gets PULL_NOT_FOUND and pulls again. Each hold is
also bounded in time (PULL_SUSPEND_MS_MAX, whatever suspendTimeoutMillis asks) and tied to its
connection: when the connection closes, its holds are released at once rather than lingering
until an arrival or the timeout (a client that reconnects in a loop would otherwise fill the
table with holds nobody will read).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from tidemq.errors import ProtocolError
from tidemq.remoting.connection import Connection
from tidemq.store.types import DispatchEvent

log = logging.getLogger(__name__)

# Held pulls at once. One push consumer holds one pull per assigned queue; 10,000 covers hundreds
# of consumers on busy topics while bounding memory (a held request is a few hundred bytes).
HELD_PULLS_MAX: Final = 10_000
# Longest hold whatever suspendTimeoutMillis says. Clients ask 15-20 s (RocketMQ's default
# brokerSuspendMaxTimeMillis is 15 s, ali-ons 20 s); their request timeout is longer still, so a
# larger value only keeps dead or hostile requests parked (one asked 10**12 ms).
PULL_SUSPEND_MS_MAX: Final = 30_000

ArrivalFilter = Callable[[DispatchEvent], bool]


@dataclass(slots=True, eq=False)
class _Held:
    offset: int
    matches: ArrivalFilter
    future: asyncio.Future[bool] = field(repr=False)
    connection: Connection | None = field(default=None, repr=False)


class PullHoldService:
    def __init__(
        self,
        *,
        long_polling: bool,
        held_max: int = HELD_PULLS_MAX,
        suspend_ms_max: int = PULL_SUSPEND_MS_MAX,
    ) -> None:
        self._long_polling = long_polling
        self._held_max = held_max
        self._suspend_ms_max = suspend_ms_max
        self._held: dict[tuple[str, int], list[_Held]] = {}
        # Held pulls per topic (the keys are the topics with one held): `wants_topic`.
        self._held_topics: dict[str, int] = {}
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stopped = False
        self.rejected = 0
        # Connections with a close listener registered here (one listener per connection).
        self._watched: set[Connection] = set()

    @property
    def held_count(self) -> int:
        return self._count

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopped = False

    async def stop(self) -> None:
        """Release every held pull (they are answered as timeouts)."""
        self._stopped = True
        for waiters in self._held.values():
            for held in waiters:
                if not held.future.done():
                    held.future.set_result(False)

    async def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_ms: float,
        matches: ArrivalFilter,
        connection: Connection | None = None,
    ) -> bool:
        """Wait until a matching record lands at/after `offset`: True, or False at the timeout
        (at most PULL_SUSPEND_MS_MAX) or when `connection` closes."""
        timeout_ms = min(timeout_ms, self._suspend_ms_max)
        if self._stopped or timeout_ms <= 0 or (connection is not None and connection.closed):
            return False
        if self._count >= self._held_max:
            self.rejected += 1
            if self.rejected % 1000 == 1:
                log.warning("pull hold full (%d held); answering at once", self._count)
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        held = _Held(offset, matches, future, connection)
        if connection is not None and connection not in self._watched:
            self._watched.add(connection)
            connection.add_close_listener(self._on_close)
        key = (topic, queue_id)
        # Short polling holds too (and counts against the bound) but is never woken early.
        self._held.setdefault(key, []).append(held)
        self._held_topics[topic] = self._held_topics.get(topic, 0) + 1
        self._count += 1
        try:
            return await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            return False
        finally:
            self._remove(key, held)

    def _on_close(self, connection: Connection) -> None:
        """Release the holds of a closed connection (their answers would go nowhere)."""
        self._watched.discard(connection)
        for waiters in self._held.values():
            for held in waiters:
                if held.connection is connection and not held.future.done():
                    held.future.set_result(False)

    def _remove(self, key: tuple[str, int], held: _Held) -> None:
        waiters = self._held.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(held)
        except ValueError:
            return
        self._count -= 1
        if not waiters:
            del self._held[key]
        left = self._held_topics[key[0]] - 1
        if left:
            self._held_topics[key[0]] = left
        else:
            del self._held_topics[key[0]]

    def wants_topic(self, topic: str) -> bool:
        """The store's topic filter for `on_dispatch`: topics with a pull held for wake-up."""
        return self._long_polling and topic in self._held_topics

    def on_dispatch(self, event: DispatchEvent) -> None:
        """The store's dispatch listener: wake pulls waiting on this queue that the record suits."""
        if not self._held:
            return
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._wake, event)
            return
        self._wake(event)

    def _wake(self, event: DispatchEvent) -> None:
        waiters = self._held.get((event.topic, event.queue_id))
        if not waiters or not self._long_polling:
            return
        for held in waiters:
            if held.future.done() or event.queue_offset < held.offset:
                continue
            try:
                matched = held.matches(event)
            except (ValueError, TypeError, ArithmeticError, ProtocolError):
                # This runs inside the sender's put (the dispatch listener): a filter that cannot
                # judge a record must not fail the send. Waking is safe: the pull re-filters.
                log.exception("pull hold filter failed; waking the pull anyway")
                matched = True
            if matched:
                held.future.set_result(True)
