"""Issue 13 item 6, TideMQ's client side, against real in-process brokers: a group of a master and
a slave (tidemq.testing.local_cluster(slaves=1)). With the master stopped, a push consumer of the
group takes its offsets from the slave, consumes from the slave every message the master had
replicated, and commits there; once the master is back, commits reach it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq.broker.app import BrokerApp
from tidemq.client import api
from tidemq.client.admin import Admin
from tidemq.client.consumer import PushConsumer
from tidemq.client.instance import ClientInstance
from tidemq.client.message import ConsumeFromWhere, Message, MessageExt
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.errors import RequestTimeoutError
from tidemq.protocol.bodies import TopicConfigSerializeWrapper
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    PullSysFlag,
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tidemq.testing import LocalCluster, eventually, local_cluster
from tidemq.testing.wait import eventually_async

pytestmark = pytest.mark.integration

TOPIC = "ReplicaTopic"
GROUP = "ReplicaGroup"
QUEUES = 2
PER_QUEUE = 10  # messages per queue
MIDDLE = 5  # the offset of each queue the second consumer starts from


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, slaves=1) as running:
        yield running


def replicated(cluster: LocalCluster) -> bool:
    master, slave = cluster.brokers[0], cluster.slaves[0][0]
    return slave.store.max_physical_offset >= master.store.max_physical_offset


def consumer(
    cluster: LocalCluster, got: list[tuple[int, int]], instance: ClientInstance | None = None
) -> PushConsumer:
    def listener(messages: list[MessageExt]) -> None:
        got.extend((m.queue_id, m.queue_offset) for m in messages)

    c = PushConsumer(
        GROUP,
        cluster.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=200,
        persist_interval_ms=200,
        instance=instance,
    )
    c.subscribe(TOPIC, "*")
    c.register_listener(listener)
    return c


def offset_command(code: int, queue_id: int, offset: int | None = None) -> RemotingCommand:
    header: QueryConsumerOffsetRequestHeader | UpdateConsumerOffsetRequestHeader
    if offset is None:
        header = QueryConsumerOffsetRequestHeader(
            consumer_group=GROUP, topic=TOPIC, queue_id=queue_id
        )
    else:
        header = UpdateConsumerOffsetRequestHeader(
            consumer_group=GROUP, topic=TOPIC, queue_id=queue_id, commit_offset=offset
        )
    return RemotingCommand(code=code, ext_fields=header.to_fields())


async def stored_offsets(admin: Admin, broker: BrokerApp) -> list[int]:
    """The group's offset of each queue as `broker` holds it (-1: none)."""
    found = []
    for queue_id in range(QUEUES):
        cmd = offset_command(RequestCode.QUERY_CONSUMER_OFFSET, queue_id)
        response = await admin.instance.remoting.invoke(broker.address, cmd, 3_000)
        if response.code != ResponseCode.SUCCESS:
            found.append(-1)
            continue
        found.append(OffsetResponseHeader.from_fields(response.ext_fields).offset)
    return found


async def offsets_become(admin: Admin, broker: BrokerApp, wanted: list[int], what: str) -> None:
    async def reached() -> bool:
        return await stored_offsets(admin, broker) == wanted

    await eventually_async(reached, 20.0, what=what)


async def produce_and_consume_once(cluster: LocalCluster, admin: Admin) -> None:
    """Every message sent, replicated and consumed once; then the master's offsets are set back
    to the middle of each queue."""
    master = cluster.brokers[0]
    await admin.create_topic(
        TOPIC, broker_addr=master.address, read_queue_nums=QUEUES, write_queue_nums=QUEUES
    )
    async with Producer("ReplicaProducer", cluster.namesrv_addr) as producer:
        for i in range(PER_QUEUE * QUEUES):
            await producer.send(Message(TOPIC, f"m{i}".encode()))
    await eventually(lambda: replicated(cluster), what="the slave has every message")
    first: list[tuple[int, int]] = []
    c = consumer(cluster, first)
    await c.start()
    await eventually(lambda: len(first) == PER_QUEUE * QUEUES)
    await c.shutdown()
    for queue_id in range(QUEUES):
        cmd = offset_command(RequestCode.UPDATE_CONSUMER_OFFSET, queue_id, MIDDLE)
        response = await admin.instance.remoting.invoke(master.address, cmd, 3_000)
        assert response.code == ResponseCode.SUCCESS


async def test_push_consumer_reads_and_commits_on_the_slave_while_the_master_is_down(
    cluster: LocalCluster,
) -> None:
    slave = cluster.slaves[0][0]
    end = [PER_QUEUE] * QUEUES
    second: list[tuple[int, int]] = []
    async with Admin(cluster.namesrv_addr) as admin:
        await produce_and_consume_once(cluster, admin)
        await offsets_become(admin, slave, [MIDDLE] * QUEUES, "the slave copied the offsets")
        await cluster.brokers[0].stop()
        # This consumer never saw the master: the route refresh is what brings it back (every
        # 30 s by default, as upstream; shortened here).
        instance = ClientInstance(cluster.namesrv_addr, route_refresh_interval_ms=500)
        c = consumer(cluster, second, instance)
        await c.start()
        try:
            await eventually(lambda: len(second) >= QUEUES * (PER_QUEUE - MIDDLE))
            await offsets_become(admin, slave, end, "offsets committed to the slave")
            master = await cluster.restart_broker(0)
            await offsets_become(admin, master, end, "offsets committed to the master again")
        finally:
            await c.shutdown()
    # Every message from the middle on, from the slave, and nothing before it.
    wanted = {(q, o) for q in range(QUEUES) for o in range(MIDDLE, PER_QUEUE)}
    assert set(second) == wanted
    assert len(second) == len(wanted)


async def queue_offset(admin: Admin, broker: BrokerApp, queue_id: int) -> int:
    """The group's offset of one queue as `broker` holds it (-1: none)."""
    cmd = offset_command(RequestCode.QUERY_CONSUMER_OFFSET, queue_id)
    response = await admin.instance.remoting.invoke(broker.address, cmd, 3_000)
    if response.code != ResponseCode.SUCCESS:
        return -1
    return OffsetResponseHeader.from_fields(response.ext_fields).offset


async def test_a_pull_consumer_commit_after_one_timeout_is_stored_on_the_master(
    cluster: LocalCluster,
) -> None:
    """A pull that times out (the master is healthy, the client gave up first) makes reads
    skip the master for a while; the commit that follows still goes to the master, so the
    slave's copy of the master's offsets confirms it rather than replacing it."""
    master, slave = cluster.brokers[0], cluster.slaves[0][0]
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(
            TOPIC, broker_addr=master.address, read_queue_nums=1, write_queue_nums=1
        )
        async with Producer("ReplicaProducer", cluster.namesrv_addr) as producer:
            for i in range(5):
                await producer.send(Message(TOPIC, f"m{i}".encode()))
        async with PullConsumer(GROUP, cluster.namesrv_addr) as pc:
            (mq,) = await pc.fetch_subscribe_message_queues(TOPIC)

            async def slave_has_them() -> bool:
                header = GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=0)
                cmd = RemotingCommand(
                    code=RequestCode.GET_MAX_OFFSET, ext_fields=header.to_fields()
                )
                response = await admin.instance.remoting.invoke(slave.address, cmd, 3_000)
                topics = RemotingCommand(code=RequestCode.GET_ALL_TOPIC_CONFIG)
                known = await admin.instance.remoting.invoke(slave.address, topics, 3_000)
                return (
                    response.code == ResponseCode.SUCCESS
                    and OffsetResponseHeader.from_fields(response.ext_fields).offset == 5
                    and known.code == ResponseCode.SUCCESS
                    and TOPIC
                    in TopicConfigSerializeWrapper.from_json(known.body).topic_config_table
                )

            # The slave has the messages and the topic's config (its metadata copy: ~1 s).
            await eventually_async(slave_has_them, 10.0, what="the slave serves the topic")
            with pytest.raises(RequestTimeoutError):  # held 2 s by the master, given up at 0.1
                await api.pull(
                    pc.instance,
                    mq,
                    group=GROUP,
                    expression="*",
                    offset=5,
                    max_nums=1,
                    sys_flag=int(PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION),
                    suspend_ms=2_000,
                    timeout_ms=100,
                )
            assert pc.instance.reads.target(mq.broker_name).is_slave
            stored = await pc.update_consumer_offset(mq, 3)
            assert await queue_offset(admin, master, 0) == 3  # at once, not via the slave
            assert stored is True
            assert pc.offsets_on_slave == {}

        async def slave_agrees() -> bool:
            return await queue_offset(admin, slave, 0) == 3

        await eventually_async(slave_agrees, 10.0, what="the slave copied the master's offset")
        assert await queue_offset(admin, master, 0) == 3
