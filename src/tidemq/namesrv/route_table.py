"""The name server's route table: which brokers are alive, where they are, what topics they serve.

Pure data structure: no I/O and no clock (every method that needs the time takes `now_ms`), so it is
unit-tested without sockets. The handlers and the housekeeping service drive it.

    cluster_addr   cluster name  → {broker name}
    broker_addr    broker name   → _Broker(cluster, {broker id → "ip:port"})   id 0 = master
    topic_queue    topic         → {broker name → _Queue(read, write, perm, sys flag)}
    live           "ip:port"     → _Live(last update ms, data version, ha addr, connection key)

Semantics follow RocketMQ 4.x (remoting.md §3.2):

- Queue data is written only from *master* registrations, and only on a broker's first
  registration or when its DataVersion changed. It is added and updated, never pruned by a
  registration: a Java broker registers a single changed topic with the full data version, so a
  topic missing from one registration is not a deleted topic (DELETE_TOPIC_IN_NAMESRV does that).
- A broker is dropped when it unregisters, when it has been silent for `expiry_ms`, or when the
  connection it registered over closes. Dropping an address removes it from its broker; a broker
  name left without addresses leaves its cluster and takes its queue data with it, and a topic left
  without queue data no longer exists.
- A topic has a route only if some broker registered it and that broker's address is known.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

from tidemq.limits import BROKER_EXPIRY_MS
from tidemq.protocol.bodies import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)

MASTER_ID: Final = 0
# PermName.PERM_WRITE: the bit WIPE/ADD_WRITE_PERM_OF_BROKER clear and set.
PERM_WRITE: Final = 0x2

_PermChange = Callable[[int], int]


@dataclass(slots=True)
class _Broker:
    cluster: str
    addrs: dict[int, str]


@dataclass(slots=True)
class _Queue:
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int


@dataclass(slots=True)
class _Live:
    last_update_ms: int
    data_version: DataVersion
    ha_server_addr: str
    connection_key: Hashable | None


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """What REGISTER_BROKER answers: the master's addresses, for a slave whose master is known."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


@dataclass(frozen=True, slots=True)
class DroppedBroker:
    """A broker address the table forgot (expired or its connection closed)."""

    broker_addr: str
    broker_name: str | None
    cluster: str | None
    connection_key: Hashable | None


class RouteTable:
    """Brokers, clusters and topic queue data, as built from broker registrations."""

    def __init__(self) -> None:
        self._cluster_addr: dict[str, set[str]] = {}
        self._broker_addr: dict[str, _Broker] = {}
        self._topic_queue: dict[str, dict[str, _Queue]] = {}
        self._live: dict[str, _Live] = {}

    # -- registration ----------------------------------------------------------------------

    def register_broker(
        self,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int,
        ha_server_addr: str,
        topic_config_wrapper: TopicConfigSerializeWrapper | None,
        now_ms: int,
        connection_key: Hashable | None = None,
    ) -> RegisterResult:
        """Record a broker registration (REGISTER_BROKER, every 30 s and after topic changes)."""
        self._cluster_addr.setdefault(cluster, set()).add(broker_name)
        broker = self._broker_addr.get(broker_name)
        first = broker is None
        if broker is None:
            broker = _Broker(cluster, {})
            self._broker_addr[broker_name] = broker
        broker.cluster = cluster
        # The same address under another id: a slave promoted to master (or the reverse).
        for stale_id in [i for i, a in broker.addrs.items() if a == broker_addr and i != broker_id]:
            del broker.addrs[stale_id]
        first = broker.addrs.get(broker_id) is None or first
        broker.addrs[broker_id] = broker_addr

        data_version = (
            topic_config_wrapper.data_version
            if topic_config_wrapper is not None
            else DataVersion(timestamp=0, counter=0)
        )
        rebuild = first or self.data_version_changed(broker_addr, data_version)
        if topic_config_wrapper is not None and broker_id == MASTER_ID and rebuild:
            for topic, config in topic_config_wrapper.topic_config_table.items():
                self._topic_queue.setdefault(topic, {})[broker_name] = _Queue(
                    read_queue_nums=config.read_queue_nums,
                    write_queue_nums=config.write_queue_nums,
                    perm=config.perm,
                    topic_sys_flag=config.topic_sys_flag,
                )
        self._live[broker_addr] = _Live(now_ms, data_version, ha_server_addr, connection_key)

        if broker_id == MASTER_ID:
            return RegisterResult()
        master_addr = broker.addrs.get(MASTER_ID)
        if master_addr is None:
            return RegisterResult()
        master_live = self._live.get(master_addr)
        return RegisterResult(
            master_addr=master_addr,
            ha_server_addr=master_live.ha_server_addr if master_live is not None else None,
        )

    def unregister_broker(
        self, cluster: str, broker_name: str, broker_addr: str, broker_id: int
    ) -> None:
        """Forget one broker address at its request (UNREGISTER_BROKER, on broker shutdown)."""
        self._live.pop(broker_addr, None)
        broker = self._broker_addr.get(broker_name)
        if broker is None:
            return
        if broker.addrs.get(broker_id) == broker_addr:
            del broker.addrs[broker_id]
        if not broker.addrs:
            self._drop_broker_name(broker_name, cluster)

    def data_version_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        """True when the broker's topic data differs from what it last registered (or never did)."""
        live = self._live.get(broker_addr)
        return live is None or live.data_version != data_version

    def query_data_version(
        self, broker_addr: str, data_version: DataVersion, now_ms: int
    ) -> tuple[bool, DataVersion | None]:
        """QUERY_DATA_VERSION: (changed, the version this table holds).

        An unchanged query counts as a sign of life, as in RocketMQ, so a broker may skip
        re-registering an unchanged table.
        """
        live = self._live.get(broker_addr)
        changed = live is None or live.data_version != data_version
        if live is not None and not changed:
            live.last_update_ms = now_ms
        return changed, live.data_version if live is not None else None

    # -- liveness --------------------------------------------------------------------------

    def expire(self, now_ms: int, expiry_ms: int = BROKER_EXPIRY_MS) -> list[DroppedBroker]:
        """Drop every broker address silent for `expiry_ms` or longer."""
        silent = [
            addr for addr, live in self._live.items() if now_ms - live.last_update_ms >= expiry_ms
        ]
        return [self._drop_addr(addr) for addr in silent]

    def on_connection_closed(self, connection_key: Hashable) -> list[DroppedBroker]:
        """Drop the broker addresses registered over the connection that closed."""
        addrs = [addr for addr, live in self._live.items() if live.connection_key == connection_key]
        return [self._drop_addr(addr) for addr in addrs]

    def _drop_addr(self, broker_addr: str) -> DroppedBroker:
        live = self._live.pop(broker_addr, None)
        found_name: str | None = None
        found_cluster: str | None = None
        for name, broker in list(self._broker_addr.items()):
            ids = [i for i, a in broker.addrs.items() if a == broker_addr]
            if not ids:
                continue
            found_name, found_cluster = name, broker.cluster
            for broker_id in ids:
                del broker.addrs[broker_id]
            if not broker.addrs:
                self._drop_broker_name(name, broker.cluster)
        return DroppedBroker(
            broker_addr, found_name, found_cluster, live.connection_key if live else None
        )

    def _drop_broker_name(self, broker_name: str, cluster: str) -> None:
        self._broker_addr.pop(broker_name, None)
        names = self._cluster_addr.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._cluster_addr[cluster]
        for topic in list(self._topic_queue):
            queues = self._topic_queue[topic]
            queues.pop(broker_name, None)
            if not queues:
                del self._topic_queue[topic]

    # -- queries ---------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, or None when no broker with a known address serves it."""
        queues = self._topic_queue.get(topic)
        if not queues:
            return None
        queue_datas = [
            QueueData(
                broker_name=name,
                read_queue_nums=q.read_queue_nums,
                write_queue_nums=q.write_queue_nums,
                perm=q.perm,
                topic_sys_flag=q.topic_sys_flag,
            )
            for name, q in sorted(queues.items())
        ]
        broker_datas = [
            self._broker_data(name) for name in sorted(queues) if name in self._broker_addr
        ]
        if not broker_datas:
            return None
        return TopicRouteData(
            queue_datas=queue_datas, broker_datas=broker_datas, filter_server_table={}
        )

    def _broker_data(self, broker_name: str) -> BrokerData:
        broker = self._broker_addr[broker_name]
        return BrokerData(
            cluster=broker.cluster,
            broker_name=broker_name,
            broker_addrs=dict(sorted(broker.addrs.items())),
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={name: self._broker_data(name) for name in sorted(self._broker_addr)},
            cluster_addr_table={
                cluster: sorted(names) for cluster, names in sorted(self._cluster_addr.items())
            },
        )

    def topic_list(self) -> TopicList:
        return TopicList(topic_list=sorted(self._topic_queue))

    def topics_by_cluster(self, cluster: str) -> TopicList:
        names = self._cluster_addr.get(cluster, set())
        return TopicList(
            topic_list=sorted(
                topic for topic, queues in self._topic_queue.items() if names & queues.keys()
            )
        )

    def broker_addrs(self) -> list[str]:
        """Every live broker address (for tests and admin)."""
        return sorted(self._live)

    # -- administration --------------------------------------------------------------------

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """Forget a topic everywhere, or only on the brokers of `cluster` (4.9 clients)."""
        if cluster is None:
            self._topic_queue.pop(topic, None)
            return
        queues = self._topic_queue.get(topic)
        if queues is None:
            return
        for name in self._cluster_addr.get(cluster, set()):
            queues.pop(name, None)
        if not queues:
            del self._topic_queue[topic]

    def wipe_write_perm(self, broker_name: str) -> int:
        """Clear the write bit of every topic on `broker_name`; returns how many topics it had."""
        return self._update_perm(broker_name, lambda perm: perm & ~PERM_WRITE)

    def add_write_perm(self, broker_name: str) -> int:
        """Set the write bit of every topic on `broker_name`; returns how many topics it had."""
        return self._update_perm(broker_name, lambda perm: perm | PERM_WRITE)

    def _update_perm(self, broker_name: str, change: _PermChange) -> int:
        count = 0
        for queues in self._topic_queue.values():
            queue = queues.get(broker_name)
            if queue is not None:
                queue.perm = change(queue.perm)
                count += 1
        return count
