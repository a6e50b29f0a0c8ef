from __future__ import annotations

from tidemq.client.route_cache import RouteCache, publish_queues, subscribe_queues
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
    assert cache.any_address("broker-a") == "10.0.0.2:10911"
    cache.forget("T")
    assert cache.get("T") is None
