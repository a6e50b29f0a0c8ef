"""RouteTable without I/O: registration semantics of remoting.md §3.2, expiry, administration."""

from __future__ import annotations

from tidemq.namesrv.route_table import PERM_WRITE, RegisterResult, RouteTable
from tidemq.protocol.bodies import DataVersion, TopicConfig, TopicConfigSerializeWrapper

NOW = 1_700_000_000_000
ADDR_A = "10.0.0.1:10911"
ADDR_A_SLAVE = "10.0.0.2:10911"
ADDR_B = "10.0.0.3:10911"


def wrapper(counter: int, **topics: int) -> TopicConfigSerializeWrapper:
    return TopicConfigSerializeWrapper(
        topic_config_table={
            name: TopicConfig(topic_name=name, read_queue_nums=q, write_queue_nums=q, perm=6)
            for name, q in topics.items()
        },
        data_version=DataVersion(timestamp=NOW, counter=counter),
    )


def register(
    table: RouteTable,
    name: str = "broker-a",
    addr: str = ADDR_A,
    broker_id: int = 0,
    wrapped: TopicConfigSerializeWrapper | None = None,
    now_ms: int = NOW,
    key: object = None,
    cluster: str = "DefaultCluster",
) -> RegisterResult:
    return table.register_broker(cluster, name, addr, broker_id, addr + "2", wrapped, now_ms, key)


def test_unknown_topic_has_no_route() -> None:
    assert RouteTable().route("T") is None


def test_register_then_route() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4, TBW102=8))
    route = table.route("TopicA")
    assert route is not None
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas
    ] == [("broker-a", 4, 4, 6)]
    assert [(b.cluster, b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
        ("DefaultCluster", "broker-a", {0: ADDR_A})
    ]
    assert table.topic_list().topic_list == ["TBW102", "TopicA"]
    assert table.topics_by_cluster("DefaultCluster").topic_list == ["TBW102", "TopicA"]
    assert table.topics_by_cluster("Other").topic_list == []
    info = table.cluster_info()
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: ADDR_A}


def test_queue_data_only_when_version_changes() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4))
    # Same data version: the (different) table is ignored, as RocketMQ does.
    register(table, wrapped=wrapper(1, TopicA=8, TopicB=2))
    assert table.route("TopicB") is None
    route = table.route("TopicA")
    assert route is not None
    assert route.queue_datas[0].read_queue_nums == 4
    # A new version updates and adds, and does not prune topics it does not mention.
    register(table, wrapped=wrapper(2, TopicB=2))
    assert table.route("TopicB") is not None
    assert table.route("TopicA") is not None


def test_slave_registration_adds_address_not_queue_data() -> None:
    table = RouteTable()
    slave = register(table, addr=ADDR_A_SLAVE, broker_id=1, wrapped=wrapper(1, SlaveOnly=4))
    assert slave.master_addr is None
    assert table.route("SlaveOnly") is None
    register(table, wrapped=wrapper(1, TopicA=4))
    again = register(table, addr=ADDR_A_SLAVE, broker_id=1, wrapped=wrapper(1, TopicA=4))
    assert again.master_addr == ADDR_A
    assert again.ha_server_addr == ADDR_A + "2"
    route = table.route("TopicA")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: ADDR_A, 1: ADDR_A_SLAVE}


def test_slave_promoted_replaces_old_id() -> None:
    table = RouteTable()
    register(table, addr=ADDR_A_SLAVE, broker_id=1, wrapped=wrapper(1, TopicA=4))
    register(table, addr=ADDR_A_SLAVE, broker_id=0, wrapped=wrapper(1, TopicA=4))
    route = table.route("TopicA")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: ADDR_A_SLAVE}


def test_expire_drops_silent_brokers_and_their_topics() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4, Shared=4), now_ms=NOW)
    register(table, "broker-b", ADDR_B, wrapped=wrapper(1, Shared=2), now_ms=NOW + 60_000)
    assert table.expire(NOW + 119_999) == []
    dropped = table.expire(NOW + 120_000, expiry_ms=120_000)
    assert [(d.broker_addr, d.broker_name, d.cluster) for d in dropped] == [
        (ADDR_A, "broker-a", "DefaultCluster")
    ]
    assert table.route("TopicA") is None
    shared = table.route("Shared")
    assert shared is not None
    assert [q.broker_name for q in shared.queue_datas] == ["broker-b"]
    assert table.cluster_info().cluster_addr_table == {"DefaultCluster": ["broker-b"]}
    assert table.broker_addrs() == [ADDR_B]


def test_reregistration_keeps_broker_alive() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4), now_ms=NOW)
    register(table, wrapped=wrapper(1, TopicA=4), now_ms=NOW + 100_000)
    assert table.expire(NOW + 150_000) == []
    changed, stored = table.query_data_version(
        ADDR_A, DataVersion(timestamp=NOW, counter=1), NOW + 200_000
    )
    assert not changed
    assert stored == DataVersion(timestamp=NOW, counter=1)
    assert table.expire(NOW + 250_000) == []
    changed, _ = table.query_data_version(ADDR_A, DataVersion(timestamp=NOW, counter=2), NOW)
    assert changed
    assert table.query_data_version(ADDR_B, DataVersion(timestamp=0, counter=0), NOW) == (
        True,
        None,
    )


def test_connection_closed_drops_its_brokers_only() -> None:
    table = RouteTable()
    key_a, key_b = object(), object()
    register(table, wrapped=wrapper(1, TopicA=4), key=key_a)
    register(table, "broker-b", ADDR_B, wrapped=wrapper(1, TopicB=4), key=key_b)
    dropped = table.on_connection_closed(key_a)
    assert [d.broker_addr for d in dropped] == [ADDR_A]
    assert dropped[0].connection_key is key_a
    assert table.route("TopicA") is None
    assert table.route("TopicB") is not None
    assert table.on_connection_closed(key_a) == []


def test_master_gone_slave_remains_keeps_route() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4), key="m")
    register(table, addr=ADDR_A_SLAVE, broker_id=1, key="s")
    table.on_connection_closed("m")
    route = table.route("TopicA")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {1: ADDR_A_SLAVE}
    table.on_connection_closed("s")
    assert table.route("TopicA") is None
    assert table.cluster_info().broker_addr_table == {}


def test_unregister() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4))
    table.unregister_broker("DefaultCluster", "broker-a", "10.9.9.9:1", 0)  # wrong address
    assert table.route("TopicA") is not None
    table.unregister_broker("DefaultCluster", "broker-a", ADDR_A, 0)
    assert table.route("TopicA") is None
    assert table.cluster_info().cluster_addr_table == {}
    assert table.broker_addrs() == []


def test_delete_topic_everywhere_or_per_cluster() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4, TopicB=4))
    register(table, "broker-b", ADDR_B, wrapped=wrapper(1, TopicA=4), cluster="Other")
    table.delete_topic("TopicA", "Other")
    route = table.route("TopicA")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["broker-a"]
    table.delete_topic("TopicA", "DefaultCluster")
    assert table.route("TopicA") is None
    table.delete_topic("TopicB")
    assert table.topic_list().topic_list == []
    table.delete_topic("Missing")


def test_wipe_and_add_write_perm() -> None:
    table = RouteTable()
    register(table, wrapped=wrapper(1, TopicA=4, TopicB=4))
    register(table, "broker-b", ADDR_B, wrapped=wrapper(1, TopicA=4))
    assert table.wipe_write_perm("broker-a") == 2
    route = table.route("TopicA")
    assert route is not None
    perms = {q.broker_name: q.perm for q in route.queue_datas}
    assert perms == {"broker-a": 6 & ~PERM_WRITE, "broker-b": 6}
    assert table.add_write_perm("broker-a") == 2
    route = table.route("TopicA")
    assert route is not None
    assert {q.perm for q in route.queue_datas} == {6}
    assert table.wipe_write_perm("nobody") == 0
