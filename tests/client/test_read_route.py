"""Reads from a broker group (master + slave): which broker serves pulls, offsets and locks.

The pure rule first (read_route.py), then the clients against scripted brokers on loopback: a
group "broker-a" of a master (id 0) and a slave (id 1), both QueueBrokers holding the same
messages (what replication would give them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from client_fakes import FakeCluster, QueueBroker, until

from tidemq.client import api, slave_offsets
from tidemq.client import consumer as consumer_module
from tidemq.client.admin import Admin
from tidemq.client.assignment import OwnedQueue, release_queues
from tidemq.client.consumer import PushConsumer
from tidemq.client.fault import PROBE_INTERVAL_MS
from tidemq.client.instance import ClientInstance
from tidemq.client.message import ConsumeFromWhere, Message, MessageExt
from tidemq.client.offset_store import OffsetTable
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.read_route import PullSuggestions, ReadRouter, choose_read, read_order
from tidemq.client.route_cache import RouteCache
from tidemq.clock import FakeClock
from tidemq.errors import ConnectionClosedError
from tidemq.protocol.bodies import (
    BrokerData,
    MessageQueue,
    QueueData,
    TopicOffset,
    TopicRouteData,
    TopicStatsTable,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import PullSysFlag

MQ = MessageQueue("TopicA", "broker-a", 0)
KEY = ("CG", "TopicA", 0)

# -- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addrs", "preferred", "order"),
    [
        ({0: "m", 1: "s1", 2: "s2"}, 0, [0, 1, 2]),
        ({0: "m", 1: "s1", 2: "s2"}, 2, [2, 0, 1]),
        ({0: "m", 1: "s1"}, 3, [0, 1]),  # a suggested id the route lacks: as upstream, any
        ({2: "s2", 1: "s1"}, 0, [1, 2]),  # no master: the lowest-id slave first
        ({}, 0, []),
    ],
)
def test_read_order(addrs: dict[int, str], preferred: int, order: list[int]) -> None:
    assert read_order(addrs, preferred) == order


def test_choose_read_skips_failed_addresses_but_never_all() -> None:
    addrs = {0: "m", 1: "s1", 2: "s2"}
    assert choose_read(addrs, 0, lambda addr: True) == 0
    assert choose_read(addrs, 0, lambda addr: addr != "m") == 1
    assert choose_read(addrs, 1, lambda addr: addr != "s1") == 0
    assert choose_read(addrs, 0, lambda addr: False) == 0  # all skipped: the first anyway
    assert choose_read({}, 0, lambda addr: True) is None


def test_pull_suggestions_remember_per_queue() -> None:
    table = PullSuggestions()
    other = MessageQueue("TopicA", "broker-a", 1)
    assert table.get(MQ) == 0
    table.update(MQ, 1)
    assert (table.get(MQ), table.get(other)) == (1, 0)
    table.update(MQ, 0)
    assert table.get(MQ) == 0
    table.update(MQ, 2)
    table.forget(MQ)
    assert table.get(MQ) == 0


# -- against a master and a slave --------------------------------------------------------------


@pytest.fixture
async def group() -> AsyncIterator[FakeCluster]:
    """broker-a = master + slave; broker-b = a master alone."""
    cluster = FakeCluster(
        [QueueBroker("broker-a"), QueueBroker("broker-a", broker_id=1), QueueBroker("broker-b")]
    )
    await cluster.start()
    cluster.add_topic("TopicA", queues=1, brokers=cluster.brokers[:2])
    try:
        yield cluster
    finally:
        await cluster.stop()


def pair(cluster: FakeCluster) -> tuple[QueueBroker, QueueBroker]:
    master, slave = cluster.brokers[0], cluster.brokers[1]
    assert isinstance(master, QueueBroker)
    assert isinstance(slave, QueueBroker)
    return master, slave


def put_both(cluster: FakeCluster, *bodies: bytes) -> None:
    for broker in pair(cluster):
        for body in bodies:
            broker.put("TopicA", 0, body)


def drop_master_from_route(cluster: FakeCluster) -> None:
    _, slave = pair(cluster)
    cluster.add_topic("TopicA", queues=1, brokers=[slave])


def sys_flags(broker: QueueBroker) -> list[int]:
    return [int(r.ext_fields["sysFlag"]) for r in broker.of_code(RequestCode.PULL_MESSAGE)]


async def test_pull_follows_suggest_which_broker_id(group: FakeCluster) -> None:
    master, slave = pair(group)
    put_both(group, b"m0", b"m1", b"m2", b"m3")
    master.suggest_broker_id = 1
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        first = await pc.pull(MQ, "*", 0, 1)
        assert first.suggest_which_broker_id == 1
        second = await pc.pull(MQ, "*", 1, 1)  # the master said: pull from slave 1
        master.suggest_broker_id = 7  # an id the route lacks: then the master
        third = await pc.pull(MQ, "*", 2, 1)  # the slave said 0: back to the master
        await pc.pull(MQ, "*", 3, 1)
        await pc.pull(MQ, "*", 3, 1)
    assert [m.body for r in (first, second, third) for m in r.messages] == [b"m0", b"m1", b"m2"]
    assert len(master.of_code(RequestCode.PULL_MESSAGE)) == 4
    assert len(slave.of_code(RequestCode.PULL_MESSAGE)) == 1


async def test_a_pull_from_a_slave_carries_no_commit_offset(group: FakeCluster) -> None:
    master, slave = pair(group)
    put_both(group, b"m0")
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.pull(MQ, "*", 0, 1)  # the route is cached
        for broker_id in (0, 1):
            await api.pull(
                pc.instance,
                MQ,
                group="CG",
                expression="*",
                offset=0,
                max_nums=1,
                sys_flag=int(PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUBSCRIPTION),
                commit_offset=1,
                timeout_ms=3_000,
                broker_id=broker_id,
            )
    assert sys_flags(master)[-1] & PullSysFlag.COMMIT_OFFSET
    assert sys_flags(slave) == [int(PullSysFlag.SUBSCRIPTION)]


async def test_without_a_master_reads_go_to_the_slave_and_locks_nowhere(group: FakeCluster) -> None:
    master, slave = pair(group)
    put_both(group, b"m0")
    drop_master_from_route(group)
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        result = await pc.pull(MQ, "*", 0, 4)
        await pc.update_consumer_offset(MQ, 1)
        assert await pc.fetch_consumer_offset(MQ) == 1
        assert await pc.max_offset(MQ) == 1
        assert await api.lock_queues(pc.instance, "CG", [MQ]) == set()
    assert [m.body for m in result.messages] == [b"m0"]
    assert slave.offsets[KEY] == 1
    assert not slave.of_code(RequestCode.LOCK_BATCH_MQ)  # slaves refuse locks: never asked
    assert not master.requests


async def test_heartbeats_reach_slaves_only_for_consumers(group: FakeCluster) -> None:
    master, slave = pair(group)
    async with Producer("PG", group.namesrv_addr) as producer:
        await producer.send(Message("TopicA", b"x"))
        await producer.instance.heartbeat()
    assert master.of_code(RequestCode.HEART_BEAT)
    assert not slave.of_code(RequestCode.HEART_BEAT)  # a producer has nothing to do there
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        await pc.instance.heartbeat()
    assert slave.of_code(RequestCode.HEART_BEAT)
    assert slave.of_code(RequestCode.UNREGISTER_CLIENT)  # it knew the group: told it left


async def test_producers_skip_a_group_without_a_master(group: FakeCluster) -> None:
    _, slave = pair(group)
    other = group.brokers[2]
    group.add_topic("TopicB", queues=2, brokers=[slave, other])
    async with Producer("PG", group.namesrv_addr) as producer:
        results = [await producer.send(Message("TopicB", b"x")) for _ in range(4)]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    assert not slave.of_code(RequestCode.SEND_MESSAGE_V2)


async def test_consumer_ids_come_from_the_slave_without_a_master(group: FakeCluster) -> None:
    _, slave = pair(group)
    drop_master_from_route(group)
    instance = ClientInstance(group.namesrv_addr)
    await instance.start()
    try:
        await instance.route("TopicA")
        slave.client_ids.add("someone")
        ids = await api.consumer_ids(instance, "CG", instance.reads.target("broker-a"))
    finally:
        await instance.shutdown()
    assert ids == ["someone"]


async def test_push_consumer_fails_over_to_the_slave_and_returns(
    group: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "PULL_ERROR_DELAY_MS", 50)
    master, slave = pair(group)
    put_both(group, b"m0", b"m1")
    got: list[bytes] = []

    def listener(messages: list[MessageExt]) -> None:
        got.extend(m.body for m in messages)

    c = PushConsumer(
        "CG",
        group.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=100,
        persist_interval_ms=100,
    )
    c.subscribe("TopicA", "*")
    c.register_listener(listener)
    await c.start()
    try:
        await until(lambda: master.offsets.get(KEY) == 2)
        assert slave.of_code(RequestCode.HEART_BEAT)  # the slave knows the group
        # The master crashes; the route still lists it (the name servers have not noticed).
        await group.kill(master)
        slave.put("TopicA", 0, b"m2")
        await until(lambda: slave.offsets.get(KEY) == 3)
        assert got == [b"m0", b"m1", b"m2"]
        assert not any(flag & PullSysFlag.COMMIT_OFFSET for flag in sys_flags(slave))
        # The master comes back: a probe finds it, and pulls and commits go there again.
        pulls_before = len(master.of_code(RequestCode.PULL_MESSAGE))
        await group.restart(master)
        await until(lambda: master.offsets.get(KEY) == 3, 5 * PROBE_INTERVAL_MS / 1000)
        await until(lambda: len(master.of_code(RequestCode.PULL_MESSAGE)) > pulls_before)
        master.put("TopicA", 0, b"m2")
        master.put("TopicA", 0, b"m3")
        await until(lambda: master.offsets.get(KEY) == 4)
    finally:
        await c.shutdown()
    assert got == [b"m0", b"m1", b"m2", b"m3"]


async def test_admin_reads_a_group_from_its_slave_without_a_master(group: FakeCluster) -> None:
    _, slave = pair(group)
    drop_master_from_route(group)
    table = TopicStatsTable(offset_table={MQ: TopicOffset(min_offset=0, max_offset=3)})
    slave.replies[RequestCode.GET_TOPIC_STATS_INFO] = lambda request: request.response(
        ResponseCode.SUCCESS, body=table.to_json()
    )
    async with Admin(group.namesrv_addr) as admin:
        stats = await admin.topic_stats("TopicA")
    assert stats.offset_table[MQ].max_offset == 3


async def test_a_master_dropped_from_the_route_is_read_again_once_it_answers(
    group: FakeCluster,
) -> None:
    master, slave = pair(group)
    put_both(group, b"m0")
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        drop_master_from_route(group)
        await pc.instance.fetch_route("TopicA")
        await pc.pull(MQ, "*", 0, 1)
        assert len(slave.of_code(RequestCode.PULL_MESSAGE)) == 1
        # It registers again; a probe finds it answering and refreshes the routes at once,
        # long before the 30 s route refresh.
        group.add_topic("TopicA", queues=1, brokers=[master, slave])
        await until(lambda: pc.instance.reads.target("broker-a").broker_id == 0)
        await pc.pull(MQ, "*", 0, 1)
    assert len(master.of_code(RequestCode.PULL_MESSAGE)) == 1
    assert master.of_code(RequestCode.HEART_BEAT)


# -- offset commits go to the master while the route lists it --------------------------------


def update_offsets(broker: QueueBroker) -> list[int]:
    """The commitOffset of every UPDATE_CONSUMER_OFFSET `broker` received, in order."""
    return [
        int(r.ext_fields["commitOffset"])
        for r in broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)
    ]


async def test_a_commit_goes_to_a_master_that_just_failed_a_pull(group: FakeCluster) -> None:
    master, slave = pair(group)
    put_both(group, b"m0")
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        master.drop_next.add(RequestCode.PULL_MESSAGE)  # one transport error, the master is fine
        with pytest.raises(ConnectionClosedError):
            await pc.pull(MQ, "*", 0, 1)
        assert pc.instance.reads.target("broker-a").is_slave  # reads avoid it for a while
        stored = await pc.update_consumer_offset(MQ, 1)  # the commit does not
        assert master.offsets.get(KEY) == 1
        assert stored is True
        assert pc.offsets_on_slave == {}
        assert pc.instance.reads.target("broker-a").broker_id == 0  # it answered: readmitted
    assert master.offsets[KEY] == 1
    assert not slave.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)


async def test_a_commit_only_a_slave_took_is_sent_to_the_master_until_it_takes_it(
    group: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slave_offsets, "RESEND_INTERVAL_MS", 50)
    master, slave = pair(group)
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        master.drop_next.add(RequestCode.UPDATE_CONSUMER_OFFSET)
        assert await pc.update_consumer_offset(MQ, 3) is False  # the master's request failed
        assert slave.offsets[KEY] == 3
        assert pc.offsets_on_slave == {MQ: 3}
        await until(lambda: master.offsets.get(KEY) == 3)
        assert pc.offsets_on_slave == {}
        # A later commit replaces a pending one: the older value never follows it.
        master.drop_next.add(RequestCode.UPDATE_CONSUMER_OFFSET)
        assert await pc.update_consumer_offset(MQ, 5) is False
        assert await pc.update_consumer_offset(MQ, 6) is True
        assert pc.offsets_on_slave == {}
        await asyncio.sleep(0.2)
    assert master.offsets[KEY] == 6
    assert update_offsets(master) == [3, 3, 5, 6]  # dropped 3, re-sent 3, dropped 5, 6


async def test_pull_consumer_shutdown_tries_the_master_for_what_a_slave_took(
    group: FakeCluster,
) -> None:
    master, slave = pair(group)
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        master.drop_next.add(RequestCode.UPDATE_CONSUMER_OFFSET)
        assert await pc.update_consumer_offset(MQ, 4) is False
    # Shut down before the first re-send (1 s): the shutdown sent it.
    assert master.offsets[KEY] == 4
    assert slave.offsets[KEY] == 4


async def test_giving_a_queue_up_tries_the_master_again_after_its_commit_failed(
    group: FakeCluster,
) -> None:
    master, slave = pair(group)
    instance = ClientInstance(group.namesrv_addr)
    await instance.start()
    try:
        await instance.route("TopicA")
        offsets = OffsetTable()
        offsets.update(MQ, 7)
        master.drop_next.add(RequestCode.UPDATE_CONSUMER_OFFSET)
        owned = [OwnedQueue(MQ, ProcessQueue(), 7)]
        await release_queues(instance, "CG", owned, offsets, clustering=True, orderly=False)
    finally:
        await instance.shutdown()
    assert slave.offsets[KEY] == 7  # where the first commit landed
    assert master.offsets[KEY] == 7  # the second try
    assert offsets.get(MQ) is None


async def test_push_consumer_shutdown_commit_reaches_the_master_after_one_failure(
    group: FakeCluster,
) -> None:
    master, _ = pair(group)
    put_both(group, b"m0", b"m1")
    got: list[bytes] = []
    c = PushConsumer(
        "CG",
        group.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=60_000,
        persist_interval_ms=60_000,  # only the shutdown commits
    )
    c.subscribe("TopicA", "*")
    c.register_listener(lambda messages: got.extend(m.body for m in messages))
    await c.start()
    try:
        await until(lambda: len(got) == 2)
        master.drop_next.add(RequestCode.UPDATE_CONSUMER_OFFSET)
    finally:
        await c.shutdown()
    assert master.offsets[KEY] == 2


# -- probes of a master that reads skip ----------------------------------------------------


def broker_a_routes() -> RouteCache:
    routes = RouteCache()
    route = TopicRouteData(
        queue_datas=[QueueData("broker-a", 1, 1, 6)],
        broker_datas=[BrokerData("C", "broker-a", {0: "master:1", 1: "slave:1"})],
    )
    routes.put("TopicA", route, 0.0)
    return routes


async def test_a_master_answering_its_probe_slowly_is_read_from_again() -> None:
    clock = FakeClock()
    probed: list[str] = []

    async def probe(addr: str, timeout_ms: float) -> None:
        probed.append(addr)
        clock.advance(700)  # answers, in 700 ms (a send would be skipped 30 s for that)

    router = ReadRouter(broker_a_routes(), clock, probe)
    try:
        router.record(router.target("broker-a"), failed=True)
        assert router.target("broker-a").is_slave
        clock.advance(PROBE_INTERVAL_MS)
        await until(lambda: router.target("broker-a").broker_id == 0, 2.0)
    finally:
        await router.stop()
    assert probed == ["master:1"]


async def test_routes_are_refreshed_until_they_list_a_returning_master(
    group: FakeCluster,
) -> None:
    master, slave = pair(group)
    async with PullConsumer("CG", group.namesrv_addr) as pc:
        await pc.fetch_subscribe_message_queues("TopicA")
        drop_master_from_route(group)
        await pc.instance.fetch_route("TopicA")  # the master is watched (probed)
        asked = len(group.route_requests)
        # The probe finds it answering; the refresh that follows asks a name server that has
        # not heard of it yet.
        await until(lambda: len(group.route_requests) > asked, 5.0)
        assert pc.instance.reads.target("broker-a").is_slave
        group.add_topic("TopicA", queues=1, brokers=[master, slave])  # now it has
        await until(lambda: pc.instance.reads.target("broker-a").broker_id == 0, 5.0)
    assert len(group.route_requests) >= asked + 2
