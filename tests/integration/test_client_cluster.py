"""The clients against a real in-process name server and broker (tidemq.testing.local_cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq import (
    Admin,
    BlockingAdmin,
    BlockingProducer,
    BlockingPullConsumer,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
)
from tidemq.testing import eventually

pytestmark = pytest.mark.integration

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[object]:
    testing = pytest.importorskip("tidemq.testing")
    async with testing.local_cluster(tmp_path) as running:
        yield running


async def test_send_and_pull_round_trip(cluster):
    async with Producer("PG", cluster.namesrv_addr, compress_over_bytes=1024) as producer:
        single = await producer.send(
            Message("RoundTrip", b"hello", tags="TagA", keys="k1 k2", properties={"color": "blue"}),
            queue=None,
        )
        big = await producer.send(Message("RoundTrip", b"z" * 5000, tags="TagB"))
        batch = await producer.send_batch(
            [Message("RoundTrip", b"b1"), Message("RoundTrip", b"b2")]
        )
    assert single.status is SendStatus.SEND_OK
    assert len(batch.msg_id.split(",")) == 2
    async with PullConsumer("CG", cluster.namesrv_addr) as consumer:
        queues = await consumer.fetch_subscribe_message_queues("RoundTrip")
        assert len(queues) == 4  # auto-created from TBW102 with 4 queues
        got: dict[bytes, MessageExt] = {}
        for mq in queues:
            result = await consumer.pull(mq, "*", 0, 32)
            got.update({m.body: m for m in result.messages})
        tagged: list[MessageExt] = []
        for mq in queues:
            tagged += (await consumer.pull(mq, "TagB", 0, 32)).messages
    assert set(got) == {b"hello", b"z" * 5000, b"b1", b"b2"}
    hello = got[b"hello"]
    assert hello.msg_id == single.msg_id
    assert hello.offset_msg_id == single.offset_msg_id
    assert (hello.tags, hello.keys, hello.properties["color"]) == ("TagA", ("k1", "k2"), "blue")
    assert got[b"z" * 5000].offset_msg_id == big.offset_msg_id
    assert [m.body for m in tagged] == [b"z" * 5000]


async def test_pull_consumer_offsets_and_long_poll(cluster):
    async with Producer("PG", cluster.namesrv_addr) as producer:
        first = await producer.send(Message("PullTopic", b"0"))
        mq = first.message_queue
        for i in range(1, 3):
            await producer.send(Message("PullTopic", str(i).encode()), queue=mq)
        async with PullConsumer("CG", cluster.namesrv_addr) as consumer:
            assert await consumer.min_offset(mq) == 0
            assert await consumer.max_offset(mq) == 3
            assert await consumer.fetch_consumer_offset(mq) in (-1, 0)
            await consumer.update_consumer_offset(mq, 2)
            assert await consumer.fetch_consumer_offset(mq) == 2
            assert await consumer.search_offset(mq, 0) == 0
            empty = await consumer.pull(mq, "*", 3, 32)
            assert empty.status is PullStatus.NO_NEW_MSG
            waiting = asyncio.create_task(
                consumer.pull_block_if_not_found(mq, "*", 3, 32, suspend_ms=5_000)
            )
            hold = cluster.brokers[0].pull_hold
            await eventually(lambda: hold.held_count == 1)
            assert not waiting.done()
            await producer.send(Message("PullTopic", b"3"), queue=mq)
            result = await asyncio.wait_for(waiting, 5)
    assert [m.body for m in result.messages] == [b"3"]


def topic_queues(consumer: PushConsumer) -> list[object]:
    return [mq for mq in consumer.assigned_queues() if mq.topic == "PushTopic"]


async def test_push_consumers_split_queues_and_commit_offsets(cluster):
    async with Producer("PG", cluster.namesrv_addr) as producer:
        for i in range(20):
            await producer.send(Message("PushTopic", f"m{i}".encode()))
        got: list[bytes] = []
        consumers = []
        for _ in range(2):
            consumer = PushConsumer(
                "CG-push",
                cluster.namesrv_addr,
                consume_from_where=FIRST,
                rebalance_interval_ms=200,
                persist_interval_ms=200,
            )
            consumer.subscribe("PushTopic")
            consumer.register_listener(lambda msgs: got.extend(m.body for m in msgs))
            await consumer.start()
            consumers.append(consumer)
        await eventually(lambda: sorted(len(topic_queues(c)) for c in consumers) == [2, 2])
        await eventually(lambda: len(set(got)) == 20)
        for consumer in consumers:
            await consumer.shutdown()
        # A restarted group member resumes after the committed offsets: old messages not again.
        got.clear()
        late = PushConsumer("CG-push", cluster.namesrv_addr, consume_from_where=FIRST)
        late.subscribe("PushTopic")
        late.register_listener(lambda msgs: got.extend(m.body for m in msgs))
        await late.start()
        await eventually(lambda: len(topic_queues(late)) == 4)
        await producer.send(Message("PushTopic", b"after"))
        await eventually(lambda: b"after" in got)
        await late.shutdown()
    assert got == [b"after"]
    async with Admin(cluster.namesrv_addr) as admin:
        stats = await admin.consume_stats("CG-push", "PushTopic")
    assert stats.offset_table
    assert all(w.consumer_offset == w.broker_offset for w in stats.offset_table.values())


async def test_orderly_consumer_keeps_per_key_order(cluster):
    async with Producer("PG", cluster.namesrv_addr) as producer:
        for i in range(30):
            await producer.send(
                Message("OrderTopic", f"{i % 3}:{i}".encode()), sharding_key=str(i % 3)
            )
    seen: list[str] = []

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        seen.extend(m.body.decode() for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(
        "CG-order", cluster.namesrv_addr, consume_from_where=FIRST, orderly=True
    )
    consumer.subscribe("OrderTopic")
    consumer.register_listener(listener)
    await consumer.start()
    await eventually(lambda: len(seen) == 30)
    await consumer.shutdown()
    for key in "012":
        numbers = [int(s.split(":")[1]) for s in seen if s.startswith(f"{key}:")]
        assert numbers == sorted(numbers)


async def test_blocking_facade_from_a_thread(cluster):
    await asyncio.to_thread(_blocking_flow, cluster.namesrv_addr, cluster.broker_addr)


def _blocking_flow(namesrv_addr: str, broker_addr: str) -> None:
    with BlockingAdmin(namesrv_addr) as admin:
        assert admin.create_topic(
            "Blocking", broker_addr=broker_addr, read_queue_nums=2, write_queue_nums=2
        ) == [broker_addr]
    with BlockingProducer("PG", namesrv_addr) as producer:
        result = producer.send(Message("Blocking", b"sync", keys="bk"))
    with BlockingPullConsumer("CG", namesrv_addr) as consumer:
        queues = consumer.fetch_subscribe_message_queues("Blocking")
        assert len(queues) == 2
        pulled = consumer.pull(result.message_queue, "*", 0, 8)
    assert [m.body for m in pulled.messages] == [b"sync"]
    with BlockingAdmin(namesrv_addr) as admin:
        assert "Blocking" in admin.topic_list()
        assert [m.body for m in admin.query_message_by_key("Blocking", "bk")] == [b"sync"]
        assert admin.view_message(result.offset_msg_id).body == b"sync"
