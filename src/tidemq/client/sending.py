"""What one send is made of, apart from the Producer's routing and retries: the message as it goes
on the wire, and the bookkeeping of sends in flight on the producer's fast path.

Preparing (`prepare_message`): validate, compress a large body if it shrinks, make the properties
text, set sysFlag PREPARED on a half message (TRAN_MSG true, as the Java producer sets it). A plain
message (no user properties, keys, delay or deliver time; tags allowed) gets its properties text
from one format string; any other goes through the property map and `encode_properties`, and both
give the same text (tests/client compare them).

The fast path (`Producer.send_nowait`, which `send` awaits): one `SendWaiter` per attempt is
registered with the connection (`Connection.start_request`) and completed from its read callback,
so a send that succeeds on its first attempt costs no coroutine, no task and no timer of its own.
`SendTimeouts` holds the waiters in flight and one timer, set for the earliest deadline, that
expires them (scheduling and cancelling a timer per send costs ~2.4 µs under uvloop, about a fifth
of a whole send).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidemq.errors import (
    BrokerError,
    ClientClosedError,
    ClientError,
    MessageTooLargeError,
    error_for_code,
)
from tidemq.limits import MESSAGE_BODY_SIZE_MAX
from tidemq.protocol import compression
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import parse_send_response, send_fields_v2
from tidemq.remoting.connection import Connection

from .message import Message, SendResult, SendStatus
from .route_cache import DEFAULT_TOPIC_QUEUES_PER_BROKER

# As the Java/C++ clients' compressMsgBodyOverHowmuch and zlib level.
COMPRESS_OVER_BYTES_DEFAULT: Final = 4 * 1024
COMPRESS_LEVEL_DEFAULT: Final = 5

_NV, _SEP = pm.NAME_VALUE_SEPARATOR, pm.PROPERTY_SEPARATOR
# The properties of a plain message, from the first key to the UNIQ_KEY value, and after it.
_PLAIN_HEAD: Final = f"{pm.UNIQ_KEY}{_NV}"
_PLAIN_TAIL: Final = f"{_SEP}{pm.WAIT}{_NV}true{_SEP}"
_TAGS_HEAD: Final = f"{pm.TAGS}{_NV}"

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]

_STATUS_BY_CODE: Final[dict[int, SendStatus]] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# Retried in addition to the codes errors.py marks retriable (see the producer's docstring).
_ALSO_RETRIED: Final = frozenset({ResponseCode.NO_PERMISSION})


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A message as it goes on the wire: encoded properties (None for a batch, whose messages
    carry their own), body, sys flag, flag, and the UNIQ_KEY its SendResult reports."""

    properties: str | None
    body: bytes
    sys_flag: int
    flag: int = 0
    uniq_key: str = ""


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


def send_properties(message: Message, uniq_key: str) -> tuple[str, str]:
    """(properties text, the message's UNIQ_KEY): `encode_properties(message_properties(...))`,
    formatted directly for a plain message (`uniq_key` is the producer's, so it has no
    separator). Raises ProtocolError as encode_properties does."""
    tags = message.tags
    if (
        not message.properties
        and not message.keys
        and message.delay_level <= 0
        and message.deliver_time_ms is None
        and (not tags or (_NV not in tags and _SEP not in tags))
    ):
        text = _PLAIN_HEAD + uniq_key + _PLAIN_TAIL
        return (text + _TAGS_HEAD + tags + _SEP if tags else text), uniq_key
    properties = message_properties(message, uniq_key)
    return pm.encode_properties(properties), properties[pm.UNIQ_KEY]


def validate_message(
    message: Message, max_message_size: int, checked_topics: set[str] | None = None
) -> None:
    """Raise ProtocolError, ValueError or MessageTooLargeError for a message no broker takes.

    `checked_topics` remembers topic names that passed (a producer sends to few topics, and the
    name check is a regular expression)."""
    topic = message.topic
    if checked_topics is None or topic not in checked_topics:
        pm.validate_topic(topic)
        if pm.is_system_topic(topic):
            raise ValueError(f"topic {topic!r} is a system topic; clients may not send to it")
        if checked_topics is not None:
            checked_topics.add(topic)
    if not message.body:
        raise ValueError("message body is empty")
    if len(message.body) > max_message_size:
        raise MessageTooLargeError(
            f"message body of {len(message.body)} bytes exceeds max_message_size {max_message_size}"
        )


def prepare_parts(
    message: Message,
    uniq_key: str,
    compress_over_bytes: int,
    compress_level: int,
    max_message_size: int,
    checked_topics: set[str] | None,
    codec_bits: int | None = 0,
) -> tuple[str, bytes, int, str]:
    """(properties, body, sys flag, UNIQ_KEY) of prepare_message, without the object.

    A body of at least `compress_over_bytes` is compressed with the codec of `codec_bits`
    (protocol/compression.py; None: never) if that pays: zlib judges a sample first, and a
    result that did not shrink is not sent."""
    body, sys_flag = message.body, 0
    size = len(body)
    if (
        checked_topics is None
        or message.topic not in checked_topics
        or not 0 < size <= max_message_size
    ):
        validate_message(message, max_message_size, checked_topics)
    if size >= compress_over_bytes and codec_bits is not None:
        packed = compression.compress(body, codec_bits, compress_level)
        if packed is not None:
            body, sys_flag = packed, pm.SysFlag.COMPRESSED | codec_bits
    properties, key = send_properties(message, uniq_key)
    if message.properties and pm.is_true_text(message.properties.get(pm.TRAN_MSG)):
        # A half message, flagged as the Java producer flags it (the broker reads the property).
        sys_flag |= pm.SysFlag.PREPARED
    return properties, body, sys_flag, key


def prepare_message(
    message: Message,
    uniq_key: str,
    *,
    compress_over_bytes: int = COMPRESS_OVER_BYTES_DEFAULT,
    compress_level: int = COMPRESS_LEVEL_DEFAULT,
    max_message_size: int = MESSAGE_BODY_SIZE_MAX,
    checked_topics: set[str] | None = None,
    codec_bits: int | None = 0,
) -> PreparedMessage:
    """Validate and encode one message (raises ValueError, ProtocolError, MessageTooLargeError)."""
    properties, body, sys_flag, key = prepare_parts(
        message,
        uniq_key,
        compress_over_bytes,
        compress_level,
        max_message_size,
        checked_topics,
        codec_bits,
    )
    return PreparedMessage(properties, body, sys_flag, message.flag, key)


def prepare_batch(
    messages: Sequence[Message],
    next_key: Callable[[], str],
    max_message_size: int,
    checked_topics: set[str] | None = None,
) -> PreparedMessage:
    """One SEND_BATCH_MESSAGE body: the messages (one topic, no delays) with their properties;
    its uniq_key is their UNIQ_KEYs comma-joined (raises as prepare_message, and ValueError)."""
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
        validate_message(message, max_message_size, checked_topics)
        properties, key = send_properties(message, next_key())
        keys.append(key)
        items.append(pm.BatchItem(flag=message.flag, body=message.body, properties=properties))
    body = pm.encode_batch(items)
    if len(body) > max_message_size:
        raise MessageTooLargeError(
            f"batch of {len(body)} bytes exceeds max_message_size {max_message_size}"
        )
    return PreparedMessage(None, body, 0, 0, ",".join(keys))


def explicit_queue(
    queues: Sequence[MessageQueue],
    message: Message,
    selector: QueueSelector | None,
    arg: Any,
    sharding_key: str | None,
) -> MessageQueue:
    """The queue `selector(queues, message, arg)` picks, else the sharding key's (its Java
    string hash modulo the queue count, so one key always lands on one queue)."""
    if selector is not None:
        return selector(queues, message, arg)
    assert sharding_key is not None
    return queues[pm.java_string_hash(sharding_key) % len(queues)]


def send_request(
    group: str,
    topic: str,
    queue: MessageQueue,
    prepared: PreparedMessage,
    code: int,
    born_ms: int,
) -> RemotingCommand:
    """The SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE (`code`) request of `prepared` to `queue`."""
    batch = code == RequestCode.SEND_BATCH_MESSAGE
    fields = send_fields_v2(
        group,
        topic,
        pm.TBW102,
        DEFAULT_TOPIC_QUEUES_PER_BROKER,
        queue.queue_id,
        prepared.sys_flag,
        born_ms,
        0 if batch else prepared.flag,
        prepared.properties,
        batch,
        queue.broker_name,
    )
    return RemotingCommand(code=code, ext_fields=fields, body=prepared.body)


def send_result(
    topic: str, queue: MessageQueue, uniq_key: str, response: RemotingCommand
) -> SendResult:
    """The SendResult of a send's answer.

    Raises:
        BrokerError: the code is not one of the four that mean "stored".
        ProtocolError: the response header is malformed.
    """
    status = _STATUS_BY_CODE.get(response.code)
    if status is None:
        raise error_for_code(response.code, response.remark)
    msg_id, queue_id, queue_offset, transaction_id = parse_send_response(response.ext_fields)
    if queue_id != queue.queue_id or queue.topic != topic:
        queue = MessageQueue(topic=topic, broker_name=queue.broker_name, queue_id=queue_id)
    return SendResult(status, uniq_key, msg_id, queue, queue_offset, transaction_id)


def is_retriable(exc: Exception) -> bool:
    """Whether another attempt (on the next queue) may succeed after `exc`."""
    if isinstance(exc, ClientClosedError):
        return False
    if isinstance(exc, BrokerError):
        return exc.retriable or exc.response_code in _ALSO_RETRIED
    return isinstance(exc, ClientError) and exc.retriable


class SendWaiter:
    """One fast-path attempt, registered with a connection as its ResponseWaiter; it carries the
    prepared message's parts (`prepared()` rebuilds the object for a retry).

    The connection calls `set_result` with the response or `set_exception` with a transport
    failure; both hand over to `on_response` / `on_failure`, which the producer supplies (it
    owns fault records and retries). `done()` is false until the attempt is settled."""

    __slots__ = (
        "body",
        "connection",
        "deadline_ms",
        "expires_at",
        "flag",
        "future",
        "on_failure",
        "on_response",
        "opaque",
        "properties",
        "queue",
        "retry",
        "settled",
        "started_ms",
        "sys_flag",
        "topic",
        "uniq_key",
    )

    def __init__(
        self,
        topic: str,
        queue: MessageQueue,
        parts: tuple[str, bytes, int, str],
        flag: int,
        future: asyncio.Future[SendResult],
        started_ms: float,
        deadline_ms: float,
        retry: bool,
        on_response: Callable[[SendWaiter, RemotingCommand], None],
        on_failure: Callable[[SendWaiter, Exception], None],
    ) -> None:
        self.topic = topic
        self.queue = queue
        self.properties, self.body, self.sys_flag, self.uniq_key = parts
        self.flag = flag
        self.future = future
        self.started_ms = started_ms
        self.deadline_ms = deadline_ms
        self.retry = retry
        self.on_response = on_response
        self.on_failure = on_failure
        self.settled = False
        self.connection: Connection | None = None
        self.opaque = 0
        self.expires_at = 0.0  # loop time (s), set by SendTimeouts.add

    def prepared(self) -> PreparedMessage:
        return PreparedMessage(self.properties, self.body, self.sys_flag, self.flag, self.uniq_key)

    def done(self) -> bool:
        return self.settled

    def set_result(self, result: RemotingCommand, /) -> None:
        self.on_response(self, result)

    def set_exception(self, exception: BaseException, /) -> None:
        assert isinstance(exception, Exception), exception
        self.on_failure(self, exception)


class SendTimeouts:
    """Fast-path attempts in flight, and the one timer that expires them.

    The timer is set for the earliest deadline; when it fires, every due attempt is passed to
    `on_expired` and the timer is set again for the earliest left. With one send timeout per
    producer that is about one firing per timeout, each a scan of the attempts in flight."""

    __slots__ = ("_loop", "_on_expired", "_timer", "_timer_at", "_waiters")

    def __init__(self, on_expired: Callable[[SendWaiter], None]) -> None:
        self._on_expired = on_expired
        self._loop: asyncio.AbstractEventLoop | None = None  # the first add's
        self._waiters: set[SendWaiter] = set()
        self._timer: asyncio.TimerHandle | None = None
        # The loop time the timer was asked for (TimerHandle.when() may differ by its rounding,
        # which would make every add in one loop turn set the timer again).
        self._timer_at = 0.0

    def __len__(self) -> int:
        return len(self._waiters)

    def add(self, waiter: SendWaiter, timeout_ms: float) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        expires_at = loop.time() + max(timeout_ms, 0.0) / 1000
        waiter.expires_at = expires_at
        self._waiters.add(waiter)
        timer = self._timer
        if timer is None or expires_at < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(expires_at, self._fire)
            self._timer_at = expires_at

    def discard(self, waiter: SendWaiter) -> None:
        self._waiters.discard(waiter)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = [waiter for waiter in self._waiters if waiter.expires_at <= now]
        for waiter in due:
            self._waiters.discard(waiter)
            self._on_expired(waiter)
        if self._waiters and self._timer is None:
            earliest = min(waiter.expires_at for waiter in self._waiters)
            self._timer = loop.call_at(earliest, self._fire)
            self._timer_at = earliest


def settle_send(task: asyncio.Task[SendResult], future: asyncio.Future[SendResult]) -> None:
    """Complete `future` with the outcome of a send's coroutine path, `task` (unless the
    caller already ended it; a cancelled task leaves it as it is)."""
    if future.done() or task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
