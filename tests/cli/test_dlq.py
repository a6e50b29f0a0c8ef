"""`tidemq dlq list|resend` and `tidemq group reset-offset` against a local cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq import Admin, ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.cli.main import main as cli_main
from tidemq.client import api
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.testing import LocalCluster, eventually, local_cluster

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path) as c:
        yield c


async def cli(cluster: LocalCluster, *argv: str) -> int:
    return await asyncio.to_thread(cli_main, [*argv, "-n", cluster.namesrv_addr])


async def test_dead_letters_are_listed_and_resent_once(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    async with Producer("PG-dlq", cluster.namesrv_addr) as producer:
        originals = [
            await producer.send(
                Message("Orders", b"order-%d" % n, tags="paid", keys=f"k{n}", properties={"a": "1"})
            )
            for n in range(3)
        ]

    def always_fails(msgs: list[MessageExt]) -> None:
        raise RuntimeError("poison")

    # max_reconsume_times=0: the first failure sends the message straight to %DLQ%CG-cli.
    consumer = PushConsumer(
        "CG-cli", cluster.namesrv_addr, consume_from_where=FIRST, max_reconsume_times=0
    )
    consumer.subscribe("Orders")
    consumer.register_listener(always_fails)
    await consumer.start()
    store = cluster.brokers[0].store
    try:
        await eventually(lambda: store.max_offset(pm.dlq_topic("CG-cli"), 0) == 3)
    finally:
        await consumer.shutdown()
    capsys.readouterr()

    assert await cli(cluster, "dlq", "list", "-g", "CG-cli") == 0
    listed = capsys.readouterr().out
    assert listed.count("Orders") == 3
    assert "order-0" in listed
    assert " no " in listed
    assert " yes " not in listed

    assert await cli(cluster, "dlq", "resend", "-g", "CG-cli", "--count", "2") == 0
    assert "2 dead letter(s) resent" in capsys.readouterr().out
    assert await cli(cluster, "dlq", "resend", "-g", "CG-cli") == 0
    assert "1 dead letter(s) resent" in capsys.readouterr().out
    assert await cli(cluster, "dlq", "resend", "-g", "CG-cli") == 0
    assert "0 dead letter(s) resent" in capsys.readouterr().out
    assert await cli(cluster, "dlq", "list", "-g", "CG-cli") == 0
    assert " no " not in capsys.readouterr().out

    got: list[MessageExt] = []
    reader = PushConsumer("CG-after", cluster.namesrv_addr, consume_from_where=FIRST)
    reader.subscribe("Orders")
    reader.register_listener(got.extend)
    await reader.start()
    try:
        await eventually(lambda: len(got) == 6)
    finally:
        await reader.shutdown()
    resent = sorted((m for m in got if pm.ORIGIN_MESSAGE_ID in m.properties), key=lambda m: m.body)
    assert [m.body for m in resent] == [b"order-0", b"order-1", b"order-2"]
    assert [m.msg_id for m in resent] == [r.msg_id for r in originals]  # same UNIQ_KEY
    for m in resent:
        assert (m.topic, m.tags, m.properties["a"], m.reconsume_times) == ("Orders", "paid", "1", 0)
        assert pm.RETRY_TOPIC not in m.properties
    assert sorted(m.keys for m in resent) == [("k0",), ("k1",), ("k2",)]


async def test_a_group_without_dead_letters(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await cli(cluster, "dlq", "list", "-g", "CG-none") == 0
    assert "no dead letters for group CG-none" in capsys.readouterr().out
    assert await cli(cluster, "dlq", "resend", "-g", "CG-none") == 0
    assert "0 dead letter(s) resent" in capsys.readouterr().out


async def test_reset_offset_to_earliest_latest_and_time(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Ledger", read_queue_nums=1, write_queue_nums=1)
        async with Producer("PG-reset", cluster.namesrv_addr) as producer:
            for n in range(5):
                await producer.send(Message("Ledger", b"before-%d" % n))
            # SEARCH_OFFSET answers the nearest message: keep the first batch 50 ms away.
            since = now_ms() + 50
            await eventually(lambda: now_ms() >= since)
            for n in range(5):
                await producer.send(Message("Ledger", b"after-%d" % n))
        await admin.topic_route("Ledger")  # so the test's own instance knows the broker
        queue = MessageQueue(
            topic="Ledger", broker_name=cluster.brokers[0].config.broker_name, queue_id=0
        )

        async def offset() -> int:
            return await api.query_consumer_offset(admin.instance, "CG-reset", queue)

        group = ("group", "reset-offset", "-g", "CG-reset", "-t", "Ledger")
        assert await cli(cluster, *group, "--to-latest") == 0
        assert await offset() == 10
        assert await cli(cluster, *group, "--to-earliest") == 0
        assert await offset() == 0
        assert await cli(cluster, *group, "--to-time", str(since)) == 0
        assert await offset() == 5
        assert "NEW" in capsys.readouterr().out

        live = PushConsumer("CG-reset", cluster.namesrv_addr)
        live.subscribe("Ledger")
        live.register_listener(lambda msgs: None)
        await live.start()
        try:
            assert await cli(cluster, *group, "--to-latest") == 1
            assert "consumers online" in capsys.readouterr().err
            assert await offset() == 5
            assert await cli(cluster, *group, "--to-earliest", "--force") == 0
        finally:
            await live.shutdown()
