"""The coroutine path of a send: route lookup, connect, and retries with broker fault
avoidance. Apart from producer.py (start, the pipelined fast path completed from the read
callback) because it changes with the retry and failover rules, not with the fast path's cost.

Retries: up to `retry_times` more attempts, all within one `send_timeout_ms` budget, each on the
next queue and preferably on another broker than the one that just failed. Retried: timeouts,
closed connections and the retriable broker codes (errors._RETRIABLE_CODES, plus NO_PERMISSION,
which a broker whose write permission was wiped for maintenance answers). Not retried: invalid
messages and the other codes; and a send to an explicit queue, selector or sharding key (moving
it would break the order the caller asked for). A failed fast-path attempt continues here with
the attempt and the failed broker counted, so the rule is the same.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tidemq.clock import Clock
from tidemq.errors import RequestTimeoutError
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode

from .fault import FaultTracker, select_queue
from .instance import ClientInstance
from .message import Message, SendResult
from .route_cache import PublishInfo
from .sending import (
    PreparedMessage,
    QueueSelector,
    explicit_queue,
    is_retriable,
    send_request,
    send_result,
)

# Logged under the name it had before the split: log filters and configurations keep working.
logger = logging.getLogger("tidemq.client.producer")


class RetryingSends:
    """Producer's coroutine send path (a base class: it shares the producer's state)."""

    _group: str
    _instance: ClientInstance
    _clock: Clock
    faults: FaultTracker
    send_timeout_ms: int
    retry_times: int

    if TYPE_CHECKING:

        async def publish_info(self, topic: str) -> PublishInfo: ...

        def _next_index(self, topic: str) -> int: ...

    async def _send_slowly(
        self,
        message: Message,
        prepared: PreparedMessage,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        arg: Any,
        sharding_key: str | None,
        first: MessageQueue | None = None,
    ) -> SendResult:
        """The coroutine path of send_nowait: route lookup or connect first (see the docstring);
        `first` is the queue of the first attempt, when the fast path chose one."""
        topic = message.topic
        if queue is None and selector is None and sharding_key is None:
            return await self._send_with_retries(topic, prepared, first=first)
        info = await self.publish_info(topic)  # also learns the brokers' addresses
        if queue is None:
            queue = explicit_queue(info.queues, message, selector, arg, sharding_key)
        deadline = self._clock.monotonic_ms() + self.send_timeout_ms
        return await self._send_once(
            topic, queue, prepared, deadline, code=RequestCode.SEND_MESSAGE_V2
        )

    async def _send_with_retries(
        self,
        topic: str,
        prepared: PreparedMessage,
        *,
        batch: bool = False,
        deadline_ms: float | None = None,
        attempts_made: int = 0,
        last_failed: str | None = None,
        last_error: Exception | None = None,
        first: MessageQueue | None = None,
    ) -> SendResult:
        """Up to 1 + retry_times attempts within one send timeout; a caller that made the first
        attempts itself passes its deadline, their count and the last failure, one that chose
        the first attempt's queue passes it as `first`."""
        if deadline_ms is None:
            deadline_ms = self._clock.monotonic_ms() + self.send_timeout_ms
        info = await self.publish_info(topic)
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        for attempt in range(attempts_made, 1 + self.retry_times):
            now = self._clock.monotonic_ms()
            if now >= deadline_ms:
                break
            queue = first or select_queue(
                info.queues,
                self._next_index(topic),
                self.faults,
                now,
                last_failed_broker=last_failed,
            )
            first = None
            try:
                return await self._send_once(topic, queue, prepared, deadline_ms, code=code)
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                logger.info(
                    "send to %s failed (attempt %d of %d): %s",
                    queue,
                    attempt + 1,
                    1 + self.retry_times,
                    exc,
                )
                last_failed, last_error = queue.broker_name, exc
        if last_error is not None:
            raise last_error
        raise RequestTimeoutError(f"send to {topic} timed out after {self.send_timeout_ms} ms")

    async def _send_once(
        self,
        topic: str,
        queue: MessageQueue,
        prepared: PreparedMessage,
        deadline_ms: float,
        *,
        code: int,
    ) -> SendResult:
        addr = self._instance.master_address(queue.broker_name)
        cmd = send_request(self._group, topic, queue, prepared, code, self._clock.now_ms())
        started = self._clock.monotonic_ms()
        try:
            response = await self._instance.remoting.invoke(addr, cmd, deadline_ms - started)
            result = send_result(topic, queue, prepared.uniq_key, response)
        except Exception:
            self.faults.record(queue.broker_name, 0.0, self._clock.monotonic_ms(), failed=True)
            raise
        finished = self._clock.monotonic_ms()
        self.faults.record(queue.broker_name, finished - started, finished, failed=False)
        return result
