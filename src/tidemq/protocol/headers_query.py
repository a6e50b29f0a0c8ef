"""Typed headers of offsets, lookups and client registration (remoting.md §4.3 to §4.9).

Conventions as in `headers_send`; everything here is re-exported by `headers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Self

from tidemq.protocol._fields import FieldReader, render

# QUERY_MESSAGE's flag for a UNIQ_KEY lookup (not a header field in Java, an extra ext field).
UNIQUE_KEY_QUERY_FIELD: Final = "_UNIQUE_KEY_QUERY"

# ---------------------------------------------------------------------------------------------
# Consumer offsets (14, 15) and offset lookups (29-32): §4.3, §4.7


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {"consumerGroup": self.consumer_group, "topic": self.topic, "queueId": self.queue_id}
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            consumer_group=r.req_str("consumerGroup"),
            topic=r.req_str("topic"),
            queue_id=r.req_int("queueId"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetResponseHeader:
    """`offset` answer of QUERY_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET and SEARCH_OFFSET."""

    offset: int

    def to_fields(self) -> dict[str, str]:
        return render({"offset": self.offset})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(offset=FieldReader(cls.__name__, fields).req_int("offset"))


# The same one-field header under the name Java gives it for code 14.
QueryConsumerOffsetResponseHeader = OffsetResponseHeader


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "consumerGroup": self.consumer_group,
                "topic": self.topic,
                "queueId": self.queue_id,
                "commitOffset": self.commit_offset,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            consumer_group=r.req_str("consumerGroup"),
            topic=r.req_str("topic"),
            queue_id=r.req_int("queueId"),
            commit_offset=r.req_int("commitOffset"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _TopicQueueHeader:
    """(topic, queueId): asked by GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic, "queueId": self.queue_id})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(topic=r.req_str("topic"), queue_id=r.req_int("queueId"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMaxOffsetRequestHeader(_TopicQueueHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMinOffsetRequestHeader(_TopicQueueHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class GetEarliestMsgStoretimeRequestHeader(_TopicQueueHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOffsetRequestHeader:
    topic: str
    queue_id: int
    timestamp: int  # ms

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic, "queueId": self.queue_id, "timestamp": self.timestamp})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            topic=r.req_str("topic"),
            queue_id=r.req_int("queueId"),
            timestamp=r.req_int("timestamp"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EarliestMsgStoretimeResponseHeader:
    timestamp: int  # ms; -1 for an unknown queue

    def to_fields(self) -> dict[str, str]:
        return render({"timestamp": self.timestamp})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(timestamp=FieldReader(cls.__name__, fields).req_int("timestamp"))


# ---------------------------------------------------------------------------------------------
# Lookup by id or key (33, 12): §4.8


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewMessageRequestHeader:
    offset: int  # commit-log (physical) offset, decoded from an offsetMsgId

    def to_fields(self) -> dict[str, str]:
        return render({"offset": self.offset})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(offset=FieldReader(cls.__name__, fields).req_int("offset"))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageRequestHeader:
    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    unique_key_query: bool = False  # wire "_UNIQUE_KEY_QUERY", sent only when true

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "topic": self.topic,
                "key": self.key,
                "maxNum": self.max_num,
                "beginTimestamp": self.begin_timestamp,
                "endTimestamp": self.end_timestamp,
                UNIQUE_KEY_QUERY_FIELD: True if self.unique_key_query else None,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            topic=r.req_str("topic"),
            key=r.req_str("key"),
            max_num=r.req_int("maxNum"),
            begin_timestamp=r.req_int("beginTimestamp"),
            end_timestamp=r.req_int("endTimestamp"),
            unique_key_query=r.bool_or(UNIQUE_KEY_QUERY_FIELD, False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageResponseHeader:
    index_last_update_timestamp: int
    index_last_update_phyoffset: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "indexLastUpdateTimestamp": self.index_last_update_timestamp,
                "indexLastUpdatePhyoffset": self.index_last_update_phyoffset,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            index_last_update_timestamp=r.req_int("indexLastUpdateTimestamp"),
            index_last_update_phyoffset=r.req_int("indexLastUpdatePhyoffset"),
        )


# ---------------------------------------------------------------------------------------------
# Client registration (35, 38, 40) and send-back (36): §4.5, §4.6, §4.9


@dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterClientRequestHeader:
    """C++ sends "" for the group it does not use; that parses as None."""

    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "clientID": self.client_id,
                "producerGroup": self.producer_group,
                "consumerGroup": self.consumer_group,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            client_id=r.req_str("clientID"),
            producer_group=r.opt_str_nonempty("producerGroup"),
            consumer_group=r.opt_str_nonempty("consumerGroup"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _ConsumerGroupHeader:
    consumer_group: str

    def to_fields(self) -> dict[str, str]:
        return render({"consumerGroup": self.consumer_group})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(consumer_group=FieldReader(cls.__name__, fields).req_str("consumerGroup"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerListByGroupRequestHeader(_ConsumerGroupHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConsumerIdsChangedRequestHeader(_ConsumerGroupHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSendMsgBackRequestHeader:
    offset: int  # commit-log offset of the message to retry
    group: str
    delay_level: int = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "offset": self.offset,
                "group": self.group,
                "delayLevel": self.delay_level,
                "originMsgId": self.origin_msg_id,
                "originTopic": self.origin_topic,
                "unitMode": self.unit_mode,
                "maxReconsumeTimes": self.max_reconsume_times,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            offset=r.req_int("offset"),
            group=r.req_str("group"),
            delay_level=r.req_int("delayLevel"),
            origin_msg_id=r.opt_str_nonempty("originMsgId"),
            origin_topic=r.opt_str_nonempty("originTopic"),
            unit_mode=r.bool_or("unitMode", False),
            max_reconsume_times=r.opt_int("maxReconsumeTimes"),
        )
