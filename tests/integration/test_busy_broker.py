"""A busy broker answers SYSTEM_BUSY and our producer retries elsewhere, as upstream's does
(issue 15 item 4).

broker-a runs with waitTimeMillsInSendQueue=0: every send that has to wait in its connection's
backlog at all (a read carries more than one turn's worth of pipelined sends) is answered
SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]broker busy, ...", deterministically, where the default 200 ms
takes a loop that far behind. Upstream's producer retries SYSTEM_BUSY at once on another broker
(DefaultMQProducer.retryResponseCodes, RocketMQ 5); so does ours: every send of the burst is
acknowledged, the refused ones by broker-b, and nothing is stored twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest

from tidemq.client.admin import Admin
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.testing import LocalCluster, local_cluster

pytestmark = pytest.mark.integration

TOPIC: Final = "BusyTopic"
QUEUES: Final = 4
BURST: Final = 200


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, brokers=2) as running:
        await running.restart_broker(0, waitTimeMillsInSendQueue="0")
        async with Admin(running.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        yield running


def stored(cluster: LocalCluster, index: int) -> int:
    store = cluster.brokers[index].store
    return sum(store.max_offset(TOPIC, queue) for queue in range(QUEUES))


async def test_a_burst_refused_as_busy_is_retried_on_the_other_broker(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tidemq.client.producer")
    async with Producer("BusyPG", cluster.namesrv_addr, topics=[TOPIC]) as producer:
        await asyncio.gather(*(producer.send(Message(TOPIC, b"warm")) for _ in range(8)))
        burst = [producer.send_nowait(Message(TOPIC, b"burst-%d" % i)) for i in range(BURST)]
        results = await asyncio.gather(*burst)
    busy = [
        r
        for r in caplog.records
        if r.name == "tidemq.client.producer" and "[TIMEOUT_CLEAN_QUEUE]" in r.getMessage()
    ]
    assert busy, "broker-a refused nothing: the burst never waited in its backlog"
    assert all("broker-a" in r.getMessage() for r in busy)
    on_a = sum(r.message_queue.broker_name == "broker-a" for r in results)
    assert on_a < BURST // 2  # its share, less what it refused
    # Every send acknowledged once and stored once: the refused ones were never stored.
    assert len(results) == BURST
    assert stored(cluster, 0) + stored(cluster, 1) == BURST + 8
