"""Producer.send_nowait's fast path (no task, no timer per send) against scripted brokers: it
agrees with the coroutine path, and its failures retry, time out and avoid brokers as that path
does."""

from __future__ import annotations

import asyncio
import collections

import pytest
from client_fakes import FakeCluster, answer, until

from tidemq.client.message import Message, SendResult, SendStatus
from tidemq.client.producer import Producer
from tidemq.errors import BrokerError, RequestTimeoutError
from tidemq.protocol import message as pm
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import SendMessageRequestHeader

SEND = RequestCode.SEND_MESSAGE_V2


async def connected(producer: Producer, fake: FakeCluster, topic: str = "TopicA") -> None:
    """Send until the producer has a connection to every broker (the fast path's condition)."""
    addrs = {b.addr for b in fake.brokers}
    while not addrs <= set(producer.instance.remoting.connections):
        await producer.send(Message(topic, b"warm-up"))


def headers(fake: FakeCluster) -> list[SendMessageRequestHeader]:
    return [
        SendMessageRequestHeader.from_fields(r.ext_fields)
        for b in fake.brokers
        for r in b.of_code(SEND)
    ]


async def test_window_of_send_nowait_needs_no_task_per_send(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        await connected(producer, fake)
        tasks_before = len(asyncio.all_tasks())
        in_flight: collections.deque[asyncio.Future[SendResult]] = collections.deque()
        results: list[SendResult] = []
        most_tasks = 0
        for n in range(200):
            if len(in_flight) >= 32:
                results.append(await in_flight.popleft())
            in_flight.append(producer.send_nowait(Message("TopicA", b"m%d" % n, tags="T")))
            most_tasks = max(most_tasks, len(asyncio.all_tasks()))
        results += [await future for future in in_flight]
    assert most_tasks == tasks_before
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert len({r.msg_id for r in results}) == 200
    assert {r.message_queue.broker_name for r in results} == {"broker-a", "broker-b"}
    for result in results:
        assert result.message_queue.queue_id in range(4)


async def test_fast_and_coroutine_paths_send_the_same_request(fake: FakeCluster):
    fake.add_topic("TopicA", brokers=fake.brokers[:1])
    async with Producer("PG", fake.namesrv_addr) as producer:
        message = Message("TopicA", b"same", tags="T", keys="k", properties={"p": "v"}, flag=5)
        first = await producer.send(message)  # route lookup and connect: the coroutine path
        tasks_before = len(asyncio.all_tasks())
        future = producer.send_nowait(message)
        assert len(asyncio.all_tasks()) == tasks_before  # the fast path
        second = await future
    slow, fast = headers(fake)
    slow_props, fast_props = (pm.decode_properties(h.properties or "") for h in (slow, fast))
    assert slow_props.pop(pm.UNIQ_KEY) == first.msg_id
    assert fast_props.pop(pm.UNIQ_KEY) == second.msg_id
    assert slow_props == fast_props == {"p": "v", "WAIT": "true", "TAGS": "T", "KEYS": "k"}
    unstable = {"born_timestamp", "queue_id", "properties"}
    assert {k: v for k, v in vars_of(slow).items() if k not in unstable} == {
        k: v for k, v in vars_of(fast).items() if k not in unstable
    }
    [request_a, request_b] = fake.brokers[0].of_code(SEND)
    assert list(request_a.ext_fields) == list(request_b.ext_fields)


def vars_of(header: SendMessageRequestHeader) -> dict[str, object]:
    return {name: getattr(header, name) for name in header.__slots__}


async def test_failed_first_attempt_retries_on_another_broker_and_avoids_it(fake: FakeCluster):
    fake.add_topic("TopicA")
    broker_a = fake.brokers[0]
    async with Producer("PG", fake.namesrv_addr) as producer:
        await connected(producer, fake)
        warm = len(broker_a.of_code(SEND))
        broker_a.replies[SEND] = answer(ResponseCode.SYSTEM_BUSY)
        results = [await producer.send_nowait(Message("TopicA", b"x")) for _ in range(6)]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    # One failed attempt on broker-a, then it is skipped for 10 minutes.
    assert len(broker_a.of_code(SEND)) == warm + 1


async def test_non_retriable_answer_fails_the_future_at_once(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        await connected(producer, fake)
        sent = len(headers(fake))
        for broker in fake.brokers:
            broker.replies[SEND] = answer(ResponseCode.MESSAGE_ILLEGAL)
        with pytest.raises(BrokerError) as info:
            await producer.send_nowait(Message("TopicA", b"x"))
    assert info.value.response_code == ResponseCode.MESSAGE_ILLEGAL
    assert len(headers(fake)) == sent + 1


async def test_stalled_broker_times_out_within_the_send_budget(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr, send_timeout_ms=150) as producer:
        await connected(producer, fake)
        sent = len(headers(fake))
        for broker in fake.brokers:
            broker.stalled.add(SEND)
        with pytest.raises(RequestTimeoutError):
            await producer.send_nowait(Message("TopicA", b"x"))
        # The first attempt had the whole budget, so there was no time for a retry; the
        # connection no longer holds the abandoned request.
        assert len(headers(fake)) == sent + 1
        for connection in producer.instance.remoting.connections.values():
            assert not connection._pending


async def test_connection_lost_mid_send_is_retried_elsewhere(fake: FakeCluster):
    fake.add_topic("TopicA")
    broker_a = fake.brokers[0]
    async with Producer("PG", fake.namesrv_addr) as producer:
        await connected(producer, fake)
        broker_a.stalled.add(SEND)
        before = len(broker_a.of_code(SEND))
        # Eight consecutive queues of eight: four of them on broker-a, which holds them.
        futures = [producer.send_nowait(Message("TopicA", b"x")) for _ in range(8)]
        await until(lambda: len(broker_a.of_code(SEND)) == before + 4)
        producer.instance.remoting.connections[broker_a.addr].abort()
        results = [await future for future in futures]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}


async def test_shutdown_waits_for_sends_in_flight(fake: FakeCluster):
    fake.add_topic("TopicA")
    producer = Producer("PG", fake.namesrv_addr)
    await producer.start()
    await connected(producer, fake)
    futures = [producer.send_nowait(Message("TopicA", b"x")) for _ in range(20)]
    futures.append(producer.send_nowait(Message("NewTopic", b"slow path")))
    await producer.shutdown()
    assert all(future.done() for future in futures)
    assert {future.result().status for future in futures} == {SendStatus.SEND_OK}


async def test_invalid_message_fails_the_future_not_the_call(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        future = producer.send_nowait(Message("TopicA", b""))
        with pytest.raises(ValueError, match="empty"):
            await future
        failing = producer.send_nowait(
            Message("TopicA", b"x"), selector=lambda queues, message, arg: queues[arg], arg=99
        )
        with pytest.raises(IndexError):
            await failing
