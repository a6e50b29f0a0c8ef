"""Producers are known to brokers from their start, and again right after a broker restarts
(issue 11 item 6, client side): check-backs need a producer of the group in the broker's client
table, and a TransactionProducer that has started but not sent used to be in none."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest

from tidemq.client.admin import Admin
from tidemq.client.message import Message, MessageExt
from tidemq.client.producer import Producer
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

TOPIC: Final = "HeartbeatAtStartTopic"
GROUP: Final = "HeartbeatAtStartPG"
# A restarted broker must know the producer again within the re-heartbeat's backoff cap (1 s)
# plus scheduling, well before the regular 30 s heartbeat.
KNOWN_AGAIN_WITHIN_S: Final = 3.0


class _Listener:
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _knows(cluster: LocalCluster, index: int, group: str = GROUP) -> bool:
    return group in cluster.brokers[index].clients.producer_groups()


async def _topic_on_first_broker(cluster: LocalCluster) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=cluster.brokers[0].address)


async def test_transaction_producer_is_known_to_every_master_once_started(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, brokers=2) as cluster:
        await _topic_on_first_broker(cluster)
        producer = TransactionProducer(GROUP, cluster.namesrv_addr, listener=_Listener())
        async with producer:
            # No send, no declared topic: still in both brokers' client tables (cluster info).
            assert _knows(cluster, 0)
            assert _knows(cluster, 1)


async def test_producer_is_known_to_its_topics_brokers_once_started(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, brokers=2) as cluster:
        await _topic_on_first_broker(cluster)
        async with Producer(GROUP, cluster.namesrv_addr, topics=[TOPIC]) as producer:
            assert _knows(cluster, 0)
            assert not _knows(cluster, 1)  # a plain producer tells the brokers of its topics
            assert producer.instance.routes.get(TOPIC) is not None  # no lookup at first send


async def test_restarted_broker_knows_the_producer_again_without_a_send(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, brokers=1) as cluster:
        await _topic_on_first_broker(cluster)
        producer = TransactionProducer(
            GROUP, cluster.namesrv_addr, listener=_Listener(), topics=[TOPIC]
        )
        async with producer:
            assert _knows(cluster, 0)
            for _ in range(2):  # the new connection is watched as well
                await cluster.restart_broker(0)  # a new BrokerApp: an empty client table
                await eventually(lambda: _knows(cluster, 0), KNOWN_AGAIN_WITHIN_S)
