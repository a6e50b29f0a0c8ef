"""Typed headers of topic administration and of the name server (remoting.md §3, §4.12).

Same conventions as the rest of `headers` (which re-exports everything here): frozen dataclasses,
wire names spelled in `to_fields`/`from_fields`, ProtocolError naming the bad field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Self

from tidemq.protocol._fields import FieldReader, render
from tidemq.protocol.names import TBW102

TOPIC_FILTER_SINGLE_TAG: Final = "SINGLE_TAG"
TOPIC_FILTER_MULTI_TAG: Final = "MULTI_TAG"
# Normal topics are readable and writable (PermName READ|WRITE).
_PERM_READ_WRITE: Final = 6

# ---------------------------------------------------------------------------------------------
# Broker topic administration: §4.12


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicRequestHeader:
    """UPDATE_AND_CREATE_TOPIC (17). Inbound, only topic and the queue counts are required."""

    topic: str
    default_topic: str = TBW102
    read_queue_nums: int
    write_queue_nums: int
    perm: int = _PERM_READ_WRITE
    topic_filter_type: str = TOPIC_FILTER_SINGLE_TAG
    topic_sys_flag: int = 0
    order: bool = False

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "topic": self.topic,
                "defaultTopic": self.default_topic,
                "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums,
                "perm": self.perm,
                "topicFilterType": self.topic_filter_type,
                "topicSysFlag": self.topic_sys_flag,
                "order": self.order,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            topic=r.req_str("topic"),
            default_topic=r.opt_str_nonempty("defaultTopic") or TBW102,
            read_queue_nums=r.req_int("readQueueNums"),
            write_queue_nums=r.req_int("writeQueueNums"),
            perm=r.int_or("perm", _PERM_READ_WRITE),
            topic_filter_type=r.opt_str_nonempty("topicFilterType") or TOPIC_FILTER_SINGLE_TAG,
            topic_sys_flag=r.int_or("topicSysFlag", 0),
            order=r.bool_or("order", False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicRequestHeader:
    """DELETE_TOPIC_IN_BROKER (215) and DELETE_TOPIC_IN_NAMESRV (216, optional clusterName)."""

    topic: str
    cluster_name: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic, "clusterName": self.cluster_name})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(topic=r.req_str("topic"), cluster_name=r.opt_str_nonempty("clusterName"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicStatsInfoRequestHeader:
    topic: str

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(topic=FieldReader(cls.__name__, fields).req_str("topic"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumeStatsRequestHeader:
    """GET_CONSUME_STATS (208); without a topic, every topic the group consumes."""

    consumer_group: str
    topic: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render({"consumerGroup": self.consumer_group, "topic": self.topic})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(consumer_group=r.req_str("consumerGroup"), topic=r.opt_str_nonempty("topic"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerConnectionListRequestHeader:
    """GET_CONSUMER_CONNECTION_LIST (203)."""

    consumer_group: str

    def to_fields(self) -> dict[str, str]:
        return render({"consumerGroup": self.consumer_group})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(consumer_group=FieldReader(cls.__name__, fields).req_str("consumerGroup"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerRunningInfoRequestHeader:
    """GET_CONSUMER_RUNNING_INFO (307), forwarded by the broker to one client."""

    consumer_group: str
    client_id: str
    jstack_enable: bool = False

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "consumerGroup": self.consumer_group,
                "clientId": self.client_id,
                "jstackEnable": self.jstack_enable,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            consumer_group=r.req_str("consumerGroup"),
            client_id=r.req_str("clientId"),
            jstack_enable=r.bool_or("jstackEnable", False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GetProducerConnectionListRequestHeader:
    """GET_PRODUCER_CONNECTION_LIST (204)."""

    producer_group: str

    def to_fields(self) -> dict[str, str]:
        return render({"producerGroup": self.producer_group})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(producer_group=FieldReader(cls.__name__, fields).req_str("producerGroup"))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryTopicConsumeByWhoRequestHeader:
    """QUERY_TOPIC_CONSUME_BY_WHO (300)."""

    topic: str

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(topic=FieldReader(cls.__name__, fields).req_str("topic"))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumeTimeSpanRequestHeader:
    """QUERY_CONSUME_TIME_SPAN (303)."""

    topic: str
    group: str

    def to_fields(self) -> dict[str, str]:
        return render({"topic": self.topic, "group": self.group})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(topic=r.req_str("topic"), group=r.req_str("group"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewBrokerStatsDataRequestHeader:
    """VIEW_BROKER_STATS_DATA (315): statsName (TOPIC_PUT_NUMS, ...) and its key."""

    stats_name: str
    stats_key: str

    def to_fields(self) -> dict[str, str]:
        return render({"statsName": self.stats_name, "statsKey": self.stats_key})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(stats_name=r.req_str("statsName"), stats_key=r.req_str("statsKey"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetOffsetRequestHeader:
    """INVOKE_BROKER_TO_RESET_OFFSET (222, admin → broker) and RESET_CONSUMER_CLIENT_OFFSET (220,
    broker → client). queue_id ≥ 0 with an offset is 5.x's reset of one queue to an offset."""

    topic: str
    group: str
    timestamp: int
    is_force: bool = True
    queue_id: int = -1
    offset: int | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "topic": self.topic,
                "group": self.group,
                "timestamp": self.timestamp,
                "isForce": self.is_force,
                "queueId": None if self.queue_id == -1 else self.queue_id,
                "offset": self.offset,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        offset = r.opt_str_nonempty("offset")
        return cls(
            topic=r.req_str("topic"),
            group=r.req_str("group"),
            timestamp=r.int_or("timestamp", 0),
            is_force=r.bool_or("isForce", True),
            queue_id=r.int_or("queueId", -1),
            offset=None if offset is None else r.req_int("offset"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSubscriptionGroupRequestHeader:
    """DELETE_SUBSCRIPTIONGROUP (207); `clean_offset` also drops the group's offsets.

    Upstream's field is cleanOffset (DeleteSubscriptionGroupRequestHeader); TideMQ before
    2026-11 wrote removeOffset, so a reader takes either (true if either says so)."""

    group_name: str
    clean_offset: bool = False

    def to_fields(self) -> dict[str, str]:
        return render({"groupName": self.group_name, "cleanOffset": self.clean_offset})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        clean = r.bool_or("cleanOffset", False) or r.bool_or("removeOffset", False)
        return cls(group_name=r.req_str("groupName"), clean_offset=clean)


# ---------------------------------------------------------------------------------------------
# Name server: §3


@dataclass(frozen=True, slots=True, kw_only=True)
class GetRouteInfoRequestHeader:
    """GET_ROUTEINFO_BY_TOPIC (105); acceptStandardJsonOnly comes from 4.9.5+ clients."""

    topic: str
    accept_standard_json_only: bool = False

    def to_fields(self) -> dict[str, str]:
        return render(
            {"topic": self.topic, "acceptStandardJsonOnly": self.accept_standard_json_only}
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            topic=r.req_str("topic"),
            accept_standard_json_only=r.bool_or("acceptStandardJsonOnly", False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterBrokerRequestHeader:
    """REGISTER_BROKER (103). body_crc32 = CRC32(body) & 0x7FFFFFFF, 0 = not checked."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: int
    compressed: bool = False
    body_crc32: int = 0

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "brokerName": self.broker_name,
                "brokerAddr": self.broker_addr,
                "clusterName": self.cluster_name,
                "haServerAddr": self.ha_server_addr,
                "brokerId": self.broker_id,
                "compressed": self.compressed,
                "bodyCrc32": self.body_crc32,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            broker_name=r.req_str("brokerName"),
            broker_addr=r.req_str("brokerAddr"),
            cluster_name=r.req_str("clusterName"),
            ha_server_addr=r.req_str("haServerAddr"),
            broker_id=r.req_int("brokerId"),
            compressed=r.bool_or("compressed", False),
            body_crc32=r.int_or("bodyCrc32", 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterBrokerResponseHeader:
    """master_addr only when the registrant is a slave and its master is known."""

    ha_server_addr: str | None = None
    master_addr: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render({"haServerAddr": self.ha_server_addr, "masterAddr": self.master_addr})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            ha_server_addr=r.opt_str_nonempty("haServerAddr"),
            master_addr=r.opt_str_nonempty("masterAddr"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterBrokerRequestHeader:
    """UNREGISTER_BROKER (104); QueryDataVersionRequestHeader (322) has the same fields."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "brokerName": self.broker_name,
                "brokerAddr": self.broker_addr,
                "clusterName": self.cluster_name,
                "brokerId": self.broker_id,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            broker_name=r.req_str("brokerName"),
            broker_addr=r.req_str("brokerAddr"),
            cluster_name=r.req_str("clusterName"),
            broker_id=r.req_int("brokerId"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryDataVersionRequestHeader(UnregisterBrokerRequestHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryDataVersionResponseHeader:
    changed: bool

    def to_fields(self) -> dict[str, str]:
        return render({"changed": self.changed})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(changed=FieldReader(cls.__name__, fields).req_bool("changed"))


@dataclass(frozen=True, slots=True, kw_only=True)
class WipeWritePermOfBrokerRequestHeader:
    """WIPE_WRITE_PERM_OF_BROKER (205); ADD_WRITE_PERM_OF_BROKER (327) has the same field."""

    broker_name: str

    def to_fields(self) -> dict[str, str]:
        return render({"brokerName": self.broker_name})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(broker_name=FieldReader(cls.__name__, fields).req_str("brokerName"))


@dataclass(frozen=True, slots=True, kw_only=True)
class AddWritePermOfBrokerRequestHeader(WipeWritePermOfBrokerRequestHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class WipeWritePermOfBrokerResponseHeader:
    wipe_topic_count: int

    def to_fields(self) -> dict[str, str]:
        return render({"wipeTopicCount": self.wipe_topic_count})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(wipe_topic_count=FieldReader(cls.__name__, fields).req_int("wipeTopicCount"))


@dataclass(frozen=True, slots=True, kw_only=True)
class AddWritePermOfBrokerResponseHeader:
    add_topic_count: int

    def to_fields(self) -> dict[str, str]:
        return render({"addTopicCount": self.add_topic_count})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(add_topic_count=FieldReader(cls.__name__, fields).req_int("addTopicCount"))


@dataclass(frozen=True, slots=True, kw_only=True)
class PutKVConfigRequestHeader:
    namespace: str
    key: str
    value: str

    def to_fields(self) -> dict[str, str]:
        return render({"namespace": self.namespace, "key": self.key, "value": self.value})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(namespace=r.req_str("namespace"), key=r.req_str("key"), value=r.req_str("value"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigRequestHeader:
    """GET_KV_CONFIG (101); DeleteKVConfigRequestHeader (102) has the same fields."""

    namespace: str
    key: str

    def to_fields(self) -> dict[str, str]:
        return render({"namespace": self.namespace, "key": self.key})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(namespace=r.req_str("namespace"), key=r.req_str("key"))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteKVConfigRequestHeader(GetKVConfigRequestHeader):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigResponseHeader:
    value: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render({"value": self.value})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(value=FieldReader(cls.__name__, fields).opt_str("value"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVListByNamespaceRequestHeader:
    """GET_KVLIST_BY_NAMESPACE (219)."""

    namespace: str

    def to_fields(self) -> dict[str, str]:
        return render({"namespace": self.namespace})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(namespace=FieldReader(cls.__name__, fields).req_str("namespace"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicsByClusterRequestHeader:
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str

    def to_fields(self) -> dict[str, str]:
        return render({"cluster": self.cluster})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        return cls(cluster=FieldReader(cls.__name__, fields).req_str("cluster"))
