"""The messages and results the client API speaks: what users build, send, receive and return.

`Message` is what a producer sends; `MessageExt` is what a consumer receives, decoded from the
stored record a pull returns (protocol/record.py is the one definition of that layout). Property
names, sys flags and the enums shared with the broker (MessageModel, ConsumeFromWhere) come from
protocol/message.py and are re-exported here, so user code imports one module.

Ids: `MessageExt.msg_id` is the client-made UNIQ_KEY when the producer set one (every TideMQ, Java
and C++ producer does), else the broker-made offsetMsgId (store host + commit-log offset), as the
C++ client does (remoting.md §5.2).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.compression import decompress
from tidemq.protocol.message import ConsumeFromWhere, MessageModel
from tidemq.protocol.record import StoredMessage

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12; the stub ships with the type checker
    from typing_extensions import Buffer

__all__ = [
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeResult",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "PullResult",
    "PullStatus",
    "SendResult",
    "SendStatus",
    "UndecodableMessage",
]


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """A message to send. `keys` are indexed for lookup; `tags` is what consumers filter on.

    `body` is bytes, a str (stored as UTF-8), or any other object with the buffer protocol
    (bytearray, memoryview, array.array, mmap, a NumPy array: its raw bytes are copied); anything
    else is a TypeError (an int would otherwise become that many zero bytes, a list of ints a
    body of those bytes).
    `properties` are user properties; the producer adds the system ones (UNIQ_KEY, TAGS, KEYS,
    WAIT, DELAY, TIMER_DELIVER_MS) when it sends. `delay_level` 1..18 maps to the broker's delay
    table (1 s … 2 h). `deliver_time_ms` is an absolute wall-clock time (ms since the epoch) before
    which consumers do not see the message (RocketMQ 5's TIMER_DELIVER_MS; up to the broker's
    horizon, 7 days by default). A message has at most one of the two.
    """

    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    delay_level: int
    flag: int
    deliver_time_ms: int | None

    def __init__(
        self,
        topic: str,
        body: Buffer | str,
        tags: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        flag: int = 0,
        deliver_time_ms: int | None = None,
    ) -> None:
        if delay_level < 0:
            raise ValueError(f"delay_level must be >= 0, got {delay_level}")
        if deliver_time_ms is not None:
            if deliver_time_ms < 0:
                raise ValueError(f"deliver_time_ms must be >= 0, got {deliver_time_ms}")
            if delay_level > 0:
                raise ValueError("a message has a delay_level or a deliver_time_ms, not both")
        init = object.__setattr__  # frozen: the dataclass way to set fields in __init__
        init(self, "topic", topic)
        init(self, "body", _body_bytes(body))
        init(self, "tags", tags)
        init(self, "keys", tuple(keys.split()) if isinstance(keys, str) else tuple(keys))
        init(self, "properties", {} if properties is None else properties)
        init(self, "delay_level", delay_level)
        init(self, "flag", flag)
        init(self, "deliver_time_ms", deliver_time_ms)


def _body_bytes(body: object) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        view = memoryview(body)  # type: ignore[arg-type]  # any buffer; not bytes(int)
    except TypeError:
        raise TypeError(
            f"Message body must be bytes or str (sent as UTF-8), not {type(body).__name__}: "
            f"encode it first, e.g. json.dumps(value).encode() or str(value)"
        ) from None
    with view:
        return view.tobytes()


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A received message, with where it is stored. `body` is already inflated."""

    topic: str
    body: bytes
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    broker_name: str
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def tags(self) -> str | None:
        return self.properties.get(pm.TAGS) or None

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.properties.get(pm.KEYS, "").split())

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(topic=self.topic, broker_name=self.broker_name, queue_id=self.queue_id)

    @classmethod
    def from_stored(cls, stored: StoredMessage, broker_name: str) -> MessageExt:
        """Decode what a pull (or view/query) returned; decompresses a COMPRESSED body by the
        codec its sysFlag names (raises ProtocolError, or CodecMissingError: lz4 or zstandard is
        not installed, so the pull fails and the message is kept rather than skipped)."""
        properties = pm.decode_properties(stored.properties)
        body = stored.body
        if stored.sys_flag & pm.SysFlag.COMPRESSED:
            body = decompress(body, stored.sys_flag)
        store_ip, store_port = stored.store_host
        offset_id = pm.offset_msg_id(store_ip, store_port, stored.physical_offset)
        return cls(
            topic=stored.topic,
            body=body,
            msg_id=properties.get(pm.UNIQ_KEY) or offset_id,
            offset_msg_id=offset_id,
            queue_id=stored.queue_id,
            queue_offset=stored.queue_offset,
            commit_log_offset=stored.physical_offset,
            broker_name=broker_name,
            flag=stored.flag,
            sys_flag=stored.sys_flag,
            born_timestamp=stored.born_timestamp,
            born_host=stored.born_host,
            store_timestamp=stored.store_timestamp,
            store_host=stored.store_host,
            reconsume_times=stored.reconsume_times,
            prepared_transaction_offset=stored.prepared_transaction_offset,
            properties=MappingProxyType(properties),
        )


class SendStatus(enum.Enum):
    """A stored message's durability. Anything but SEND_OK was stored but not (yet) flushed or
    replicated as the broker is configured to guarantee."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """`msg_id` is the UNIQ_KEY the producer made (comma-joined for a batch); `offset_msg_id` the
    broker's id (store host + commit-log offset; comma-joined for a batch)."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class UndecodableMessage:
    """A stored record a pull returned that the client could not decode, and so skipped.

    E.g. a body flagged COMPRESSED that is not zlib data, or a CRC mismatch. `queue_offset` is
    read from the record's own header, which may be what is corrupt: it is for reports, not for
    moving offsets (`PullResult.next_begin_offset` already lies past the record).
    """

    message_queue: MessageQueue
    queue_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class PullResult:
    """One pull's answer. Move to `next_begin_offset` in every case (remoting.md §4.2).

    `undecodable` lists the records of the answer that could not be decoded: they are not in
    `messages`, and `next_begin_offset` moves past them like past a filtered message, so one bad
    record never blocks the messages behind it (client/pull_answer.py).

    `suggest_which_broker_id` is the broker id of its group the answering broker suggests for
    the queue's next pull (0: the master); the consumers follow it (client/read_route.py).
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: Sequence[MessageExt] = ()
    undecodable: Sequence[UndecodableMessage] = ()
    suggest_which_broker_id: int = 0


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


# What a listener may return. None counts as success, so `def on(msgs): process(msgs)` works.
ConsumeResult = ConsumeConcurrentlyStatus | ConsumeOrderlyStatus | None
