"""Orderly consumption: one batch at a time per queue, only while this client holds the queue's
broker lock. Apart from consumer.py (rebalance, pulls, offsets) and consume_concurrently.py
because it owns the lock lifecycle and a failure blocks the queue instead of being sent back.

A batch runs only while its lock is trusted (renewed every LOCK_RENEW_INTERVAL_MS, trusted for
LOCK_TRUST_MS). SUSPEND_CURRENT_QUEUE_A_MOMENT (or an exception) retries the same batch after
`suspend_current_queue_ms`; once a batch has failed max_reconsume_times times it is sent to the
dead-letter queue (send-back with delay level -1) and consumption moves on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Final

from tidemq.clock import Clock
from tidemq.errors import BrokerError, ClientError
from tidemq.protocol.bodies import MessageQueue

from . import api
from .assignment import OwnedQueue
from .instance import ClientInstance
from .message import MessageExt
from .offset_store import OffsetTable
from .process_queue import ProcessQueue

# Logged under the name it had before the split: log filters and configurations keep working.
logger = logging.getLogger("tidemq.client.consumer")

LOCK_RENEW_INTERVAL_MS: Final = 20_000
# A lock not renewed for this long is not trusted for consuming (broker expiry is 60 s).
LOCK_TRUST_MS: Final = 30_000


class OrderlyConsumption:
    """PushConsumer's orderly listener calls and queue locks (a base class: it shares the
    consumer's state)."""

    _group: str
    _instance: ClientInstance
    _clock: Clock
    _offsets: OffsetTable
    _queues: dict[MessageQueue, OwnedQueue]
    _semaphore: asyncio.Semaphore
    _consuming: set[asyncio.Task[object]]
    consume_batch_max: int
    max_reconsume_times: int
    suspend_current_queue_ms: int

    if TYPE_CHECKING:

        @property
        def clustering(self) -> bool: ...

        async def _call_listener(self, messages: list[MessageExt]) -> bool: ...

        def _restore_topic(self, message: MessageExt) -> MessageExt: ...

    def _lock_trusted(self, pq: ProcessQueue) -> bool:
        if not self.clustering:
            return True
        age_ms = self._clock.monotonic_ms() - pq.lock_renewed_at_ms
        return pq.locked and age_ms < LOCK_TRUST_MS

    async def _orderly_loop(self, state: OwnedQueue) -> None:
        pq = state.pq
        while not pq.dropped:
            if not pq.has_pending:
                await pq.wait_changed()
                continue
            if not self._lock_trusted(pq):
                await asyncio.sleep(self.suspend_current_queue_ms / 1000)
                continue
            # The batch runs as its own task, shielded: giving the queue up (or shutdown)
            # cancels this loop but never cuts a listener call short (a thread cannot be), and
            # waits for it before releasing the broker lock (assignment.py), so the next owner
            # never consumes the queue alongside it.
            call = asyncio.ensure_future(self._consume_orderly(state))
            state.call = call
            self._consuming.add(call)
            call.add_done_callback(self._consuming.discard)
            if not await asyncio.shield(call):
                await asyncio.sleep(self.suspend_current_queue_ms / 1000)

    async def _consume_orderly(self, state: OwnedQueue) -> bool:
        """One orderly batch: the listener, then commit or put back; False: retry later."""
        pq = state.pq
        async with self._semaphore:
            if pq.dropped or not pq.has_pending:
                return True
            batch = pq.take(self.consume_batch_max)
            ok = await self._call_listener(batch)
        if not ok and all(m.reconsume_times >= self.max_reconsume_times for m in batch):
            ok = await self._to_dead_letter(batch)
        if ok:
            offset = pq.commit_taken()
            if not state.released:
                self._offsets.update(state.mq, offset)
            return True
        pq.return_taken(
            dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in batch
        )
        return False

    async def _to_dead_letter(self, batch: list[MessageExt]) -> bool:
        try:
            for message in batch:
                await api.send_back(
                    self._instance,
                    self._group,
                    self._restore_topic(message),
                    delay_level=-1,
                    max_reconsume_times=self.max_reconsume_times,
                )
        except (ClientError, BrokerError) as exc:
            logger.warning("%s: dead-letter send-back failed: %s", self._group, exc)
            return False
        logger.warning("%s: %d message(s) sent to the dead-letter queue", self._group, len(batch))
        return True

    # -- locks (orderly, clustering) -------------------------------------------------------

    async def _lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        locked = await api.lock_queues(self._instance, self._group, mqs)
        now = self._clock.monotonic_ms()
        for mq in mqs:
            state = self._queues.get(mq)
            if state is not None:
                state.pq.locked = mq in locked
                if mq in locked:
                    state.pq.lock_renewed_at_ms = now
        return locked

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        await api.unlock_queues(self._instance, self._group, mqs)

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(LOCK_RENEW_INTERVAL_MS / 1000)
            if self._queues:
                await self._lock(list(self._queues))
