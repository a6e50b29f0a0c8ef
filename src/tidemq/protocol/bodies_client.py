"""JSON bodies between clients and brokers (remoting.md §4.4, §4.6, §4.10, §4.12).

Conventions as in `bodies` (which re-exports everything here). HEART_BEAT is the body with the most
dialects: C++ sends enum ordinals, `subVersion` as a string, omits empty data sets and `tagsSet`/
`codeSet` for "*", and appends "\\n"; Java and ali-ons send enum names and numbers. All are read;
writers use Java's form (enum names, numbers).

The broker must not trust `codeSet` (C++ fills it with atoi(tag), i.e. zeros): recompute codes from
`sub_string` with `message.parse_tag_expression`.

TopicStatsTable and ConsumeStats are TideMQ's own admin form: Java serialises them as maps keyed
by MessageQueue objects, which is not JSON; we send a list of flat rows instead:

    {"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","minOffset":0,...}, ...]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from tidemq.protocol._json import ObjectReader, dump, load_object, to_int, to_str
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
# Admin statistics (§4.12), in TideMQ's list form (see the module docstring)


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
        rows = [
            {
                **queue.to_dict(),
                "minOffset": offset.min_offset,
                "maxOffset": offset.max_offset,
                "lastUpdateTimestamp": offset.last_update_timestamp,
            }
            for queue, offset in sorted(self.offset_table.items())
        ]
        return dump({"offsetTable": rows})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(offset_table=dict(r.list_of("offsetTable", _topic_offset_row)))


def _topic_offset_row(value: Any, what: str) -> tuple[MessageQueue, TopicOffset]:
    r = ObjectReader(value, what)
    offset = TopicOffset(
        min_offset=r.int_or("minOffset", 0),
        max_offset=r.int_or("maxOffset", 0),
        last_update_timestamp=r.int_or("lastUpdateTimestamp", 0),
    )
    return MessageQueue.from_dict(value, what), offset


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
        rows = [
            {
                **queue.to_dict(),
                "brokerOffset": offset.broker_offset,
                "consumerOffset": offset.consumer_offset,
                "lastTimestamp": offset.last_timestamp,
            }
            for queue, offset in sorted(self.offset_table.items())
        ]
        return dump({"consumeTps": self.consume_tps, "offsetTable": rows})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            offset_table=dict(r.list_of("offsetTable", _offset_wrapper_row)),
            consume_tps=r.float_or("consumeTps", 0.0),
        )


def _offset_wrapper_row(value: Any, what: str) -> tuple[MessageQueue, OffsetWrapper]:
    r = ObjectReader(value, what)
    offset = OffsetWrapper(
        broker_offset=r.int_or("brokerOffset", 0),
        consumer_offset=r.int_or("consumerOffset", 0),
        last_timestamp=r.int_or("lastTimestamp", 0),
    )
    return MessageQueue.from_dict(value, what), offset
