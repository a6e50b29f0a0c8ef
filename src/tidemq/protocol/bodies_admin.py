"""Admin bodies with upstream's class and field names, as Java's fastjson writes them (§4.12).

rocketmq-exporter and rocketmq-dashboard decode these with fastjson into RocketMQ's own classes,
so the keys are those classes' bean properties (fastjson writes them sorted) and enums are written
by name. Maps keyed by MessageQueue use fastjson's object-key form (bodies_client.dump_queue_map),
read back tolerantly (also TideMQ's older list of rows).

Compatibility, one way only: since 2026-11 a broker writes the map form for TopicStatsTable,
ConsumeStats, ResetOffsetBody and the other MessageQueue-keyed bodies. A TideMQ client from before
that reads only the list form, so an older `tidemq` CLI or Admin gets a ProtocolError from
`topic_stats`/`consume_stats` against a new broker: upgrade clients with (or before) brokers. New
clients read both forms, so they work with old brokers.

RESET_CONSUMER_CLIENT_OFFSET (220) has two dialects: Java clients read ResetOffsetBody's map form;
the C++ client (rocketmq-client-cpp, PyPI `rocketmq` 0.4.4) reads a LIST
`{"offsetTable":[{"brokerName":..,"queueId":..,"topic":..,"offset":n}]}` (remoting.md §4.13).
`ResetOffsetBody.to_json(list_form=True)` writes the latter; the broker picks it by the language
the client's heartbeat carried (broker/handlers/admin_ops.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from tidemq.protocol._json import ObjectReader, dump, load_object, to_int, to_str
from tidemq.protocol.bodies_client import (
    MessageQueue,
    SubscriptionData,
    dump_queue_map,
    read_queue_map,
    splice,
)


@dataclass(frozen=True, slots=True)
class ClientConnection:
    """Upstream's `Connection`: one client process connected to a broker."""

    client_id: str
    client_addr: str
    language: str = "JAVA"
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "clientAddr": self.client_addr,
            "clientId": self.client_id,
            "language": self.language,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "Connection") -> Self:
        r = ObjectReader(value, what)
        return cls(
            client_id=r.str_or("clientId", ""),
            client_addr=r.str_or("clientAddr", ""),
            language=r.str_or("language", "JAVA"),
            version=r.int_or("version", 0),
        )


def _connections(connections: list[ClientConnection]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in sorted(connections, key=lambda c: (c.client_id, c.client_addr))]


@dataclass(frozen=True, slots=True)
class ProducerConnection:
    """Body of the GET_PRODUCER_CONNECTION_LIST (204) response."""

    connection_set: list[ClientConnection] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump({"connectionSet": _connections(self.connection_set)})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(connection_set=r.list_of("connectionSet", ClientConnection.from_dict))


@dataclass(frozen=True, slots=True)
class ConsumerConnection:
    """Body of the GET_CONSUMER_CONNECTION_LIST (203) response; enums by name."""

    connection_set: list[ClientConnection] = field(default_factory=list)
    subscription_table: dict[str, SubscriptionData] = field(default_factory=dict)
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"

    def to_json(self) -> bytes:
        return dump(
            {
                "connectionSet": _connections(self.connection_set),
                "consumeFromWhere": self.consume_from_where,
                "consumeType": self.consume_type,
                "messageModel": self.message_model,
                "subscriptionTable": {
                    topic: sub.to_dict() for topic, sub in sorted(self.subscription_table.items())
                },
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            connection_set=r.list_of("connectionSet", ClientConnection.from_dict),
            subscription_table=r.map_of("subscriptionTable", SubscriptionData.from_dict),
            consume_type=r.str_or("consumeType", "CONSUME_PASSIVELY"),
            message_model=r.str_or("messageModel", "CLUSTERING"),
            consume_from_where=r.str_or("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET"),
        )


@dataclass(frozen=True, slots=True)
class GroupList:
    """Body of the QUERY_TOPIC_CONSUME_BY_WHO (300) response (a Java HashSet: unordered)."""

    group_list: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump({"groupList": sorted(set(self.group_list))})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(group_list=r.list_of("groupList", to_str))


@dataclass(frozen=True, slots=True)
class BrokerStatsItem:
    """One window of a statistic: its sum, rate per second and average per sample."""

    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"avgpt": self.avgpt, "sum": self.sum, "tps": self.tps}

    @classmethod
    def from_dict(cls, value: Any, what: str = "BrokerStatsItem") -> Self:
        r = ObjectReader(value, what)
        return cls(
            sum=r.int_or("sum", 0), tps=r.float_or("tps", 0.0), avgpt=r.float_or("avgpt", 0.0)
        )


@dataclass(frozen=True, slots=True)
class BrokerStatsData:
    """Body of the VIEW_BROKER_STATS_DATA (315) response."""

    stats_minute: BrokerStatsItem = BrokerStatsItem()
    stats_hour: BrokerStatsItem = BrokerStatsItem()
    stats_day: BrokerStatsItem = BrokerStatsItem()

    def to_json(self) -> bytes:
        return dump(
            {
                "statsDay": self.stats_day.to_dict(),
                "statsHour": self.stats_hour.to_dict(),
                "statsMinute": self.stats_minute.to_dict(),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        obj = load_object(data, cls.__name__)
        item = BrokerStatsItem.from_dict
        return cls(
            stats_minute=item(obj.get("statsMinute") or {}, "statsMinute"),
            stats_hour=item(obj.get("statsHour") or {}, "statsHour"),
            stats_day=item(obj.get("statsDay") or {}, "statsDay"),
        )


@dataclass(frozen=True, slots=True)
class ResetOffsetBody:
    """Body of the 222 response and of the 220 request: queue → new offset."""

    offset_table: dict[MessageQueue, int] = field(default_factory=dict)

    def to_json(self, *, list_form: bool = False) -> bytes:
        """fastjson's map form, or (list_form) the C++ client's rows (module docstring)."""
        if list_form:
            rows = [
                {**queue.to_dict(), "offset": offset}
                for queue, offset in sorted(self.offset_table.items())
            ]
            return dump({"offsetTable": rows})
        return splice({}, {"offsetTable": dump_queue_map(self.offset_table.items())})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        obj = load_object(data, cls.__name__)
        return cls(offset_table=read_queue_map(obj.get("offsetTable"), cls.__name__, _offset))


def _offset(value: Any, what: str) -> int:
    if isinstance(value, dict):
        return ObjectReader(value, what).req_int("offset")
    return to_int(value, what)


@dataclass(frozen=True, slots=True)
class QueueTimeSpan:
    """One queue's stored time range and where the group is in it (ms; delay_time: how long
    the next message to consume has waited, 0 when caught up)."""

    message_queue: MessageQueue
    min_timestamp: int = 0
    max_timestamp: int = 0
    consume_timestamp: int = 0
    delay_time: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumeTimeStamp": self.consume_timestamp,
            "delayTime": self.delay_time,
            "maxTimeStamp": self.max_timestamp,
            "messageQueue": self.message_queue.to_dict(),
            "minTimeStamp": self.min_timestamp,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "QueueTimeSpan") -> Self:
        r = ObjectReader(value, what)
        return cls(
            message_queue=MessageQueue.from_dict(r.required("messageQueue"), f"{what}.mq"),
            min_timestamp=r.int_or("minTimeStamp", 0),
            max_timestamp=r.int_or("maxTimeStamp", 0),
            consume_timestamp=r.int_or("consumeTimeStamp", 0),
            delay_time=r.int_or("delayTime", 0),
        )


@dataclass(frozen=True, slots=True)
class QueryConsumeTimeSpanBody:
    """Body of the QUERY_CONSUME_TIME_SPAN (303) response."""

    consume_time_span_set: list[QueueTimeSpan] = field(default_factory=list)

    def to_json(self) -> bytes:
        spans = sorted(self.consume_time_span_set, key=lambda s: s.message_queue)
        return dump({"consumeTimeSpanSet": [span.to_dict() for span in spans]})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(consume_time_span_set=r.list_of("consumeTimeSpanSet", QueueTimeSpan.from_dict))


# ---------------------------------------------------------------------------------------------
# GET_CONSUMER_RUNNING_INFO (307): what a consumer reports about itself

PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"


@dataclass(frozen=True, slots=True)
class ProcessQueueInfo:
    """One assigned queue as the consumer holds it (upstream's ProcessQueueInfo)."""

    commit_offset: int = 0
    cached_msg_min_offset: int = 0
    cached_msg_max_offset: int = 0
    cached_msg_count: int = 0
    cached_msg_size_in_mib: int = 0
    locked: bool = False
    dropped: bool = False
    last_pull_timestamp: int = 0
    last_consume_timestamp: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "cachedMsgCount": self.cached_msg_count,
            "cachedMsgMaxOffset": self.cached_msg_max_offset,
            "cachedMsgMinOffset": self.cached_msg_min_offset,
            "cachedMsgSizeInMiB": self.cached_msg_size_in_mib,
            "commitOffset": self.commit_offset,
            "droped": self.dropped,  # upstream's spelling
            "lastConsumeTimestamp": self.last_consume_timestamp,
            "lastLockTimestamp": 0,
            "lastPullTimestamp": self.last_pull_timestamp,
            "locked": self.locked,
            "transactionMsgCount": 0,
            "transactionMsgMaxOffset": 0,
            "transactionMsgMinOffset": 0,
            "tryUnlockTimes": 0,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "ProcessQueueInfo") -> Self:
        r = ObjectReader(value, what)
        return cls(
            commit_offset=r.int_or("commitOffset", 0),
            cached_msg_min_offset=r.int_or("cachedMsgMinOffset", 0),
            cached_msg_max_offset=r.int_or("cachedMsgMaxOffset", 0),
            cached_msg_count=r.int_or("cachedMsgCount", 0),
            cached_msg_size_in_mib=r.int_or("cachedMsgSizeInMiB", 0),
            locked=r.bool_or("locked", False),
            dropped=r.bool_or("droped", False),
            last_pull_timestamp=r.int_or("lastPullTimestamp", 0),
            last_consume_timestamp=r.int_or("lastConsumeTimestamp", 0),
        )


@dataclass(frozen=True, slots=True)
class ConsumeStatus:
    """Per-topic consumption rates (upstream's ConsumeStatus)."""

    pull_rt: float = 0.0
    pull_tps: float = 0.0
    consume_rt: float = 0.0
    consume_ok_tps: float = 0.0
    consume_failed_tps: float = 0.0
    consume_failed_msgs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumeFailedMsgs": self.consume_failed_msgs,
            "consumeFailedTPS": self.consume_failed_tps,
            "consumeOKTPS": self.consume_ok_tps,
            "consumeRT": self.consume_rt,
            "pullRT": self.pull_rt,
            "pullTPS": self.pull_tps,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "ConsumeStatus") -> Self:
        r = ObjectReader(value, what)
        return cls(
            pull_rt=r.float_or("pullRT", 0.0),
            pull_tps=r.float_or("pullTPS", 0.0),
            consume_rt=r.float_or("consumeRT", 0.0),
            consume_ok_tps=r.float_or("consumeOKTPS", 0.0),
            consume_failed_tps=r.float_or("consumeFailedTPS", 0.0),
            consume_failed_msgs=r.int_or("consumeFailedMsgs", 0),
        )


@dataclass(frozen=True, slots=True)
class ConsumerRunningInfo:
    """Body of the GET_CONSUMER_RUNNING_INFO (307) answer, relayed by the broker unchanged."""

    properties: dict[str, str] = field(default_factory=dict)
    subscription_set: list[SubscriptionData] = field(default_factory=list)
    mq_table: dict[MessageQueue, ProcessQueueInfo] = field(default_factory=dict)
    status_table: dict[str, ConsumeStatus] = field(default_factory=dict)
    jstack: str = ""

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {
            "properties": dict(sorted(self.properties.items())),
            "statusTable": {t: s.to_dict() for t, s in sorted(self.status_table.items())},
            "subscriptionSet": [s.to_dict() for s in self.subscription_set],
        }
        if self.jstack:
            fields["jstack"] = self.jstack
        mq_table = dump_queue_map((q, i.to_dict()) for q, i in self.mq_table.items())
        return splice(fields, {"mqTable": mq_table})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        what = cls.__name__
        obj = load_object(data, what)
        r = ObjectReader(obj, what)
        return cls(
            properties=r.map_of("properties", to_str),
            subscription_set=r.list_of("subscriptionSet", SubscriptionData.from_dict),
            mq_table=read_queue_map(obj.get("mqTable"), what, ProcessQueueInfo.from_dict),
            status_table=r.map_of("statusTable", ConsumeStatus.from_dict),
            jstack=r.str_or("jstack", ""),
        )

    def __getitem__(self, key: str) -> str:
        """Dict-like access to the properties (`info["PROP_CONSUME_TYPE"]`)."""
        return self.properties[key]


__all__ = [
    "PROP_CLIENT_VERSION",
    "PROP_CONSUMER_START_TIMESTAMP",
    "PROP_CONSUME_ORDERLY",
    "PROP_CONSUME_TYPE",
    "PROP_NAMESERVER_ADDR",
    "PROP_THREADPOOL_CORE_SIZE",
    "BrokerStatsData",
    "BrokerStatsItem",
    "ClientConnection",
    "ConsumeStatus",
    "ConsumerConnection",
    "ConsumerRunningInfo",
    "GroupList",
    "ProcessQueueInfo",
    "ProducerConnection",
    "QueryConsumeTimeSpanBody",
    "QueueTimeSpan",
    "ResetOffsetBody",
]
