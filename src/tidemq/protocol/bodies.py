"""JSON bodies of the name server and topic configuration (remoting.md §3), and re-exports.

Every body is a dataclass with `to_json() -> bytes` and `from_json(data) -> Self`. Readers are
tolerant (see `_json`: fastjson's bare numeric keys, C++'s trailing newline, ints as strings,
enum ordinals or names, missing keys defaulted); writers emit standard JSON with camelCase keys
and quoted numeric map keys (`"brokerAddrs":{"0":"ip:port"}`), which every target client accepts.
Bad input raises ProtocolError.

The client-facing bodies (heartbeat, consumer list, locks, admin statistics) are defined in
`bodies_client` and re-exported here, so `tidemq.protocol.bodies` is the one import.

REGISTER_BROKER's body also has a compressed form (4.9+, §3.2), read by
`RegisterBrokerBody.decode(data, compressed=True)`; TideMQ itself sends the plain form:

    zlib( i32 len + DataVersion JSON
          i32 topic count
          (i32 len + "<name> <read> <write> <perm> <SINGLE_TAG|MULTI_TAG>")*   (5.x: + " <attrs>")
          i32 len + filterServerList JSON )
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final, Self

from tidemq.errors import ProtocolError
from tidemq.protocol._json import (
    ObjectReader,
    as_list,
    dump,
    load_list,
    load_object,
    to_int,
    to_str,
)
from tidemq.protocol.bodies_client import (
    ConsumerData,
    ConsumerListBody,
    ConsumeStats,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    ProducerData,
    SubscriptionData,
    TopicOffset,
    TopicStatsTable,
    UnlockBatchRequestBody,
)
from tidemq.protocol.message_batch import inflate

__all__ = [
    "BrokerData",
    "ClusterInfo",
    "ConsumeStats",
    "ConsumerData",
    "ConsumerListBody",
    "DataVersion",
    "HeartbeatData",
    "KVTable",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageQueue",
    "OffsetWrapper",
    "ProducerData",
    "QueueData",
    "RegisterBrokerBody",
    "SubscriptionData",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicList",
    "TopicOffset",
    "TopicRouteData",
    "TopicStatsTable",
    "UnlockBatchRequestBody",
]

TOPIC_FILTER_TYPES: Final = ("SINGLE_TAG", "MULTI_TAG")  # by Java ordinal
_I32: Final = struct.Struct(">i")
assert _I32.size == 4


def _filter_type(value: Any, what: str) -> str:
    """A TopicFilterType given by name or ordinal."""
    if isinstance(value, str) and value in TOPIC_FILTER_TYPES:
        return value
    ordinal = to_int(value, what)
    if not 0 <= ordinal < len(TOPIC_FILTER_TYPES):
        raise ProtocolError(f"{what} is not a topic filter type: {value!r}")
    return TOPIC_FILTER_TYPES[ordinal]


# ---------------------------------------------------------------------------------------------
# Topic configuration and broker registration (§3.2)


@dataclass(frozen=True, slots=True)
class DataVersion:
    """Version of a broker's topic table: the name server rebuilds routes only when it changes."""

    timestamp: int = 0  # ms
    counter: int = 0

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(timestamp=now_ms, counter=self.counter + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_dict(cls, value: Any, what: str = "DataVersion") -> Self:
        r = ObjectReader(value, what)
        return cls(timestamp=r.int_or("timestamp", 0), counter=r.int_or("counter", 0))

    def to_json(self) -> bytes:
        return dump(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        return cls.from_dict(load_object(data, cls.__name__))


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "TopicConfig") -> Self:
        r = ObjectReader(value, what)
        filter_type = r.raw("topicFilterType", "SINGLE_TAG")
        return cls(
            topic_name=r.req_str("topicName"),
            read_queue_nums=r.int_or("readQueueNums", 16),
            write_queue_nums=r.int_or("writeQueueNums", 16),
            perm=r.int_or("perm", 6),
            topic_filter_type=_filter_type(filter_type, f"{what}.topicFilterType"),
            topic_sys_flag=r.int_or("topicSysFlag", 0),
            order=r.bool_or("order", False),
        )

    def to_json(self) -> bytes:
        return dump(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        return cls.from_dict(load_object(data, cls.__name__))


@dataclass(frozen=True, slots=True)
class TopicConfigSerializeWrapper:
    """A broker's topic table; also the body of GET_ALL_TOPIC_CONFIG (21)."""

    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = DataVersion()

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_dict(),
            "topicConfigTable": {
                name: config.to_dict() for name, config in self.topic_config_table.items()
            },
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "TopicConfigSerializeWrapper") -> Self:
        r = ObjectReader(value, what)
        return cls(
            topic_config_table=r.map_of("topicConfigTable", TopicConfig.from_dict),
            data_version=DataVersion.from_dict(r.raw("dataVersion", {}), f"{what}.dataVersion"),
        )

    def to_json(self) -> bytes:
        return dump(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        return cls.from_dict(load_object(data, cls.__name__))


@dataclass(frozen=True, slots=True)
class RegisterBrokerBody:
    topic_config_wrapper: TopicConfigSerializeWrapper = TopicConfigSerializeWrapper()
    filter_server_list: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump(
            {
                "filterServerList": self.filter_server_list,
                "topicConfigSerializeWrapper": self.topic_config_wrapper.to_dict(),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            topic_config_wrapper=TopicConfigSerializeWrapper.from_dict(
                r.raw("topicConfigSerializeWrapper", {}),
                f"{cls.__name__}.topicConfigSerializeWrapper",
            ),
            filter_server_list=r.list_of("filterServerList", to_str),
        )

    @classmethod
    def decode(cls, data: bytes, *, compressed: bool) -> Self:
        """The body of a REGISTER_BROKER request, plain JSON or (compressed=True) the zlib form."""
        if not compressed:
            return cls.from_json(data)
        wrapper, filter_servers = _decode_compressed_register_body(inflate(data))
        return cls(topic_config_wrapper=wrapper, filter_server_list=filter_servers)


def _decode_compressed_register_body(raw: bytes) -> tuple[TopicConfigSerializeWrapper, list[str]]:
    what = "compressed RegisterBrokerBody"
    position = 0

    def take(length: int) -> bytes:
        nonlocal position
        if length < 0 or position + length > len(raw):
            raise ProtocolError(f"{what} is truncated at byte {position}")
        chunk = raw[position : position + length]
        position += length
        return chunk

    def take_i32() -> int:
        (value,) = _I32.unpack(take(4))
        return int(value)

    data_version = DataVersion.from_dict(load_object(take(take_i32()), what), f"{what}.dataVersion")
    table: dict[str, TopicConfig] = {}
    for _ in range(take_i32()):
        try:
            text = take(take_i32()).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{what}: a topic entry is not UTF-8") from None
        parts = text.split(" ")
        if len(parts) < 5:
            raise ProtocolError(f"{what}: topic entry {text!r} has fewer than 5 fields")
        name = parts[0]
        table[name] = TopicConfig(
            topic_name=name,
            read_queue_nums=to_int(parts[1], f"{what}.{name}.readQueueNums"),
            write_queue_nums=to_int(parts[2], f"{what}.{name}.writeQueueNums"),
            perm=to_int(parts[3], f"{what}.{name}.perm"),
            topic_filter_type=_filter_type(parts[4], f"{what}.{name}.topicFilterType"),
        )
    filter_servers: list[str] = []
    if position < len(raw):
        servers = load_list(take(take_i32()), f"{what}.filterServerList")
        filter_servers = [to_str(item, f"{what}.filterServerList") for item in servers]
    wrapper = TopicConfigSerializeWrapper(topic_config_table=table, data_version=data_version)
    return wrapper, filter_servers


# ---------------------------------------------------------------------------------------------
# Routes (§3.1) and other name-server bodies (§3.3)


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "QueueData") -> Self:
        r = ObjectReader(value, what)
        # ≤ 4.8 spells it topicSynFlag.
        sys_flag = r.int_or("topicSysFlag", r.int_or("topicSynFlag", 0))
        return cls(
            broker_name=r.req_str("brokerName"),
            read_queue_nums=r.int_or("readQueueNums", 0),
            write_queue_nums=r.int_or("writeQueueNums", 0),
            perm=r.int_or("perm", 0),
            topic_sys_flag=sys_flag,
        )


@dataclass(frozen=True, slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)  # broker id (0 = master) → ip:port

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerAddrs": {str(broker_id): addr for broker_id, addr in self.broker_addrs.items()},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = "BrokerData") -> Self:
        r = ObjectReader(value, what)
        addrs = r.map_of("brokerAddrs", to_str)
        return cls(
            cluster=r.str_or("cluster", ""),
            broker_name=r.req_str("brokerName"),
            broker_addrs={
                to_int(key, f"{what}.brokerAddrs key"): addr for key, addr in addrs.items()
            },
        )


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """Body of GET_ROUTEINFO_BY_TOPIC. `order_topic_conf` is omitted from the JSON when None."""

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)
    order_topic_conf: str | None = None

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "brokerDatas": [broker.to_dict() for broker in self.broker_datas],
            "filterServerTable": self.filter_server_table,
        }
        if self.order_topic_conf is not None:
            body["orderTopicConf"] = self.order_topic_conf
        body["queueDatas"] = [queue.to_dict() for queue in self.queue_datas]
        return dump(body)

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            queue_datas=r.list_of("queueDatas", QueueData.from_dict),
            broker_datas=r.list_of("brokerDatas", BrokerData.from_dict),
            filter_server_table=r.map_of("filterServerTable", _str_list),
            order_topic_conf=r.opt_str("orderTopicConf"),
        )


def _str_list(value: Any, what: str) -> list[str]:
    return [to_str(item, what) for item in as_list(value, what)]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """Body of GET_BROKER_CLUSTER_INFO (106)."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return dump(
            {
                "brokerAddrTable": {
                    name: broker.to_dict() for name, broker in self.broker_addr_table.items()
                },
                "clusterAddrTable": self.cluster_addr_table,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(
            broker_addr_table=r.map_of("brokerAddrTable", BrokerData.from_dict),
            cluster_addr_table=r.map_of("clusterAddrTable", _str_list),
        )


@dataclass(frozen=True, slots=True)
class TopicList:
    """Body of GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) and GET_TOPICS_BY_CLUSTER (224)."""

    topic_list: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return dump({"topicList": self.topic_list})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(topic_list=r.list_of("topicList", to_str))


@dataclass(frozen=True, slots=True)
class KVTable:
    """Body of GET_KVLIST_BY_NAMESPACE (219) and of the REGISTER_BROKER response."""

    table: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return dump({"table": self.table})

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        r = ObjectReader(load_object(data, cls.__name__), cls.__name__)
        return cls(table=r.map_of("table", to_str))
