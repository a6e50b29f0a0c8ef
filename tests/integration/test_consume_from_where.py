"""Where a new group starts (ConsumeFromWhere) and the producer's delivery time, end to end.

RocketMQ's rule (broker/handlers/offsets.py): a new group on a queue that still starts at offset 0
consumes from the beginning whatever it asked for; consumeFromWhere decides only once retention
has removed the queue's head. So the topic here loses its first segments before the groups start.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq import Admin, ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.protocol.message import TIMER_DELIVER_MS
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

HOURS_MS = 3_600_000
TOPIC = "CfwTopic"
OLD, MID, LATE = 40, 5, 5


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    # 4 KiB commit-log segments, so the old messages span several files retention can remove.
    settings = {"mappedFileSizeCommitLog": "4096"}
    async with local_cluster(tmp_path, broker_settings=settings) as c:
        yield c


async def start_group(
    cluster: LocalCluster, group: str, where: ConsumeFromWhere, **options: int
) -> tuple[PushConsumer, list[bytes]]:
    got: list[bytes] = []
    consumer = PushConsumer(
        group, cluster.namesrv_addr, consume_from_where=where, rebalance_interval_ms=200, **options
    )
    consumer.subscribe(TOPIC)
    consumer.register_listener(lambda msgs: got.extend(m.body for m in msgs))
    await consumer.start()
    return consumer, got


async def pump_until_new_arrives(producer: Producer, got: list[bytes]) -> None:
    """Send `new-k` until the group has one, so a group starting at the end has started."""

    def has_new() -> bool:
        return any(body.startswith(b"new") for body in got)

    for k in range(50):
        await producer.send(Message(TOPIC, b"new-%d" % k))
        try:
            await eventually(has_new, 0.2)
            return
        except TimeoutError:
            continue
    raise AssertionError("the group never received a new message")


async def test_new_groups_start_where_they_ask(cluster: LocalCluster) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
    async with Producer("PG-cfw", cluster.namesrv_addr) as producer:
        for n in range(OLD):
            await producer.send(Message(TOPIC, b"old-%02d-" % n + b"x" * 400))
        store = cluster.brokers[0].store
        assert store.clean_expired_files(now_ms() + 100 * HOURS_MS, force=True) > 0
        head = store.min_offset(TOPIC, 0)
        assert 0 < head < OLD
        for n in range(MID):
            await producer.send(Message(TOPIC, b"mid-%d" % n))
        # SEARCH_OFFSET answers the message stored nearest the time (as RocketMQ 4.x does): the
        # late ones are stored right at `since`, the mid ones at least 50 ms before it.
        since = now_ms() + 50
        await eventually(lambda: now_ms() >= since)
        for n in range(LATE):
            await producer.send(Message(TOPIC, b"late-%d" % n))

        groups = {
            "first": await start_group(
                cluster, "CG-first", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            ),
            "last": await start_group(
                cluster, "CG-last", ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            ),
            "time": await start_group(
                cluster,
                "CG-time",
                ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
                consume_timestamp_ms=since,
            ),
        }
        try:
            for _, got in groups.values():
                await pump_until_new_arrives(producer, got)
        finally:
            for consumer, _ in groups.values():
                await consumer.shutdown()

    def kinds(got: list[bytes]) -> set[bytes]:
        return {body.split(b"-")[0] for body in got}

    first, last, by_time = (groups[k][1] for k in ("first", "last", "time"))
    assert kinds(first) == {b"old", b"mid", b"late", b"new"}
    assert len([b for b in first if b.startswith(b"old")]) == OLD - head  # from the queue's head
    assert kinds(last) == {b"new"}
    assert kinds(by_time) == {b"late", b"new"}
    assert sorted(b for b in by_time if b.startswith(b"late")) == [b"late-%d" % n for n in range(5)]


async def test_a_new_group_on_a_young_queue_reads_it_all(cluster: LocalCluster) -> None:
    """Java parity: LAST_OFFSET still starts at 0 while the queue's head is there."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
    async with Producer("PG-young", cluster.namesrv_addr) as producer:
        for n in range(3):
            await producer.send(Message(TOPIC, b"old-%d" % n))
        consumer, got = await start_group(
            cluster, "CG-young", ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
        )
        try:
            await eventually(lambda: len(got) == 3)
        finally:
            await consumer.shutdown()
    assert sorted(got) == [b"old-0", b"old-1", b"old-2"]


async def test_deliver_time_holds_a_message_back_until_then(cluster: LocalCluster) -> None:
    got: list[tuple[MessageExt, int]] = []
    consumer = PushConsumer(
        "CG-timer",
        cluster.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=200,
    )
    consumer.subscribe("TimerTopic")
    consumer.register_listener(lambda msgs: got.extend((m, now_ms()) for m in msgs))
    await consumer.start()
    try:
        async with Producer("PG-timer", cluster.namesrv_addr) as producer:
            due = now_ms() + 600
            await producer.send(Message("TimerTopic", b"later", deliver_time_ms=due))
            await producer.send(Message("TimerTopic", b"now"))
        await eventually(lambda: len(got) == 2)
    finally:
        await consumer.shutdown()
    assert [m.body for m, _ in got] == [b"now", b"later"]
    later, arrived_ms = got[1]
    assert arrived_ms >= due
    assert TIMER_DELIVER_MS not in later.properties  # the broker drops it when due
