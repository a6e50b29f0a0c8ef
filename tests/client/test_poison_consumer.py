"""Issue 11 item 1, client side, against a real in-process broker: a stored message flagged
COMPRESSED whose body is not zlib data sits between good ones; every consumer gets every good
message, counts the bad one, and commits past it.

The broker is meant to refuse such a send, so the record goes into the broker's store directly
(in-process, on the event-loop thread the broker's own appends run on), as a message written
before that check existed, or by a peer that does not make it, would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq.cli.main import main as cli_main
from tidemq.client.admin import Admin
from tidemq.client.consumer import PushConsumer
from tidemq.client.message import ConsumeFromWhere, Message, MessageExt, MessageQueue
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.protocol import message as pm
from tidemq.store.types import MessageToStore, PutStatus
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

TOPIC = "PoisonTopic"
MQ = MessageQueue(TOPIC, "broker-a", 0)
GOOD_BEFORE, GOOD_AFTER = 5, 5
POISON_OFFSET = GOOD_BEFORE
END_OFFSET = GOOD_BEFORE + 1 + GOOD_AFTER


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path) as running:
        yield running


def put_poison(cluster: LocalCluster) -> None:
    broker = cluster.brokers[0]
    result = broker.store.put_message(
        MessageToStore(
            topic=TOPIC,
            queue_id=0,
            body=b"this is not zlib data",
            flag=0,
            properties=pm.encode_properties({pm.UNIQ_KEY: "POISON", pm.TAGS: "T"}),
            sys_flag=pm.SysFlag.COMPRESSED,
            born_timestamp=1,
            born_host=("127.0.0.1", 1),
            store_host=("127.0.0.1", broker.port),
        )
    )
    assert result.status is PutStatus.PUT_OK
    assert result.queue_offset == POISON_OFFSET


@pytest.fixture
async def poisoned(cluster: LocalCluster) -> LocalCluster:
    """One queue: good 0..4, the poison at 5, good 6..10."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(
            TOPIC, broker_addr=cluster.broker_addr, read_queue_nums=1, write_queue_nums=1
        )
    async with Producer("PoisonProducer", cluster.namesrv_addr) as producer:
        for i in range(GOOD_BEFORE):
            await producer.send(Message(TOPIC, f"good-{i}".encode(), tags="T"), queue=MQ)
        put_poison(cluster)
        for i in range(GOOD_BEFORE, GOOD_BEFORE + GOOD_AFTER):
            await producer.send(Message(TOPIC, f"good-{i}".encode(), tags="T"), queue=MQ)
    return cluster


GOOD_BODIES = sorted(f"good-{i}".encode() for i in range(GOOD_BEFORE + GOOD_AFTER))


async def stored_offset(cluster: LocalCluster, group: str) -> int:
    """The offset the broker holds for `group` (asked after that group's consumer stopped)."""
    async with PullConsumer(group, cluster.namesrv_addr) as probe:
        return await probe.fetch_consumer_offset(MQ)


async def test_push_consumer_delivers_every_good_message_and_counts_the_poison(poisoned):
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "PoisonPush",
        poisoned.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_interval_ms=100,
    )
    consumer.subscribe(TOPIC, "*")
    consumer.register_listener(got.extend)
    await consumer.start()
    try:
        await eventually(lambda: len(got) == len(GOOD_BODIES), timeout_s=20)
        await eventually(lambda: consumer.committed_offsets().get(MQ) == END_OFFSET, timeout_s=10)
    finally:
        await consumer.shutdown()
    assert sorted(m.body for m in got) == GOOD_BODIES
    assert consumer.undecodable_count == 1
    assert await stored_offset(poisoned, "PoisonPush") == END_OFFSET


async def test_pull_consumer_lists_the_poison_and_moves_past_it(poisoned):
    async with PullConsumer("PoisonPull", poisoned.namesrv_addr) as consumer:
        result = await consumer.pull(MQ, "*", 0, 32)
        assert sorted(m.body for m in result.messages) == GOOD_BODIES
        assert [u.queue_offset for u in result.undecodable] == [POISON_OFFSET]
        assert result.next_begin_offset == END_OFFSET
        # Even one message at a time, the pull at the poison's offset moves on.
        single = await consumer.pull(MQ, "*", POISON_OFFSET, 1)
        assert single.messages == []
        assert [u.queue_offset for u in single.undecodable] == [POISON_OFFSET]
        assert single.next_begin_offset == POISON_OFFSET + 1
        assert consumer.undecodable_count == 2


async def test_cli_consume_prints_every_good_message_and_commits_past_the_poison(poisoned, capsys):
    argv = [
        "consume",
        "-n",
        poisoned.namesrv_addr,
        "--topic",
        TOPIC,
        "--group",
        "PoisonCli",
        "--from-beginning",
        "--wait-seconds",
        "0.5",
    ]
    # The CLI blocks; the broker runs on this loop, so the CLI runs in a thread.
    code = await asyncio.to_thread(cli_main, argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(line.rsplit(" ", 1)[1].encode() for line in out.splitlines()) == GOOD_BODIES
    assert f"@{POISON_OFFSET}]: body is not zlib data" in err
    assert "10 message(s), 1 undecodable skipped" in err
    assert await stored_offset(poisoned, "PoisonCli") == END_OFFSET
