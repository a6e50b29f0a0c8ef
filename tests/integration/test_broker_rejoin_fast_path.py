"""A producer under load connects again to a broker whose connection it lost (issue 19 item 4).

The fast path sends only over open connections; a send whose chosen broker has none goes to the
coroutine path, which must connect to *that* broker. Choosing a queue afresh there moved such
sends to connected brokers (the burst's other picks had advanced the round-robin index), so a
restarted broker was neither connected to again nor found failed, and got nothing.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest

from tidemq.client.admin import Admin
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.testing import LocalCluster, local_cluster

pytestmark = pytest.mark.integration

TOPIC: Final = "FastPathRejoinTopic"
QUEUES_PER_BROKER: Final = 4


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, brokers=2) as running:
        async with Admin(running.namesrv_addr) as admin:
            await admin.create_topic(
                TOPIC, read_queue_nums=QUEUES_PER_BROKER, write_queue_nums=QUEUES_PER_BROKER
            )
        yield running


async def test_burst_after_a_lost_connection_still_reaches_that_broker(
    cluster: LocalCluster,
) -> None:
    async with Producer("FastPathPG", cluster.namesrv_addr, topics=[TOPIC]) as producer:
        await asyncio.gather(*(producer.send(Message(TOPIC, b"warm")) for _ in range(8)))
        remoting = producer.instance.remoting
        lost = remoting.connections[cluster.brokers[1].address]
        lost.close()
        await lost.wait_closed()
        # One burst from queue 0: picks 0-3 on broker-a (connected), 4-7 on broker-b (not).
        producer._counters[TOPIC] = 0
        burst = [producer.send_nowait(Message(TOPIC, b"burst")) for _ in range(8)]
        results = await asyncio.gather(*burst)
    brokers = collections.Counter(r.message_queue.broker_name for r in results)
    assert brokers == {"broker-a": 4, "broker-b": 4}
