"""PushConsumer against a scripted broker on loopback sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from client_fakes import FakeCluster, QueueBroker, until

from tidemq.client import consume_concurrently as concurrent_module
from tidemq.client.consumer import PushConsumer
from tidemq.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageModel,
)
from tidemq.client.offset_store import LocalOffsetFile
from tidemq.protocol.codes import RequestCode

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture
async def qfake() -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster([QueueBroker("broker-a")])
    await cluster.start()
    cluster.add_topic("TopicA", queues=2)
    try:
        yield cluster
    finally:
        await cluster.stop()


def broker(fake: FakeCluster) -> QueueBroker:
    b = fake.brokers[0]
    assert isinstance(b, QueueBroker)
    return b


def consumer(fake: FakeCluster, **options: Any) -> PushConsumer:
    options = {
        "consume_from_where": FIRST,
        "rebalance_interval_ms": 100,
        "persist_interval_ms": 100,
        **options,
    }
    c = PushConsumer("CG", fake.namesrv_addr, **options)
    c.subscribe("TopicA", "*")
    return c


async def test_consumes_every_queue_and_commits_offsets(qfake: FakeCluster):
    b = broker(qfake)
    for i in range(10):
        b.put("TopicA", i % 2, f"m{i}".encode(), {"TAGS": "TagA"})
    got: list[MessageExt] = []
    c = consumer(qfake)
    c.register_listener(got.extend)
    await c.start()
    await until(lambda: len(got) == 10)
    await c.shutdown()
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(10))
    assert b.offsets[("CG", "TopicA", 0)] == 5
    assert b.offsets[("CG", "TopicA", 1)] == 5
    pulls = b.of_code(RequestCode.PULL_MESSAGE)
    assert {p.ext_fields["sysFlag"] for p in pulls} <= {"6", "7"}
    assert {p.ext_fields["suspendTimeoutMillis"] for p in pulls} == {"15000"}
    assert b.of_code(RequestCode.UNREGISTER_CLIENT)


async def test_last_offset_starts_at_the_end(qfake: FakeCluster):
    b = broker(qfake)
    b.put("TopicA", 0, b"old")
    got: list[MessageExt] = []
    c = consumer(qfake, consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    c.register_listener(got.extend)
    await c.start()
    await until(lambda: len(c.assigned_queues()) == 2)
    b.put("TopicA", 0, b"new")
    await until(lambda: len(got) == 1)
    await c.shutdown()
    assert got[0].body == b"new"


async def test_failed_message_is_sent_back_and_offset_moves_on(qfake: FakeCluster):
    b = broker(qfake)
    b.put("TopicA", 0, b"bad")
    b.put("TopicA", 0, b"good")
    seen: list[bytes] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        seen.extend(m.body for m in msgs)
        if msgs[0].body == b"bad":
            raise RuntimeError("boom")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = consumer(qfake)
    c.register_listener(listener)
    await c.start()
    await until(lambda: len(b.of_code(RequestCode.CONSUMER_SEND_MSG_BACK)) == 1 and len(seen) == 2)
    await until(lambda: c.committed_offsets().get(c.assigned_queues()[0]) == 2)
    await c.shutdown()
    [back] = b.of_code(RequestCode.CONSUMER_SEND_MSG_BACK)
    assert back.ext_fields["delayLevel"] == "0"
    assert back.ext_fields["group"] == "CG"
    assert back.ext_fields["offset"] == "0"  # commit-log offset of the failed record


async def test_failed_send_back_retries_locally_and_holds_the_offset(qfake, monkeypatch):
    monkeypatch.setattr(concurrent_module, "LOCAL_RETRY_DELAY_MS", 50)
    b = broker(qfake)
    b.fail_send_back = True
    b.put("TopicA", 0, b"flaky")
    b.put("TopicA", 0, b"fine")
    attempts: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        if msgs[0].body == b"flaky":
            attempts.append(msgs[0].reconsume_times)
            if len(attempts) < 3:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = consumer(qfake)
    c.register_listener(listener)
    await c.start()
    await until(lambda: len(c.assigned_queues()) == 2)
    mq0 = c.assigned_queues()[0]
    await until(lambda: len(attempts) >= 2)
    assert c.committed_offsets()[mq0] == 0  # the flaky message holds the offset back
    await until(lambda: len(attempts) == 3 and c.committed_offsets()[mq0] == 2)
    await c.shutdown()
    assert attempts == [0, 1, 2]


async def test_two_consumers_split_the_queues(qfake: FakeCluster):
    b = broker(qfake)
    one, two = consumer(qfake), consumer(qfake)
    for c in (one, two):
        c.register_listener(lambda msgs: None)
        await c.start()
    await until(lambda: len(one.assigned_queues()) == 1 and len(two.assigned_queues()) == 1)
    assert set(one.assigned_queues()) | set(two.assigned_queues()) == {
        *one.assigned_queues(),
        *two.assigned_queues(),
    }
    assert one.assigned_queues() != two.assigned_queues()
    await one.shutdown()
    await two.shutdown()
    assert len(b.client_ids) == 2


async def test_orderly_locks_consumes_in_order_and_retries_in_place(qfake: FakeCluster):
    b = broker(qfake)
    for i in range(5):
        b.put("TopicA", 0, str(i).encode())
    order: list[bytes] = []
    failures = {b"2": 2}

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        body = msgs[0].body
        order.append(body)
        if failures.get(body, 0) > 0:
            failures[body] -= 1
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = consumer(qfake, orderly=True, suspend_current_queue_ms=20)
    c.register_listener(listener)
    await c.start()
    await until(lambda: len(order) == 7)
    await c.shutdown()
    assert order == [b"0", b"1", b"2", b"2", b"2", b"3", b"4"]
    assert b.of_code(RequestCode.LOCK_BATCH_MQ)
    assert b.of_code(RequestCode.UNLOCK_BATCH_MQ)
    assert b.offsets[("CG", "TopicA", 0)] == 5


async def test_broadcasting_keeps_offsets_in_a_local_file(qfake: FakeCluster, tmp_path):
    b = broker(qfake)
    b.put("TopicA", 1, b"x")
    got: list[MessageExt] = []
    c = consumer(qfake, message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path)
    c.register_listener(got.extend)
    await c.start()
    await until(lambda: len(got) == 1)
    await c.shutdown()
    assert not b.of_code(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    assert not b.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)
    stored = LocalOffsetFile.for_group(tmp_path, "DEFAULT", "CG").load()
    assert {mq.queue_id: o for mq, o in stored.items()} == {0: 0, 1: 1}


async def test_tag_expression_is_sent_and_applied(qfake: FakeCluster):
    b = broker(qfake)
    b.put("TopicA", 0, b"a", {"TAGS": "TagA"})
    b.put("TopicA", 0, b"b", {"TAGS": "TagB"})
    got: list[MessageExt] = []
    c = PushConsumer("CG", qfake.namesrv_addr, consume_from_where=FIRST)
    c.subscribe("TopicA", "TagB || TagC")
    c.register_listener(got.extend)
    await c.start()
    await until(lambda: len(got) == 1)
    await c.shutdown()
    assert got[0].body == b"b"
    pull = b.of_code(RequestCode.PULL_MESSAGE)[0]
    assert pull.ext_fields["subscription"] == "TagB || TagC"


async def test_shutdown_lets_running_listener_finish_and_commits_it(qfake: FakeCluster):
    b = broker(qfake)
    b.put("TopicA", 0, b"slow")
    started, release = asyncio.Event(), asyncio.Event()

    async def listener(msgs: list[MessageExt]) -> None:
        started.set()
        await release.wait()

    c = consumer(qfake, persist_interval_ms=60_000)
    c.register_listener(listener)
    await c.start()
    await asyncio.wait_for(started.wait(), 5)
    closing = asyncio.create_task(c.shutdown())
    await asyncio.sleep(0.05)
    assert not closing.done()
    release.set()
    await asyncio.wait_for(closing, 5)
    assert b.offsets[("CG", "TopicA", 0)] == 1
