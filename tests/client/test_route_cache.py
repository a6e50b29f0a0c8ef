from __future__ import annotations

import pytest

from tidemq.client.route_cache import (
    DEFAULT_ROUTE_TTL_MS,
    PublishInfos,
    RouteCache,
    publish_queues,
    subscribe_queues,
)
from tidemq.errors import NoRouteError
from tidemq.protocol.bodies import BrokerData, MessageQueue, QueueData, TopicRouteData


def route(
    *queue_datas: QueueData,
    brokers: dict[str, dict[int, str]] | None = None,
    order: str | None = None,
) -> TopicRouteData:
    brokers = (
        brokers
        if brokers is not None
        else {qd.broker_name: {0: f"10.0.0.{i}:10911"} for i, qd in enumerate(queue_datas)}
    )
    return TopicRouteData(
        queue_datas=list(queue_datas),
        broker_datas=[BrokerData("C", name, addrs) for name, addrs in brokers.items()],
        order_topic_conf=order,
    )


def mqs(broker: str, ids: range, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in ids]


def test_publish_uses_writable_queues_with_a_master_sorted_by_broker():
    r = route(
        QueueData("broker-b", 2, 3, 6),
        QueueData("broker-a", 4, 2, 6),
        QueueData("broker-c", 4, 4, 4),  # read only
    )
    assert publish_queues("T", r) == mqs("broker-a", range(2)) + mqs("broker-b", range(3))
    no_master = route(QueueData("broker-a", 4, 4, 6), brokers={"broker-a": {1: "10.0.0.9:10911"}})
    assert publish_queues("T", no_master) == []


def test_subscribe_uses_readable_queues_and_read_counts():
    r = route(QueueData("broker-b", 2, 8, 6), QueueData("broker-a", 1, 1, 2))  # a: write only
    assert subscribe_queues("T", r) == mqs("broker-b", range(2))


def test_queues_per_broker_cap_for_the_default_route():
    r = route(QueueData("broker-a", 8, 8, 7))
    assert publish_queues("New", r, queues_per_broker_max=4) == mqs("broker-a", range(4), "New")


def test_order_topic_conf_overrides_queue_datas():
    r = route(
        QueueData("broker-a", 8, 8, 6),
        QueueData("broker-b", 8, 8, 6),
        order="broker-b:2;broker-a:1",
    )
    assert publish_queues("T", r) == mqs("broker-a", range(1)) + mqs("broker-b", range(2))


def test_cache_addresses_and_change_detection():
    cache = RouteCache()
    r = route(
        QueueData("broker-a", 4, 4, 6),
        brokers={"broker-a": {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}},
    )
    assert cache.put("T", r, 0.0) is True
    assert cache.put("T", r, 5.0) is False
    assert cache.age_ms("T", 12.0) == 7.0
    assert cache.master_address("broker-a") == "10.0.0.1:10911"
    assert cache.broker_name_of("10.0.0.2:10911") == "broker-a"
    assert cache.master_addresses() == {"broker-a": "10.0.0.1:10911"}
    assert cache.master_address("broker-x") is None
    changed = route(QueueData("broker-a", 8, 8, 6), brokers={"broker-a": {1: "10.0.0.2:10911"}})
    assert cache.put("T", changed, 6.0) is True
    assert cache.master_address("broker-a") is None
    assert cache.addresses("broker-a") == {1: "10.0.0.2:10911"}
    assert cache.addresses("broker-x") == {}
    assert cache.all_addresses(slaves=False) == []
    assert cache.all_addresses(slaves=True) == ["10.0.0.2:10911"]
    cache.forget("T")
    assert cache.get("T") is None


def test_publish_infos_follow_the_route_object_and_the_default_ttl():
    routes = RouteCache()
    infos = PublishInfos(routes)
    assert infos.known("T", 0.0) is None
    default = route(QueueData("broker-a", 8, 8, 7))
    via_default = infos.of_default("T", default, now_ms=0.0)
    assert via_default.via_default
    assert via_default.queues == tuple(mqs("broker-a", range(4)))  # at most 4 per broker
    assert infos.known("T", DEFAULT_ROUTE_TTL_MS - 1) is via_default
    assert infos.known("T", DEFAULT_ROUTE_TTL_MS) is None
    first = route(QueueData("broker-a", 2, 2, 6))
    routes.put("T", first, 0.0)
    assert infos.known("T", 0.0) is None  # a route now: no longer the default's queues
    info = infos.of_route("T", first)
    assert info.queues == tuple(mqs("broker-a", range(2)))
    assert infos.known("T", 0.0) is info
    assert infos.of_route("T", first) is info
    refreshed = route(QueueData("broker-a", 3, 3, 6))
    routes.put("T", refreshed, 1.0)
    assert infos.known("T", 1.0) is None
    assert infos.of_route("T", refreshed).queues == tuple(mqs("broker-a", range(3)))


def test_publish_infos_without_a_writable_queue_raise():
    infos = PublishInfos(RouteCache())
    read_only = route(QueueData("broker-a", 4, 4, 4))
    with pytest.raises(NoRouteError):
        infos.of_route("T", read_only)
    with pytest.raises(NoRouteError):
        infos.of_default("T", read_only, now_ms=0.0)
