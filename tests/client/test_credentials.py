"""Clients made with `credentials` sign every request they send (heartbeats, sends on the
producer's pipelined fast path, a transaction's oneway END_TRANSACTION, pulls, offset commits),
as the scripted brokers see them on the wire; clients without credentials sign nothing."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

import pytest
from client_fakes import FakeCluster, QueueBroker, until
from test_send_fast_path import connected

import tidemq
import tidemq.client
from tidemq.client.consumer import PushConsumer
from tidemq.client.message import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    SendStatus,
)
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.message_id import offset_msg_id
from tidemq.security.signing import ACCESS_KEY, SIGNATURE, Credentials, signature_matches

ACCOUNT = Credentials("AK-client", "secret-client")
SEND = RequestCode.SEND_MESSAGE_V2


def assert_signed(requests: list[RemotingCommand]) -> None:
    assert requests
    for request in requests:
        assert request.ext_fields[ACCESS_KEY] == "AK-client", request
        assert signature_matches("secret-client", request.ext_fields, request.body), request
        assert not signature_matches("wrong-secret", request.ext_fields, request.body)


def test_credentials_are_public_names() -> None:
    assert tidemq.Credentials is tidemq.client.Credentials is Credentials
    assert "secret-client" not in repr(ACCOUNT)
    with pytest.raises(ValueError, match="both"):
        Credentials("AK", "")


async def test_a_producer_signs_its_pipelined_sends_and_heartbeats(fake: FakeCluster) -> None:
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr, credentials=ACCOUNT) as producer:
        await connected(producer, fake)
        tasks_before = len(asyncio.all_tasks())
        in_flight: collections.deque[asyncio.Future[SendResult]] = collections.deque()
        results: list[SendResult] = []
        most_tasks = 0
        for n in range(100):
            if len(in_flight) >= 16:
                results.append(await in_flight.popleft())
            in_flight.append(producer.send_nowait(Message("TopicA", b"m%d" % n, keys=f"k{n}")))
            most_tasks = max(most_tasks, len(asyncio.all_tasks()))
        results += [await future for future in in_flight]
    assert most_tasks == tasks_before  # no task per send: the fast path (start_request) sent them
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    sends = [r for b in fake.brokers for r in b.of_code(SEND)]
    assert len(sends) >= 100
    assert_signed(sends)
    assert_signed([r for b in fake.brokers for r in b.requests])  # heartbeats, unregister too


async def test_a_producer_without_credentials_signs_nothing(fake: FakeCluster) -> None:
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        await producer.send(Message("TopicA", b"plain"))
    requests = [r for b in fake.brokers for r in b.requests]
    assert requests
    for request in requests:
        assert ACCESS_KEY not in request.ext_fields
        assert SIGNATURE not in request.ext_fields


class _Commit:
    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE


async def test_a_transaction_producer_signs_its_half_and_its_oneway_end(
    fake: FakeCluster,
) -> None:
    fake.add_topic("TopicA", brokers=fake.brokers[:1])
    broker = fake.brokers[0]

    def stored(request: RemotingCommand) -> RemotingCommand:
        # END_TRANSACTION names the half by its offsetMsgId: a real one, as a broker answers.
        msg_id = offset_msg_id("127.0.0.1", broker.port, 4096)
        return request.response(
            ResponseCode.SUCCESS, {"msgId": msg_id, "queueId": "0", "queueOffset": "0"}
        )

    broker.replies[SEND] = stored
    producer = TransactionProducer(
        "PG_TX", fake.namesrv_addr, listener=_Commit(), credentials=ACCOUNT
    )
    async with producer:
        result = await producer.send_message_in_transaction(Message("TopicA", b"tx"))
        assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

        def ends() -> list[RemotingCommand]:
            return [r for b in fake.brokers for r in b.of_code(RequestCode.END_TRANSACTION)]

        await until(lambda: len(ends()) == 1)
    (end,) = ends()
    assert end.is_oneway
    assert_signed([end])
    assert_signed([r for b in fake.brokers for r in b.of_code(SEND)])


@pytest.fixture
async def qfake() -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster([QueueBroker("broker-a")])
    await cluster.start()
    cluster.add_topic("TopicA", queues=2)
    try:
        yield cluster
    finally:
        await cluster.stop()


async def test_consumers_sign_pulls_heartbeats_and_offset_commits(qfake: FakeCluster) -> None:
    broker = qfake.brokers[0]
    assert isinstance(broker, QueueBroker)
    for i in range(6):
        broker.put("TopicA", i % 2, b"m%d" % i)
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "CG",
        qfake.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=100,
        persist_interval_ms=100,
        credentials=ACCOUNT,
    )
    consumer.subscribe("TopicA", "*")
    consumer.register_listener(got.extend)
    await consumer.start()
    try:
        await until(lambda: len(got) == 6)
        await until(lambda: broker.offsets.get(("CG", "TopicA", 0)) == 3)
    finally:
        await consumer.shutdown()
    assert_signed(broker.of_code(RequestCode.PULL_MESSAGE))
    assert_signed(broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET))
    assert_signed(broker.requests)
    seen = len(broker.requests)

    async with PullConsumer("CG-pull", qfake.namesrv_addr, credentials=ACCOUNT) as puller:
        queue = MessageQueue("TopicA", "broker-a", 0)
        pulled = await puller.pull(queue, "*", 0, 32)
        assert [m.body for m in pulled.messages] == [b"m0", b"m2", b"m4"]
        await puller.update_consumer_offset(queue, 3)
    assert_signed(broker.requests[seen:])
