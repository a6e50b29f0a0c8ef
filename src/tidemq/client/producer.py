"""The asyncio producer: route lookup, queue choice, retries with broker fault avoidance.

One `send` is: publish queues of the topic (cached route; on TOPIC_NOT_EXIST from the name server,
the TBW102 route with at most 4 queues per broker, so the broker auto-creates the topic, as the
C++ client does) → round-robin queue choice skipping brokers that failed recently (client/fault.py
has the rule and its table) → SEND_MESSAGE_V2 (310) to the queue's master.

Retries: up to `retry_times` more attempts, all within one `send_timeout_ms` budget, each on the
next queue and preferably on another broker than the one that just failed. Retried: timeouts,
closed connections and the retriable broker codes (errors._RETRIABLE_CODES, plus NO_PERMISSION,
which a broker whose write permission was wiped for maintenance answers). Not retried: invalid
messages and the other codes; and a send to an explicit queue, selector or sharding key (moving
it would break the order the caller asked for).

Pipelining: `send` is a coroutine, so many sends are in flight at once by awaiting them together
(`await asyncio.gather(*(p.send(m) for m in msgs))`) — they share one connection per broker and
are paired by opaque. `send_nowait(msg)` starts one and returns its future, like RocketMQ's
async send with a callback.

Properties set on every message (remoting.md §6.3): UNIQ_KEY (client message id, kept if the
caller already set one), WAIT=true, TAGS, KEYS (space-joined), DELAY (when delay_level > 0),
TIMER_DELIVER_MS (when deliver_time_ms is set). A body
of at least `compress_over_bytes` is zlib-compressed and flagged COMPRESSED (not for batches).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidemq.clock import Clock
from tidemq.errors import (
    BrokerError,
    ClientClosedError,
    ClientError,
    MessageTooLargeError,
    NoRouteError,
    RequestTimeoutError,
    error_for_code,
)
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, SEND_TIMEOUT_MS_DEFAULT
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue, TopicRouteData
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    SendMessageResponseHeader,
    send_fields_v2,
)

from .fault import FaultTracker, select_queue
from .instance import ClientInstance
from .message import Message, MessageExt, SendResult, SendStatus
from .route_cache import DEFAULT_TOPIC_QUEUES_PER_BROKER, PublishInfo, publish_queues

logger = logging.getLogger(__name__)

# As the Java/C++ clients' compressMsgBodyOverHowmuch and zlib level.
COMPRESS_OVER_BYTES_DEFAULT: Final = 4 * 1024
COMPRESS_LEVEL_DEFAULT: Final = 5
# How long a topic unknown to the name server keeps using the TBW102 route before asking again.
DEFAULT_ROUTE_TTL_MS: Final = 3_000

_STATUS_BY_CODE: Final = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# Retried in addition to the codes errors.py marks retriable (see the module docstring).
_ALSO_RETRIED: Final = frozenset({ResponseCode.NO_PERMISSION})

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A message as it goes on the wire: final properties, body and sys flag."""

    properties: dict[str, str]
    body: bytes
    sys_flag: int
    flag: int = 0

    @property
    def uniq_key(self) -> str:
        return self.properties.get(pm.UNIQ_KEY, "")


def message_properties(message: Message, uniq_key: str) -> dict[str, str]:
    """User properties plus the system ones the producer owns."""
    properties = dict(message.properties)
    properties.setdefault(pm.UNIQ_KEY, uniq_key)
    properties[pm.WAIT] = "true"
    if message.tags:
        properties[pm.TAGS] = message.tags
    if message.keys:
        properties[pm.KEYS] = " ".join(message.keys)
    if message.delay_level > 0:
        properties[pm.DELAY] = str(message.delay_level)
    if message.deliver_time_ms is not None:
        properties[pm.TIMER_DELIVER_MS] = str(message.deliver_time_ms)
    return properties


def prepare_message(
    message: Message,
    uniq_key: str,
    *,
    compress_over_bytes: int = COMPRESS_OVER_BYTES_DEFAULT,
    compress_level: int = COMPRESS_LEVEL_DEFAULT,
    max_message_size: int = MESSAGE_BODY_SIZE_MAX,
) -> PreparedMessage:
    """Validate and encode one message (raises ValueError, ProtocolError, MessageTooLargeError)."""
    validate_message(message, max_message_size)
    body, sys_flag = message.body, 0
    if len(body) >= compress_over_bytes:
        body = pm.deflate(body, level=compress_level)
        sys_flag |= pm.SysFlag.COMPRESSED
    return PreparedMessage(message_properties(message, uniq_key), body, int(sys_flag), message.flag)


def validate_message(message: Message, max_message_size: int) -> None:
    pm.validate_topic(message.topic)
    if pm.is_system_topic(message.topic):
        raise ValueError(f"topic {message.topic!r} is a system topic; clients may not send to it")
    if not message.body:
        raise ValueError("message body is empty")
    if len(message.body) > max_message_size:
        raise MessageTooLargeError(
            f"message body of {len(message.body)} bytes exceeds max_message_size {max_message_size}"
        )


def _is_retriable(exc: Exception) -> bool:
    if isinstance(exc, ClientClosedError):
        return False
    if isinstance(exc, BrokerError):
        return exc.retriable or exc.response_code in _ALSO_RETRIED
    return isinstance(exc, ClientError) and exc.retriable


class Producer:
    """Sends messages for producer group `group`. Use `async with Producer(...) as p:`."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT,
        retry_times: int = 2,
        compress_over_bytes: int = COMPRESS_OVER_BYTES_DEFAULT,
        compress_level: int = COMPRESS_LEVEL_DEFAULT,
        max_message_size: int = MESSAGE_BODY_SIZE_MAX,
        clock: Clock | None = None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
    ) -> None:
        pm.validate_group(group)
        if send_timeout_ms <= 0 or retry_times < 0 or max_message_size <= 0:
            raise ValueError("send_timeout_ms and max_message_size must be > 0, retry_times >= 0")
        self._group = group
        self._instance = instance or ClientInstance(
            namesrv_addr, clock=clock, instance_name=instance_name
        )
        self._clock = self._instance.clock
        self.send_timeout_ms = send_timeout_ms
        self.retry_times = retry_times
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.faults = FaultTracker()
        self._keys = pm.UniqueKeyGenerator(self._instance.client_ip, self._instance.pid)
        self._counters: dict[str, int] = {}
        self._default_routes: dict[str, tuple[PublishInfo, float]] = {}
        self._publish_infos: dict[str, tuple[TopicRouteData, PublishInfo]] = {}
        self._pending: set[asyncio.Future[SendResult]] = set()
        self._started = False
        self._closed = False

    @property
    def group(self) -> str:
        return self._group

    @property
    def instance(self) -> ClientInstance:
        return self._instance

    async def start(self) -> None:
        if self._started:
            return
        self._instance.register_producer(self)
        await self._instance.start()
        self._started = True

    async def shutdown(self) -> None:
        """Wait for `send_nowait` sends still in flight, unregister, close the instance."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._started:
            await self._instance.unregister_producer(self._group)
            await self._instance.shutdown()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"producer {self._group} is shut down")
        if not self._started:
            raise ClientError(f"producer {self._group} is not started")

    # -- routes ----------------------------------------------------------------------------

    async def publish_info(self, topic: str) -> PublishInfo:
        """The queues `topic` may be sent to (via TBW102 if the name server does not know it).

        Raises:
            NoRouteError: neither the topic nor TBW102 has a writable queue.
        """
        route = self._instance.routes.get(topic)
        if route is None:
            now = self._clock.monotonic_ms()
            cached = self._default_routes.get(topic)
            if cached is not None and now - cached[1] < DEFAULT_ROUTE_TTL_MS:
                return cached[0]
            self._instance.watch_topic(topic)
            try:
                route = await self._instance.fetch_route(topic)
            except BrokerError as exc:
                if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                default = await self._instance.route(pm.TBW102)
                info = PublishInfo(
                    topic,
                    tuple(
                        publish_queues(
                            topic, default, queues_per_broker_max=DEFAULT_TOPIC_QUEUES_PER_BROKER
                        )
                    ),
                    via_default=True,
                )
                if not info.queues:
                    raise NoRouteError(f"topic {topic!r} has no route and TBW102 no queue") from exc
                self._default_routes[topic] = (info, now)
                return info
        if self._default_routes:
            self._default_routes.pop(topic, None)
        # The queues are derived from the route object alone, so they are kept until the route
        # cache holds another object for the topic (every send asks; a refresh replaces it).
        cached_info = self._publish_infos.get(topic)
        if cached_info is not None and cached_info[0] is route:
            return cached_info[1]
        queues = tuple(publish_queues(topic, route))
        if not queues:
            raise NoRouteError(f"topic {topic!r} has no writable queue")
        info = PublishInfo(topic, queues)
        self._publish_infos[topic] = (route, info)
        return info

    def _next_index(self, topic: str) -> int:
        # Start each topic at a random queue so many producers do not all begin on queue 0.
        index = self._counters.get(topic)
        if index is None:
            index = int.from_bytes(os.urandom(2), "big")
        self._counters[topic] = index + 1
        return index

    # -- sending ---------------------------------------------------------------------------

    def _prepare(self, message: Message) -> PreparedMessage:
        return prepare_message(
            message,
            self._keys.next(self._clock.now_ms()),
            compress_over_bytes=self.compress_over_bytes,
            compress_level=self.compress_level,
            max_message_size=self.max_message_size,
        )

    async def send(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        """Send and await the broker's answer.

        Raises:
            ValueError, ProtocolError, MessageTooLargeError: the message is invalid.
            BrokerError: a non-retriable broker answer, or the last retriable one.
            RequestTimeoutError, ConnectionClosedError: the last attempt's transport failure.
            NoRouteError: the topic has no writable queue.
        """
        self._check_open()
        prepared = self._prepare(message)
        explicit = queue is not None or selector is not None or sharding_key is not None
        if not explicit:
            return await self._send_with_retries(message.topic, prepared)
        info = await self.publish_info(message.topic)  # also learns the brokers' addresses
        if queue is None:
            if selector is not None:
                queue = selector(info.queues, message, arg)
            else:
                assert sharding_key is not None
                index = pm.java_string_hash(sharding_key) % len(info.queues)
                queue = info.queues[index]
        deadline = self._clock.monotonic_ms() + self.send_timeout_ms
        return await self._send_once(
            message.topic, queue, prepared, deadline, code=RequestCode.SEND_MESSAGE_V2
        )

    def send_nowait(self, message: Message, **kwargs: Any) -> asyncio.Future[SendResult]:
        """Start a send and return its future (the result or the exception of `send`)."""
        self._check_open()
        future: asyncio.Future[SendResult] = asyncio.ensure_future(self.send(message, **kwargs))
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    async def send_oneway(self, message: Message) -> None:
        """Fire and forget: one attempt, no answer awaited (the write is)."""
        self._check_open()
        prepared = self._prepare(message)
        info = await self.publish_info(message.topic)
        now = self._clock.monotonic_ms()
        queue = select_queue(info.queues, self._next_index(message.topic), self.faults, now)
        cmd = self._request(message.topic, queue, prepared, RequestCode.SEND_MESSAGE_V2, False)
        await self._instance.remoting.invoke_oneway(
            self._instance.master_address(queue.broker_name), cmd
        )

    async def send_batch(self, messages: Sequence[Message]) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (320); no delay levels.

        The result's `msg_id` and `offset_msg_id` are comma-joined, one per message, in order;
        `queue_offset` is the first message's.
        """
        self._check_open()
        if not messages:
            raise ValueError("send_batch needs at least one message")
        topic = messages[0].topic
        items: list[pm.BatchItem] = []
        keys: list[str] = []
        for message in messages:
            if message.topic != topic:
                raise ValueError("all messages of a batch must have the same topic")
            if message.delay_level > 0 or message.deliver_time_ms is not None:
                raise ValueError("delayed messages cannot be sent in a batch")
            validate_message(message, self.max_message_size)
            properties = message_properties(message, self._keys.next(self._clock.now_ms()))
            keys.append(properties[pm.UNIQ_KEY])
            items.append(
                pm.BatchItem(
                    flag=message.flag,
                    body=message.body,
                    properties=pm.encode_properties(properties),
                )
            )
        body = pm.encode_batch(items)
        if len(body) > self.max_message_size:
            raise MessageTooLargeError(
                f"batch of {len(body)} bytes exceeds max_message_size {self.max_message_size}"
            )
        prepared = PreparedMessage({pm.UNIQ_KEY: ",".join(keys)}, body, 0)
        return await self._send_with_retries(topic, prepared, batch=True)

    async def _send_with_retries(
        self, topic: str, prepared: PreparedMessage, *, batch: bool = False
    ) -> SendResult:
        deadline = self._clock.monotonic_ms() + self.send_timeout_ms
        info = await self.publish_info(topic)
        last_failed: str | None = None
        last_error: Exception | None = None
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        for attempt in range(1 + self.retry_times):
            now = self._clock.monotonic_ms()
            if now >= deadline:
                break
            queue = select_queue(
                info.queues,
                self._next_index(topic),
                self.faults,
                now,
                last_failed_broker=last_failed,
            )
            try:
                return await self._send_once(topic, queue, prepared, deadline, code=code)
            except Exception as exc:
                if not _is_retriable(exc):
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

    def _request(
        self,
        topic: str,
        queue: MessageQueue,
        prepared: PreparedMessage,
        code: int,
        batch: bool,
    ) -> RemotingCommand:
        fields = send_fields_v2(
            self._group,
            topic,
            pm.TBW102,
            DEFAULT_TOPIC_QUEUES_PER_BROKER,
            queue.queue_id,
            prepared.sys_flag,
            self._clock.now_ms(),
            0 if batch else prepared.flag,
            None if batch else pm.encode_properties(prepared.properties),
            batch,
            queue.broker_name,
        )
        return RemotingCommand(code=code, ext_fields=fields, body=prepared.body)

    async def _send_once(
        self,
        topic: str,
        queue: MessageQueue,
        prepared: PreparedMessage,
        deadline_ms: float,
        *,
        code: int,
    ) -> SendResult:
        batch = code == RequestCode.SEND_BATCH_MESSAGE
        addr = self._instance.master_address(queue.broker_name)
        cmd = self._request(topic, queue, prepared, code, batch)
        started = self._clock.monotonic_ms()
        try:
            response = await self._instance.remoting.invoke(addr, cmd, deadline_ms - started)
            if response.code not in _STATUS_BY_CODE:
                raise error_for_code(response.code, response.remark)
            header = SendMessageResponseHeader.from_fields(response.ext_fields)
        except Exception:
            self.faults.record(queue.broker_name, 0.0, self._clock.monotonic_ms(), failed=True)
            raise
        finished = self._clock.monotonic_ms()
        self.faults.record(queue.broker_name, finished - started, finished, failed=False)
        return SendResult(
            status=_STATUS_BY_CODE[ResponseCode(response.code)],
            msg_id=prepared.uniq_key,
            offset_msg_id=header.msg_id,
            message_queue=MessageQueue(
                topic=topic, broker_name=queue.broker_name, queue_id=header.queue_id
            ),
            queue_offset=header.queue_offset,
            transaction_id=header.transaction_id,
        )

    async def on_check_transaction_state(
        self, broker_addr: str, header: CheckTransactionStateRequestHeader, message: MessageExt
    ) -> None:
        # Seam for the transactional producer (next issue): a plain producer has no local
        # transaction to consult, so the broker keeps asking until its check limit.
        logger.warning(
            "producer %s got a transaction check for %s but has no transaction listener",
            self._group,
            header.msg_id,
        )
