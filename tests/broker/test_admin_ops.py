"""Admin operations end to end (broker/handlers/admin_ops.py, client/admin_groups.py): real
name server and broker on loopback, real producers and push consumers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from broker_harness import running_broker

from tidemq import Admin, Message, MessageExt, Producer, PullConsumer, PushConsumer
from tidemq.broker.handlers.admin_ops import RUNNING_INFO_TIMEOUT_MS
from tidemq.client import admin_groups
from tidemq.errors import BrokerError, SubscriptionGroupNotExistError, SystemErrorError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.bodies_admin import PROP_CONSUME_TYPE, PROP_CONSUMER_START_TIMESTAMP
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.testing import LocalCluster, eventually, eventually_async, local_cluster

pytestmark = pytest.mark.integration

TOPIC = "AdminOpsTopic"
GROUP = "CG-admin-ops"
PRODUCER_GROUP = "PG-admin-ops"
COUNT = 6

# Keys rocketmq-exporter's BrokerRuntimeStats parses without a default (it fails on a missing
# one): the runtime info must carry every one.
EXPORTER_KEYS = [
    "msgPutTotalTodayNow",
    "msgGetTotalTodayNow",
    "msgPutTotalTodayMorning",
    "msgGetTotalTodayMorning",
    "msgPutTotalYesterdayMorning",
    "msgGetTotalYesterdayMorning",
    "putMessageDistributeTime",
    "putTps",
    "getMissTps",
    "getTransferedTps",
    "getTotalTps",
    "getFoundTps",
    "commitLogDirCapacity",
    "sendThreadPoolQueueHeadWaitTimeMills",
    "queryThreadPoolQueueHeadWaitTimeMills",
    "remainHowManyDataToFlush",
    "queryThreadPoolQueueSize",
    "bootTimestamp",
    "pullThreadPoolQueueSize",
    "commitLogMinOffset",
    "pullThreadPoolQueueHeadWaitTimeMills",
    "runtime",
    "dispatchMaxBuffer",
    "brokerVersion",
    "consumeQueueDiskRatio",
    "pageCacheLockTimeMills",
    "commitLogDiskRatio",
    "commitLogMaxOffset",
    "getMessageEntireTimeMax",
    "putMessageTimesTotal",
    "brokerVersionDesc",
    "sendThreadPoolQueueSize",
    "startAcceptSendRequestTimeStamp",
    "putMessageEntireTimeMax",
    "earliestMessageTimeStamp",
    "remainTransientStoreBufferNumbs",
    "queryThreadPoolQueueCapacity",
    "putMessageAverageSize",
    "dispatchBehindBytes",
    "putMessageSizeTotal",
    "sendThreadPoolQueueCapacity",
    "pullThreadPoolQueueCapacity",
]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path) as c:
        async with Admin(c.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)

            async def registered() -> bool:
                # Producers must not fall back to TBW102's 4 queues before the name server
                # has the topic (the broker registers it in the background).
                try:
                    return bool((await admin.topic_route(TOPIC)).queue_datas)
                except BrokerError:
                    return False

            await eventually_async(registered, what="the topic's route")
        yield c


@pytest.fixture
async def admin(cluster: LocalCluster) -> AsyncIterator[Admin]:
    async with Admin(cluster.namesrv_addr) as a:
        yield a


async def send_all(cluster: LocalCluster, count: int = COUNT) -> list[str]:
    async with Producer(PRODUCER_GROUP, cluster.namesrv_addr) as producer:
        results = [await producer.send(Message(TOPIC, b"m-%d" % n)) for n in range(count)]
    return [r.offset_msg_id for r in results]


async def consumer_of(
    cluster: LocalCluster, got: list[MessageExt], group: str = GROUP
) -> PushConsumer:
    consumer = PushConsumer(group, cluster.namesrv_addr, rebalance_interval_ms=200)
    consumer.subscribe(TOPIC)
    consumer.register_listener(lambda msgs: got.extend(msgs))
    await consumer.start()
    return consumer


def bodies(got: list[MessageExt]) -> list[bytes]:
    return [m.body for m in got]


async def committed(
    cluster: LocalCluster, group: str, topic: str, expected: Mapping[int, int]
) -> None:
    """Wait until the broker holds `expected` (queue id → offset) for the group."""
    offsets = cluster.brokers[0].offsets
    await eventually(
        lambda: all(offsets.query(group, topic, q) == off for q, off in expected.items()),
        what=f"{group}'s commits {dict(expected)}",
    )


async def test_connections_groups_and_running_info(cluster: LocalCluster, admin: Admin) -> None:
    got: list[MessageExt] = []
    consumer = await consumer_of(cluster, got)
    try:
        async with Producer(PRODUCER_GROUP, cluster.namesrv_addr) as producer:
            await producer.send(Message(TOPIC, b"hello"))
            producers = await admin.producer_connections(PRODUCER_GROUP, TOPIC)
            assert [c.client_id for c in producers.connection_set] == [producer.instance.client_id]
        await eventually(lambda: len(got) == 1)
        connections = await admin.consumer_connections(GROUP)
        client_id = consumer.instance.client_id
        assert [c.client_id for c in connections.connection_set] == [client_id]
        assert TOPIC in connections.subscription_table
        assert connections.message_model == "CLUSTERING"
        assert GROUP in await admin.topic_consumers(TOPIC)
        assert GROUP in await admin.groups()

        info = await admin.consumer_running_info(GROUP, client_id)
        assert info["consumerGroup"] == GROUP
        assert int(info[PROP_CONSUMER_START_TIMESTAMP]) > 0
        mq = MessageQueue(TOPIC, "broker-a", 0)
        assert mq in info.mq_table
        assert {s.topic for s in info.subscription_set} >= {TOPIC, pm.retry_topic(GROUP)}
        with pytest.raises(SystemErrorError, match="not online"):
            await admin.consumer_running_info(GROUP, "10.0.0.1@1#nobody")
        # The broker gives up on a silent consumer before the caller's own timeout, so the
        # caller sees the broker's remark naming the consumer.
        assert admin.timeout_ms > RUNNING_INFO_TIMEOUT_MS
    finally:
        await consumer.shutdown()
    with pytest.raises(BrokerError):
        await admin.producer_connections("PG-nobody", TOPIC)


async def test_reset_by_timestamp_with_live_consumer(cluster: LocalCluster, admin: Admin) -> None:
    got: list[MessageExt] = []
    consumer = await consumer_of(cluster, got)
    try:
        await send_all(cluster)
        await eventually(lambda: len(got) == COUNT)
        # The broker refuses a group with no offset for the topic: wait for the first commit.
        await committed(cluster, GROUP, TOPIC, {0: COUNT})
        table = await admin.reset_offset_by_timestamp(GROUP, TOPIC, 0)
        assert table == {MessageQueue(TOPIC, "broker-a", 0): 0}
        # The live consumer drops its queue and reads it again from the start.
        await eventually(lambda: len(got) == 2 * COUNT, what="every message a second time")
        assert sorted(bodies(got[COUNT:])) == sorted(bodies(got[:COUNT]))
        # Explicit: one queue to offset 4.
        mq = MessageQueue(TOPIC, "broker-a", 0)
        assert await admin.reset_offset_to(GROUP, TOPIC, {mq: 4}) == {mq: 4}
        await eventually(lambda: len(got) == 2 * COUNT + 2)
        assert bodies(got[-2:]) == [b"m-4", b"m-5"]
    finally:
        await consumer.shutdown()


async def test_reset_and_delete_without_consumer(cluster: LocalCluster, admin: Admin) -> None:
    got: list[MessageExt] = []
    consumer = await consumer_of(cluster, got)
    await send_all(cluster)
    await eventually(lambda: len(got) == COUNT)
    await consumer.shutdown()
    stats = await admin.consume_stats(GROUP, TOPIC)
    mq = MessageQueue(TOPIC, "broker-a", 0)
    assert stats.offset_table[mq].consumer_offset == COUNT
    (span,) = await admin.consume_time_span(GROUP, TOPIC)
    assert span.message_queue == mq
    assert 0 < span.min_timestamp <= span.consume_timestamp == span.max_timestamp
    assert span.delay_time == 0

    await admin.reset_offset_by_timestamp(GROUP, TOPIC, 0)
    assert (await admin.consume_stats(GROUP, TOPIC)).offset_table[mq].consumer_offset == 0
    (span,) = await admin.consume_time_span(GROUP, TOPIC)
    assert span.consume_timestamp == span.min_timestamp
    assert span.delay_time >= 0
    again: list[MessageExt] = []
    consumer = await consumer_of(cluster, again)
    try:
        await eventually(lambda: len(again) == COUNT, what="the group restarts at 0")
    finally:
        await consumer.shutdown()

    await admin.delete_group(GROUP)  # as upstream: the offsets stay by default
    assert GROUP not in await admin.groups()
    assert cluster.brokers[0].offsets.offsets(GROUP, TOPIC)
    await admin.delete_group(GROUP, remove_offset=True)  # the header's cleanOffset
    assert not cluster.brokers[0].offsets.offsets(GROUP, TOPIC)
    with pytest.raises(SystemErrorError, match="consumer group <CG-nobody> not exist"):
        await admin.reset_offset_by_timestamp("CG-nobody", TOPIC, 0)
    assert not cluster.brokers[0].offsets.offsets("CG-nobody", TOPIC)


async def test_stats_config_and_runtime_info(cluster: LocalCluster, admin: Admin) -> None:
    await send_all(cluster)
    broker = cluster.brokers[0]
    broker.stats.sample()
    data = await admin.broker_stats(cluster.broker_addr, "TOPIC_PUT_NUMS", TOPIC)
    assert data.stats_minute.sum == COUNT
    with pytest.raises(SystemErrorError, match="not exist"):
        await admin.broker_stats(cluster.broker_addr, "TOPIC_PUT_NUMS", "NoSuchTopic")

    config = await admin.broker_config(cluster.broker_addr)
    assert config["brokerName"] == "broker-a"
    with pytest.raises(SystemErrorError, match="not changeable at run time: brokerName"):
        await admin.update_broker_config(
            cluster.broker_addr, {"brokerName": "other", "diskMaxUsedSpaceRatio": "50"}
        )
    assert broker.store.config.disk_max_used_space_ratio_percent == 75  # nothing applied
    with pytest.raises(SystemErrorError, match="diskMaxUsedSpaceRatio"):
        await admin.update_broker_config(cluster.broker_addr, {"diskMaxUsedSpaceRatio": "101"})
    await admin.update_broker_config(cluster.broker_addr, {"diskMaxUsedSpaceRatio": "60"})
    assert broker.store.config.disk_max_used_space_ratio_percent == 60
    assert (await admin.broker_config(cluster.broker_addr))["diskMaxUsedSpaceRatio"] == "60"

    info = await admin.broker_runtime_info(cluster.broker_addr)
    missing = [key for key in EXPORTER_KEYS if key not in info]
    assert not missing
    assert int(info["msgPutTotalTodayNow"]) == COUNT
    ten_s, minute, ten_min = (float(rate) for rate in info["putTps"].split())
    assert ten_s > 0  # the last 10 s sampling interval holds the sends
    assert minute > 0
    assert ten_min >= 0


async def test_resend_and_query_by_time(cluster: LocalCluster, admin: Admin) -> None:
    ids = await send_all(cluster)
    found = await admin.query_messages_by_time(TOPIC, 0, 2**62, max_count=4)
    assert bodies(found) == [b"m-0", b"m-1", b"m-2", b"m-3"]
    got: list[MessageExt] = []
    consumer = await consumer_of(cluster, got)
    try:
        await eventually(lambda: len(got) == COUNT)
        resent = await admin.resend_message(ids[2], GROUP)
        assert resent.body == b"m-2"
        await eventually(lambda: len(got) == COUNT + 1, what="the resent copy")
        copy = got[-1]
        assert copy.body == b"m-2"
        assert copy.topic == TOPIC
        assert copy.properties.get(pm.ORIGIN_MESSAGE_ID)
    finally:
        await consumer.shutdown()


async def test_resend_from_a_fresh_admin_reaches_only_that_group(
    cluster: LocalCluster, admin: Admin
) -> None:
    ids = await send_all(cluster)
    got: list[MessageExt] = []
    other: list[MessageExt] = []
    consumer = await consumer_of(cluster, got)
    bystander = await consumer_of(cluster, other, group="CG-admin-other")
    try:
        await eventually(lambda: len(got) == COUNT and len(other) == COUNT)
        # A new Admin has no cached route of the topic: the broker name comes from the cluster.
        async with Admin(cluster.namesrv_addr) as fresh:
            resent = await fresh.resend_message(ids[3], GROUP)
        assert resent.broker_name == "broker-a"
        await eventually(lambda: len(got) == COUNT + 1, what="the resent copy")
        assert got[-1].body == b"m-3"
        # Both groups have consumed every original, and the copy went to %RETRY%GROUP only.
        other_retry = cluster.brokers[0].store.max_offset(pm.retry_topic("CG-admin-other"), 0)
        assert other_retry == 0
        assert len(other) == COUNT
    finally:
        await bystander.shutdown()
        await consumer.shutdown()


async def test_tool_reads_work_without_group_auto_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOOLS_CONSUMER is pre-created as upstream's system groups are; a refused pull is an
    error, not an empty result."""
    settings = {"autoCreateSubscriptionGroup": "false"}
    async with local_cluster(tmp_path, broker_settings=settings) as c, Admin(c.namesrv_addr) as a:
        await a.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
        await eventually_async(lambda: _has_route(a, TOPIC), what="the topic's route")
        await send_all(c, 3)
        found = await a.query_messages_by_time(TOPIC, 0, 2**62)
        assert bodies(found) == [b"m-0", b"m-1", b"m-2"]
        monkeypatch.setattr(admin_groups, "QUERY_CONSUMER_GROUP", "CG-not-created")
        with pytest.raises(SubscriptionGroupNotExistError):
            await a.query_messages_by_time(TOPIC, 0, 2**62)


async def _has_route(admin: Admin, topic: str) -> bool:
    try:
        return bool((await admin.topic_route(topic)).queue_datas)
    except BrokerError:
        return False


async def test_a_slave_refuses_the_admin_writes(tmp_path: Path) -> None:
    """Group delete, offset reset and config change on a slave would be undone by its next copy
    of the master's tables (slave_sync.py): refused as the topic writes are."""
    settings = {"brokerRole": "SLAVE", "brokerId": "1", "haSecret": "s" * 32}
    async with running_broker(tmp_path, **settings) as slave:
        requests = [
            (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": GROUP}, b""),
            (
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                {"topic": TOPIC, "group": GROUP, "timestamp": "0", "isForce": "true"},
                b"",
            ),
            (RequestCode.UPDATE_BROKER_CONFIG, {}, b"diskMaxUsedSpaceRatio=50\n"),
        ]
        for code, fields, body in requests:
            answer = await slave.call(RemotingCommand(code=code, ext_fields=fields, body=body))
            assert answer.code == ResponseCode.SLAVE_NOT_AVAILABLE, (code, answer.remark)


async def test_a_pull_consumer_reports_consume_actively(
    cluster: LocalCluster, admin: Admin
) -> None:
    async with PullConsumer("CG-admin-pull", cluster.namesrv_addr) as consumer:
        await consumer.fetch_subscribe_message_queues(TOPIC)
        await consumer.instance.heartbeat()  # now to the topic's broker
        info = await admin.consumer_running_info("CG-admin-pull", consumer.instance.client_id)
    assert info[PROP_CONSUME_TYPE] == "CONSUME_ACTIVELY"
    assert info["consumerGroup"] == "CG-admin-pull"


RESET_TOPIC = "AdminResetTopic4"
RESET_GROUP = "CG-admin-reset"


async def test_a_reset_with_two_consumers_never_moves_the_group_back(
    cluster: LocalCluster, admin: Admin
) -> None:
    """Two consumers share 4 queues; a reset to a timestamp between two batches makes each
    re-read the second batch of its own queues, and no consumer commits the reset offsets of
    queues it does not own (upstream resets only its processQueueTable): such a commit, sent
    after the owner had consumed on, would move the group back. Consumer B commits rarely, so a
    stale commit of it would land after A's."""
    await admin.create_topic(RESET_TOPIC, read_queue_nums=4, write_queue_nums=4)
    await eventually_async(lambda: _has_route(admin, RESET_TOPIC), what="the topic's route")
    offsets = cluster.brokers[0].offsets
    got: list[MessageExt] = []
    consumers = []
    for persist_ms in (100, 1_000):
        consumer = PushConsumer(
            RESET_GROUP,
            cluster.namesrv_addr,
            rebalance_interval_ms=200,
            persist_interval_ms=persist_ms,
        )
        consumer.subscribe(RESET_TOPIC)
        consumer.register_listener(lambda msgs: got.extend(msgs))
        await consumer.start()
        consumers.append(consumer)
    history: dict[int, list[int]] = {q: [] for q in range(4)}

    async def watch() -> None:
        while True:
            for q, seen in history.items():
                value = offsets.query(RESET_GROUP, RESET_TOPIC, q)
                if value is not None and (not seen or seen[-1] != value):
                    seen.append(value)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await eventually(
            lambda: all(len(_owned(c, RESET_TOPIC)) == 2 for c in consumers),
            what="2 queues each",
        )
        per_queue = await _send_batch(cluster, b"first", 20)
        await eventually(lambda: len(got) == 20)
        await committed(cluster, RESET_GROUP, RESET_TOPIC, per_queue)
        # A gap between the batches far wider than the second one's spread, so the offset
        # nearest to the second batch's first store time is each queue's first of the batch.
        gap_end = max(m.store_timestamp for m in got) + 500
        await eventually(lambda: time.time() * 1000 > gap_end, what="a gap")
        second = await _send_batch(cluster, b"second", 20)
        after = {q: per_queue[q] + second[q] for q in range(4)}
        await eventually(lambda: len(got) == 40)
        middle = min(m.store_timestamp for m in got[20:])
        await committed(cluster, RESET_GROUP, RESET_TOPIC, after)
        for seen in history.values():
            seen.clear()

        table = await admin.reset_offset_by_timestamp(RESET_GROUP, RESET_TOPIC, middle)
        assert table == {MessageQueue(RESET_TOPIC, "broker-a", q): per_queue[q] for q in range(4)}
        await eventually(lambda: len(got) == 60, what="the second batch read again")
        assert sorted(bodies(got[40:])) == sorted(bodies(got[20:40]))
        await committed(cluster, RESET_GROUP, RESET_TOPIC, after)  # B's slow round included
        third = await _send_batch(cluster, b"third", 20)
        final = {q: after[q] + third[q] for q in range(4)}
        await eventually(lambda: len(got) == 80)
        await committed(cluster, RESET_GROUP, RESET_TOPIC, final)
    finally:
        for consumer in consumers:
            await consumer.shutdown()
        watcher.cancel()
    assert {q: offsets.query(RESET_GROUP, RESET_TOPIC, q) for q in range(4)} == final
    for q, seen in history.items():
        # Before the reset: the second batch's end; then the reset value, and only upwards.
        assert per_queue[q] in seen, (q, seen)
        since_reset = seen[seen.index(per_queue[q]) :]
        assert since_reset == sorted(since_reset), f"queue {q} committed offsets went back: {seen}"


def _owned(consumer: PushConsumer, topic: str) -> list[MessageQueue]:
    return [mq for mq in consumer.assigned_queues() if mq.topic == topic]


async def _send_batch(cluster: LocalCluster, tag: bytes, count: int) -> dict[int, int]:
    """Send `count` messages to RESET_TOPIC; returns how many each queue got."""
    per_queue = dict.fromkeys(range(4), 0)
    async with Producer(PRODUCER_GROUP, cluster.namesrv_addr) as producer:
        for n in range(count):
            result = await producer.send(Message(RESET_TOPIC, tag + b"-%d" % n))
            per_queue[result.message_queue.queue_id] += 1
    return per_queue
