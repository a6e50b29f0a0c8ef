"""Concurrent consumption: a pulled batch runs as a task beside the others of its queue, and a
failed message goes back to the broker for a later retry. Apart from consumer.py (rebalance,
pulls, offsets) and consume_orderly.py because its failure rule differs: a message may be
retried out of order, so nothing waits for it.

A failed batch (RECONSUME_LATER or an exception) is sent back (CONSUMER_SEND_MSG_BACK, delay
level 0: the broker re-delivers it through %RETRY%<group> after 10 s, 30 s, …); a message whose
send-back fails stays in the process queue and is retried locally after LOCAL_RETRY_DELAY_MS.
The committed offset is the lowest unfinished message (process_queue.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Final

from tidemq.errors import BrokerError, ClientError

from . import api
from .assignment import OwnedQueue
from .instance import ClientInstance
from .message import MessageExt
from .offset_store import OffsetTable

# Logged under the name it had before the split: log filters and configurations keep working.
logger = logging.getLogger("tidemq.client.consumer")

# Delay before a locally retried message (its send-back failed) is consumed again.
LOCAL_RETRY_DELAY_MS: Final = 5_000


class ConcurrentConsumption:
    """PushConsumer's concurrent listener calls (a base class: it shares the consumer's state)."""

    _group: str
    _instance: ClientInstance
    _offsets: OffsetTable
    _semaphore: asyncio.Semaphore
    _retrying: set[asyncio.Task[None]]
    _closed: bool
    max_reconsume_times: int

    if TYPE_CHECKING:

        @property
        def clustering(self) -> bool: ...

        async def _call_listener(self, messages: list[MessageExt]) -> bool: ...

        def _restore_topic(self, message: MessageExt) -> MessageExt: ...

    async def _consume_concurrently(self, state: OwnedQueue, messages: list[MessageExt]) -> None:
        async with self._semaphore:
            if state.pq.dropped or self._closed:
                return
            ok = await self._call_listener(messages)
        done = messages
        if not ok and self.clustering:
            done, failed = [], []
            for message in messages:
                try:
                    await api.send_back(
                        self._instance,
                        self._group,
                        self._restore_topic(message),
                        delay_level=0,
                        max_reconsume_times=self.max_reconsume_times,
                    )
                    done.append(message)
                except (ClientError, BrokerError) as exc:
                    logger.warning("%s: send-back failed, retrying locally: %s", self._group, exc)
                    failed.append(
                        dataclasses.replace(message, reconsume_times=message.reconsume_times + 1)
                    )
            if failed:
                retry = asyncio.create_task(self._retry_later(state, failed))
                self._retrying.add(retry)
                retry.add_done_callback(self._retrying.discard)
        elif not ok:
            logger.warning("%s: broadcasting consumer drops %d failed", self._group, len(messages))
        offset = state.pq.remove(done)
        if offset >= 0 and not state.pq.dropped:
            self._offsets.update(state.mq, offset)

    async def _retry_later(self, state: OwnedQueue, messages: list[MessageExt]) -> None:
        await asyncio.sleep(LOCAL_RETRY_DELAY_MS / 1000)
        if not state.pq.dropped and not self._closed:
            await self._consume_concurrently(state, messages)
