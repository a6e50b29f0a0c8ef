"""Topic routes as the client uses them: route → publish and subscribe queue lists, and a cache.

The name server answers GET_ROUTEINFO_BY_TOPIC with a TopicRouteData (remoting.md §3.1). From it:

- publish queues: for every QueueData with the WRITE perm whose broker has a master (id 0)
  address, queue ids 0..writeQueueNums-1; if `orderTopicConf` ("broker-a:4;broker-b:4") is set,
  only the brokers and counts it names (C++ does the same);
- subscribe queues: for every QueueData with the READ perm, 0..readQueueNums-1;
- brokers sorted by name, so every client sees the same order (rebalance relies on it).

A topic unknown to the name server may still be sent to through the TBW102 route: the broker
auto-creates it. Then at most `DEFAULT_TOPIC_QUEUES_PER_BROKER` queues per broker are used,
because that is what the producer asks the broker to create (`defaultTopicQueueNums`).

`RouteCache` is plain data: the client instance fills it (every 30 s and on demand) and reads
broker addresses from it: a group's master (id 0) for writes, any of its brokers for reads
(client/read_route.py chooses). `PublishInfos` is a producer's publish queues per topic, derived
from it once per route object (every send asks, so they are not rebuilt per send). No I/O here,
so everything is unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from tidemq.errors import NoRouteError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import BrokerData, MessageQueue, TopicRouteData

MASTER_ID: Final = 0
# As the C++ and Java clients' defaultTopicQueueNums: queues asked for on auto-create.
DEFAULT_TOPIC_QUEUES_PER_BROKER: Final = 4
# Routes older than this are refreshed by the instance's timer (RocketMQ: 30 s).
ROUTE_REFRESH_INTERVAL_MS: Final = 30_000
# How long a topic unknown to the name server keeps using the TBW102 route before asking again.
DEFAULT_ROUTE_TTL_MS: Final = 3_000


def _parse_order_conf(conf: str) -> list[tuple[str, int]]:
    entries: list[tuple[str, int]] = []
    for item in conf.split(";"):
        name, _, count = item.strip().partition(":")
        if name and count.strip().isdigit():
            entries.append((name.strip(), int(count)))
    return entries


def master_addresses(route: TopicRouteData) -> dict[str, str]:
    """broker name → master address, for the brokers of `route` that have one."""
    table: dict[str, str] = {}
    for broker in route.broker_datas:
        addr = broker.broker_addrs.get(MASTER_ID)
        if addr:
            table[broker.broker_name] = addr
    return table


def publish_queues(
    topic: str, route: TopicRouteData, *, queues_per_broker_max: int | None = None
) -> list[MessageQueue]:
    """The queues a producer may send `topic` to, sorted by (broker name, queue id)."""
    masters = master_addresses(route)
    counts: list[tuple[str, int]]
    if route.order_topic_conf:
        counts = _parse_order_conf(route.order_topic_conf)
    else:
        counts = [
            (data.broker_name, data.write_queue_nums)
            for data in route.queue_datas
            if pm.Perm.is_writable(data.perm) and data.broker_name in masters
        ]
    queues: list[MessageQueue] = []
    for broker_name, count in sorted(counts):
        if queues_per_broker_max is not None:
            count = min(count, queues_per_broker_max)
        queues.extend(
            MessageQueue(topic=topic, broker_name=broker_name, queue_id=qid) for qid in range(count)
        )
    return queues


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The queues a consumer may read `topic` from, sorted by (broker name, queue id)."""
    queues = [
        MessageQueue(topic=topic, broker_name=data.broker_name, queue_id=qid)
        for data in route.queue_datas
        if pm.Perm.is_readable(data.perm)
        for qid in range(data.read_queue_nums)
    ]
    return sorted(queues)


@dataclass(frozen=True, slots=True)
class PublishInfo:
    """What a producer needs for one topic. `via_default` says the TBW102 route was used."""

    topic: str
    queues: tuple[MessageQueue, ...]
    via_default: bool = False


_NO_ADDRESSES: Final[Mapping[int, str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class _Entry:
    route: TopicRouteData
    fetched_at_ms: float


class RouteCache:
    """Routes by topic and the broker address table they imply."""

    def __init__(self) -> None:
        self._routes: dict[str, _Entry] = {}
        # broker name → {broker id → address}; kept for brokers of any cached route (and of
        # cluster info, put_brokers).
        self._brokers: dict[str, dict[int, str]] = {}

    def put(self, topic: str, route: TopicRouteData, now_ms: float) -> bool:
        """Store `route`; True if it differs from the cached one (the caller may rebalance)."""
        previous = self._routes.get(topic)
        self._routes[topic] = _Entry(route, now_ms)
        self.put_brokers(route.broker_datas)
        return previous is None or previous.route != route

    def put_brokers(self, brokers: Iterable[BrokerData]) -> None:
        """Learn broker addresses without a route (from cluster info: heartbeats reach them)."""
        for broker in brokers:
            self._brokers[broker.broker_name] = dict(broker.broker_addrs)

    def get(self, topic: str) -> TopicRouteData | None:
        entry = self._routes.get(topic)
        return entry.route if entry else None

    def age_ms(self, topic: str, now_ms: float) -> float | None:
        entry = self._routes.get(topic)
        return None if entry is None else now_ms - entry.fetched_at_ms

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def topics(self) -> list[str]:
        return sorted(self._routes)

    def master_address(self, broker_name: str) -> str | None:
        return self._brokers.get(broker_name, {}).get(MASTER_ID)

    def addresses(self, broker_name: str) -> Mapping[int, str]:
        """broker id → address of the group `broker_name` (empty if unknown); reads choose
        among them (client/read_route.py). Not a copy: every pull asks."""
        return self._brokers.get(broker_name, _NO_ADDRESSES)

    def all_addresses(self, *, slaves: bool) -> list[str]:
        """Every known broker address (masters only unless `slaves`), sorted, no duplicates."""
        found = {
            addr
            for addrs in self._brokers.values()
            for broker_id, addr in addrs.items()
            if slaves or broker_id == MASTER_ID
        }
        return sorted(found)

    def broker_names(self) -> list[str]:
        return sorted(self._brokers)

    def master_addresses(self) -> dict[str, str]:
        return {
            name: addrs[MASTER_ID] for name, addrs in self._brokers.items() if MASTER_ID in addrs
        }

    def broker_name_of(self, addr: str) -> str | None:
        for name, addrs in self._brokers.items():
            if addr in addrs.values():
                return name
        return None

    def brokers_of(self, topics: Iterable[str]) -> list[str]:
        names: set[str] = set()
        for topic in topics:
            route = self.get(topic)
            if route is not None:
                names.update(b.broker_name for b in route.broker_datas)
        return sorted(names)


class PublishInfos:
    """A producer's PublishInfo per topic: from the topic's route in `routes`, kept while the
    cache holds that same route object (a refresh replaces it), or, for a topic the name server
    does not know, from TBW102's route for DEFAULT_ROUTE_TTL_MS."""

    def __init__(self, routes: RouteCache) -> None:
        self._routes = routes
        self._from_route: dict[str, tuple[TopicRouteData, PublishInfo]] = {}
        self._from_default: dict[str, tuple[PublishInfo, float]] = {}

    def known(self, topic: str, now_ms: float) -> PublishInfo | None:
        """The topic's PublishInfo if it needs neither a route lookup nor a new queue list."""
        route = self._routes.get(topic)
        if route is None:
            default = self._from_default.get(topic)
            if default is not None and now_ms - default[1] < DEFAULT_ROUTE_TTL_MS:
                return default[0]
            return None
        cached = self._from_route.get(topic)
        if cached is not None and cached[0] is route:
            return cached[1]
        return None

    def of_route(self, topic: str, route: TopicRouteData) -> PublishInfo:
        """The PublishInfo of `route` (the topic's, now in the cache); NoRouteError if no queue."""
        if self._from_default:
            self._from_default.pop(topic, None)
        cached = self._from_route.get(topic)
        if cached is not None and cached[0] is route:
            return cached[1]
        queues = tuple(publish_queues(topic, route))
        if not queues:
            raise NoRouteError(f"topic {topic!r} has no writable queue")
        info = PublishInfo(topic, queues)
        self._from_route[topic] = (route, info)
        return info

    def of_default(self, topic: str, default: TopicRouteData, now_ms: float) -> PublishInfo:
        """The PublishInfo of a topic the name server does not know, via TBW102's route `default`
        (at most DEFAULT_TOPIC_QUEUES_PER_BROKER queues per broker); NoRouteError if none."""
        queues = publish_queues(
            topic, default, queues_per_broker_max=DEFAULT_TOPIC_QUEUES_PER_BROKER
        )
        if not queues:
            raise NoRouteError(f"topic {topic!r} has no route and TBW102 no queue")
        info = PublishInfo(topic, tuple(queues), via_default=True)
        self._from_default[topic] = (info, now_ms)
        return info
