"""Retries, dead letters and delays end to end: Python clients against local_cluster (issue 4)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
# Level 3 (the first retry) is 300 ms here instead of 10 s.
FAST_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings={"messageDelayLevel": FAST_LEVELS}) as c:
        yield c


async def test_a_listener_that_fails_once_gets_each_message_again(cluster: LocalCluster) -> None:
    async with Producer("PG", cluster.namesrv_addr) as producer:
        for i in range(5):
            await producer.send(Message("RetryTopic", b"m%d" % i, tags="T"))
    seen: list[MessageExt] = []

    def listener(msgs: list[MessageExt]) -> None:
        seen.extend(msgs)
        for m in msgs:
            if m.reconsume_times == 0:
                raise RuntimeError("first attempt fails")

    consumer = PushConsumer("CG-retry", cluster.namesrv_addr, consume_from_where=FIRST)
    consumer.subscribe("RetryTopic")
    consumer.register_listener(listener)
    await consumer.start()
    try:
        await eventually(lambda: sum(m.reconsume_times == 1 for m in seen) == 5)
    finally:
        await consumer.shutdown()
    retried = [m for m in seen if m.reconsume_times == 1]
    assert sorted(m.body for m in retried) == [b"m%d" % i for i in range(5)]
    assert {m.topic for m in retried} == {"RetryTopic"}  # original topic restored for the listener


async def test_exhausted_retries_land_in_the_dlq(cluster: LocalCluster) -> None:
    async with Producer("PG", cluster.namesrv_addr) as producer:
        await producer.send(Message("PoisonTopic", b"poison"))
    attempts: list[int] = []

    def listener(msgs: list[MessageExt]) -> None:
        attempts.extend(m.reconsume_times for m in msgs)
        raise RuntimeError("always fails")

    consumer = PushConsumer(
        "CG-dlq", cluster.namesrv_addr, consume_from_where=FIRST, max_reconsume_times=2
    )
    consumer.subscribe("PoisonTopic")
    consumer.register_listener(listener)
    await consumer.start()
    store = cluster.brokers[0].store
    try:
        await eventually(lambda: store.max_offset("%DLQ%CG-dlq", 0) == 1)
    finally:
        await consumer.shutdown()
    assert attempts[:3] == [0, 1, 2]


async def test_producer_delay_level_is_honoured(cluster: LocalCluster) -> None:
    got: list[tuple[bytes, float]] = []
    consumer = PushConsumer(
        "CG-delay", cluster.namesrv_addr, consume_from_where=FIRST, rebalance_interval_ms=200
    )
    consumer.subscribe("DelayTopic")
    consumer.register_listener(lambda msgs: got.extend((m.body, time.monotonic()) for m in msgs))
    await consumer.start()
    try:
        async with Producer("PG", cluster.namesrv_addr) as producer:
            sent = time.monotonic()
            await producer.send(Message("DelayTopic", b"late", delay_level=5))
            await producer.send(Message("DelayTopic", b"now"))
        await eventually(lambda: len(got) == 2)
    finally:
        await consumer.shutdown()
    assert [body for body, _ in got] == [b"now", b"late"]
    assert got[1][1] - sent >= 0.5
