"""JSON bodies between clients and brokers (remoting.md §4.4, §4.6, §4.10, §4.12).

Conventions as in `bodies` (which re-exports everything here). HEART_BEAT is the body with the most
dialects: C++ sends enum ordinals, `subVersion` as a string, omits empty data sets and `tagsSet`/
`codeSet` for "*", and appends "\\n"; Java and ali-ons send enum names and numbers. All are read;
writers use Java's form (enum names, numbers).

The broker must not trust `codeSet` (C++ fills it with atoi(tag), i.e. zeros): recompute codes from
`sub_string` with `message.parse_tag_expression`.

Maps keyed by MessageQueue (TopicStatsTable, ConsumeStats, ResetOffsetBody, ConsumerRunningInfo's
mqTable) are written as fastjson writes them, with OBJECT keys, which is not standard JSON but what
rocketmq-exporter and rocketmq-dashboard read:

    {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":0,...}}}

(`dump_queue_map`). Readers take that form (_json.quote_object_keys) and TideMQ's older list of
flat rows, `{"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","minOffset":0,...}]}`
(`read_queue_map`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from tidemq.protocol._json import (
    ObjectReader,
    as_object,
    dump,
    load_key_object,
    load_object,
    to_int,
    to_str,
)
from tidemq.protocol.message import (
    EXPRESSION_TYPE_TAG,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
)

# ---------------------------------------------------------------------------------------------
# Heartbeat (§4.4)


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    tags_set: frozenset[str] = frozenset()
    code_set: frozenset[int] = frozenset()
    sub_version: int = 0  # ms timestamp of the subscription
    expression_type: str = EXPRESSION_TYPE_TAG
    class_filter_mode: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": sorted(self.code_set),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": sorted(self.tags_set),
            "topic": self.topic,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "SubscriptionData") -> Self:
        r = ObjectReader(value, what)
        return cls(
            topic=r.req_str("topic"),
            sub_string=r.str_or("subString", "*"),
            tags_set=frozenset(r.list_of("tagsSet", to_str)),
            code_set=frozenset(r.list_of("codeSet", to_int)),
            sub_version=r.int_or("subVersion", 0),
            expression_type=r.str_or("expressionType", EXPRESSION_TYPE_TAG) or EXPRESSION_TYPE_TAG,
            class_filter_mode=r.bool_or("classFilterMode", False),
        )


@dataclass(frozen=True, slots=True)
class ProducerData:
    group_name: str

    def to_dict(self) -> dict[str, Any]:
        return {"groupName": self.group_name}

    @classmethod
    def from_dict(cls, value: Any, what: str = "ProducerData") -> Self:
        return cls(group_name=ObjectReader(value, what).req_str("groupName"))


@dataclass(frozen=True, slots=True)
class ConsumerData:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": self.consume_from_where.name,
            "consumeType": self.consume_type.name,
            "groupName": self.group_name,
            "messageModel": self.message_model.name,
            "subscriptionDataSet": [sub.to_dict() for sub in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "ConsumerData") -> Self:
        r = ObjectReader(value, what)
        return cls(
            group_name=r.req_str("groupName"),
            consume_type=ConsumeType.parse(
                r.raw("consumeType", ConsumeType.CONSUME_PASSIVELY.value)
            ),
            message_model=MessageModel.parse(r.raw("messageModel", MessageModel.CLUSTERING.value)),
            consume_from_where=ConsumeFromWhere.parse(
                r.raw("consumeFromWhere", ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET.value)
            ),
            subscription_data_set=r.list_of("subscriptionDataSet", SubscriptionData.from_dict),
            unit_mode=r.bool_or("unitMode", False),
        )


@dataclass(frozen=True, slots=True)
class HeartbeatData:
    """Body of HEART_BEAT (34): every producer and consumer group of one client process."""

    client_id: str
    producer_data_set: list[ProducerData] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump(
            {
                "clientID": self.client_id,
                "consumerDataSet": [consumer.to_dict() for consumer in self.consumer_data_set],
                "producerDataSet": [producer.to_dict() for producer in self.producer_data_set],
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            client_id=r.req_str("clientID"),
            producer_data_set=r.list_of("producerDataSet", ProducerData.from_dict),
            consumer_data_set=r.list_of("consumerDataSet", ConsumerData.from_dict),
        )


@dataclass(frozen=True, slots=True)
class ConsumerListBody:
    """Body of the GET_CONSUMER_LIST_BY_GROUP (38) response."""

    consumer_id_list: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump({"consumerIdList": self.consumer_id_list})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(consumer_id_list=r.list_of("consumerIdList", to_str))


# ---------------------------------------------------------------------------------------------
# Message queues and orderly locks (§4.10)


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker; hashable, ordered by (topic, broker_name, queue_id)."""

    topic: str
    broker_name: str
    queue_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_dict(cls, value: Any, what: str = "MessageQueue") -> Self:
        r = ObjectReader(value, what)
        return cls(
            topic=r.req_str("topic"),
            broker_name=r.req_str("brokerName"),
            queue_id=r.req_int("queueId"),
        )


T = TypeVar("T")


def dump_queue_map(items: Iterable[tuple[MessageQueue, Any]]) -> bytes:
    """fastjson's text of a Map<MessageQueue, V>: `{{mq}:value,...}` (keys sorted)."""
    parts = [dump(queue.to_dict()) + b":" + dump(value) for queue, value in sorted(items)]
    return b"{" + b",".join(parts) + b"}"


def read_queue_map(value: Any, what: str, item: Callable[[Any, str], T]) -> dict[MessageQueue, T]:
    """A Map<MessageQueue, V> in fastjson's form (keys quoted by load_object) or TideMQ's older
    list of rows that carry the queue's and the value's keys together."""
    if value is None:
        return {}
    if isinstance(value, list):
        return {
            MessageQueue.from_dict(row, f"{what}[{i}]"): item(row, f"{what}[{i}]")
            for i, row in enumerate(value)
        }
    table: dict[MessageQueue, T] = {}
    for key, element in as_object(value, what).items():
        queue = MessageQueue.from_dict(load_key_object(key, what), f"{what} key")
        table[queue] = item(element, f"{what}[{queue}]")
    return table


def splice(fields: dict[str, Any], raw: dict[str, bytes]) -> bytes:
    """A JSON object of `fields` plus members whose values are already text (`raw`), keys
    sorted as fastjson writes them."""
    parts = {name: dump(value) for name, value in fields.items()}
    parts.update(raw)
    return b"{" + b",".join(dump(k) + b":" + parts[k] for k in sorted(parts)) + b"}"


def _mq_list(queues: frozenset[MessageQueue]) -> list[dict[str, Any]]:
    return [queue.to_dict() for queue in sorted(queues)]


@dataclass(frozen=True, slots=True)
class LockBatchRequestBody:
    """Body of LOCK_BATCH_MQ (41)."""

    consumer_group: str
    client_id: str
    mq_set: frozenset[MessageQueue] = frozenset()

    def to_json(self) -> bytes:
        return dump(
            {
                "clientId": self.client_id,
                "consumerGroup": self.consumer_group,
                "mqSet": _mq_list(self.mq_set),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            consumer_group=r.req_str("consumerGroup"),
            client_id=r.req_str("clientId"),
            mq_set=frozenset(r.list_of("mqSet", MessageQueue.from_dict)),
        )


@dataclass(frozen=True, slots=True)
class UnlockBatchRequestBody(LockBatchRequestBody):
    """Body of UNLOCK_BATCH_MQ (42); same fields as the lock request."""


@dataclass(frozen=True, slots=True)
class LockBatchResponseBody:
    """The queues now locked by the requesting client."""

    lock_ok_mq_set: frozenset[MessageQueue] = frozenset()

    def to_json(self) -> bytes:
        return dump({"lockOKMQSet": _mq_list(self.lock_ok_mq_set)})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(lock_ok_mq_set=frozenset(r.list_of("lockOKMQSet", MessageQueue.from_dict)))


# ---------------------------------------------------------------------------------------------
# Admin statistics (§4.12), in fastjson's map form (see the module docstring)


@dataclass(frozen=True, slots=True)
class TopicOffset:
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0  # ms


@dataclass(frozen=True, slots=True)
class TopicStatsTable:
    """Body of the GET_TOPIC_STATS_INFO (202) response."""

    offset_table: dict[MessageQueue, TopicOffset] = field(default_factory=dict)

    def to_json(self) -> bytes:
        table = dump_queue_map(
            (
                queue,
                {
                    "lastUpdateTimestamp": offset.last_update_timestamp,
                    "maxOffset": offset.max_offset,
                    "minOffset": offset.min_offset,
                },
            )
            for queue, offset in self.offset_table.items()
        )
        return splice({}, {"offsetTable": table})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        what = cls.__name__
        obj = load_object(data, what)
        return cls(offset_table=read_queue_map(obj.get("offsetTable"), what, _topic_offset))


def _topic_offset(value: Any, what: str) -> TopicOffset:
    r = ObjectReader(value, what)
    return TopicOffset(
        min_offset=r.int_or("minOffset", 0),
        max_offset=r.int_or("maxOffset", 0),
        last_update_timestamp=r.int_or("lastUpdateTimestamp", 0),
    )


@dataclass(frozen=True, slots=True)
class OffsetWrapper:
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0  # ms, store time of the last consumed message


@dataclass(frozen=True, slots=True)
class ConsumeStats:
    """Body of the GET_CONSUME_STATS (208) response."""

    offset_table: dict[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    def to_json(self) -> bytes:
        table = dump_queue_map(
            (
                queue,
                {
                    "brokerOffset": offset.broker_offset,
                    "consumerOffset": offset.consumer_offset,
                    "lastTimestamp": offset.last_timestamp,
                },
            )
            for queue, offset in self.offset_table.items()
        )
        return splice({"consumeTps": self.consume_tps}, {"offsetTable": table})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        what = cls.__name__
        obj = load_object(data, what)
        r = ObjectReader(obj, what)
        return cls(
            offset_table=read_queue_map(obj.get("offsetTable"), what, _offset_wrapper),
            consume_tps=r.float_or("consumeTps", 0.0),
        )


def _offset_wrapper(value: Any, what: str) -> OffsetWrapper:
    r = ObjectReader(value, what)
    return OffsetWrapper(
        broker_offset=r.int_or("brokerOffset", 0),
        consumer_offset=r.int_or("consumerOffset", 0),
        last_timestamp=r.int_or("lastTimestamp", 0),
    )
