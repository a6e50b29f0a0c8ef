"""Producer against scripted name server and brokers on loopback sockets."""

from __future__ import annotations

import asyncio
import zlib

import pytest
from client_fakes import FakeCluster, answer, until

from tidemq.client.message import Message, SendStatus
from tidemq.client.producer import Producer
from tidemq.errors import BrokerError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import HeartbeatData, MessageQueue
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import SendMessageRequestHeader


def sends(fake: FakeCluster) -> list[tuple[str, SendMessageRequestHeader, bytes]]:
    return [
        (b.name, SendMessageRequestHeader.from_fields(r.ext_fields), r.body)
        for b in fake.brokers
        for r in b.of_code(RequestCode.SEND_MESSAGE_V2) + b.of_code(RequestCode.SEND_BATCH_MESSAGE)
    ]


async def test_send_sets_header_and_properties(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        result = await producer.send(
            Message(
                "TopicA",
                b"hello",
                tags="TagA",
                keys=["k1", "k2"],
                properties={"p": "v"},
                delay_level=3,
                flag=7,
            )
        )
    [(broker, header, body)] = sends(fake)
    props = pm.decode_properties(header.properties or "")
    assert props["TAGS"] == "TagA"
    assert props["KEYS"] == "k1 k2"
    assert props["DELAY"] == "3"
    assert props["WAIT"] == "true"
    assert props["p"] == "v"
    assert len(props["UNIQ_KEY"]) == 32
    assert (header.producer_group, header.topic, header.default_topic) == ("PG", "TopicA", "TBW102")
    assert (header.flag, header.sys_flag, header.batch) == (7, 0, False)
    assert body == b"hello"
    assert result.status is SendStatus.SEND_OK
    assert result.msg_id == props["UNIQ_KEY"]
    assert result.offset_msg_id.startswith("OFFSET")
    assert result.message_queue == MessageQueue("TopicA", broker, header.queue_id)


async def test_big_body_is_compressed(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr, compress_over_bytes=100) as producer:
        await producer.send(Message("TopicA", b"a" * 100))
        await producer.send(Message("TopicA", b"b" * 99))
    (_, big, big_body), (_, small, small_body) = sorted(sends(fake), key=lambda s: -s[1].sys_flag)
    assert big.sys_flag & pm.SysFlag.COMPRESSED
    assert zlib.decompress(big_body) == b"a" * 100
    assert small.sys_flag == 0
    assert small_body == b"b" * 99


async def test_retry_moves_to_another_broker_and_avoids_the_failed_one(fake: FakeCluster):
    fake.add_topic("TopicA")
    broker_a = fake.brokers[0]
    broker_a.replies[RequestCode.SEND_MESSAGE_V2] = answer(ResponseCode.SYSTEM_BUSY)
    async with Producer("PG", fake.namesrv_addr) as producer:
        results = [await producer.send(Message("TopicA", b"x")) for _ in range(6)]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    # Once broker-a failed it is skipped for 10 minutes: it saw exactly one send.
    assert len(broker_a.of_code(RequestCode.SEND_MESSAGE_V2)) == 1


async def test_non_retriable_error_is_raised_at_once(fake: FakeCluster):
    fake.add_topic("TopicA")
    for broker in fake.brokers:
        broker.replies[RequestCode.SEND_MESSAGE_V2] = answer(ResponseCode.MESSAGE_ILLEGAL)
    async with Producer("PG", fake.namesrv_addr) as producer:
        with pytest.raises(BrokerError) as info:
            await producer.send(Message("TopicA", b"x"))
    assert info.value.response_code == ResponseCode.MESSAGE_ILLEGAL
    assert len(sends(fake)) == 1


async def test_retries_exhausted_raise_last_error(fake: FakeCluster):
    fake.add_topic("TopicA")
    for broker in fake.brokers:
        broker.replies[RequestCode.SEND_MESSAGE_V2] = answer(ResponseCode.SYSTEM_BUSY)
    async with Producer("PG", fake.namesrv_addr, retry_times=2) as producer:
        with pytest.raises(BrokerError):
            await producer.send(Message("TopicA", b"x"))
    assert len(sends(fake)) == 3


async def test_unknown_topic_goes_through_tbw102_with_four_queues(fake: FakeCluster):
    async with Producer("PG", fake.namesrv_addr) as producer:
        for _ in range(12):
            await producer.send(Message("NewTopic", b"x"))
    headers = [h for _, h, _ in sends(fake)]
    assert {h.topic for h in headers} == {"NewTopic"}
    assert {h.queue_id for h in headers} <= {0, 1, 2, 3}
    assert {h.default_topic_queue_nums for h in headers} == {4}
    assert "TBW102" in fake.route_requests


async def test_heartbeat_after_route_and_unregister_at_shutdown(fake: FakeCluster):
    fake.add_topic("TopicA", brokers=fake.brokers[:1])
    broker = fake.brokers[0]
    async with Producer("PG", fake.namesrv_addr) as producer:
        await producer.send(Message("TopicA", b"x"))
        await until(lambda: bool(broker.of_code(RequestCode.HEART_BEAT)))
        client_id = producer.instance.client_id
    beat = HeartbeatData.from_json(broker.of_code(RequestCode.HEART_BEAT)[0].body)
    assert beat.client_id == client_id
    assert [p.group_name for p in beat.producer_data_set] == ["PG"]
    [bye] = broker.of_code(RequestCode.UNREGISTER_CLIENT)
    assert bye.ext_fields["clientID"] == client_id
    assert bye.ext_fields["producerGroup"] == "PG"


async def test_next_name_server_is_tried(fake: FakeCluster):
    fake.add_topic("TopicA")
    dead = "127.0.0.1:1"
    async with Producer("PG", f"{dead};{fake.namesrv_addr}") as producer:
        result = await producer.send(Message("TopicA", b"x"))
    assert result.status is SendStatus.SEND_OK


async def test_send_batch(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        result = await producer.send_batch(
            [Message("TopicA", b"one", tags="A"), Message("TopicA", b"two", keys="k")]
        )
        with pytest.raises(ValueError, match="same topic"):
            await producer.send_batch([Message("TopicA", b"1"), Message("TopicB", b"2")])
        with pytest.raises(ValueError, match="delayed"):
            await producer.send_batch([Message("TopicA", b"1", delay_level=2)])
    [(_, header, body)] = sends(fake)
    assert header.batch is True
    items = pm.decode_batch(body)
    assert [i.body for i in items] == [b"one", b"two"]
    keys = [pm.decode_properties(i.properties)["UNIQ_KEY"] for i in items]
    assert result.msg_id == ",".join(keys)
    assert pm.decode_properties(items[0].properties)["TAGS"] == "A"


async def test_selector_sharding_key_and_concurrent_sends(fake: FakeCluster):
    fake.add_topic("TopicA")
    async with Producer("PG", fake.namesrv_addr) as producer:
        chosen = await producer.send(
            Message("TopicA", b"x"), selector=lambda queues, msg, arg: queues[arg], arg=5
        )
        assert chosen.message_queue == MessageQueue("TopicA", "broker-b", 1)
        first = await producer.send(Message("TopicA", b"x"), sharding_key="order-42")
        again = await producer.send(Message("TopicA", b"x"), sharding_key="order-42")
        assert first.message_queue == again.message_queue
        results = await asyncio.gather(*(producer.send(Message("TopicA", b"p")) for _ in range(50)))
        future = producer.send_nowait(Message("TopicA", b"later"))
        assert (await future).status is SendStatus.SEND_OK
    assert len({r.msg_id for r in results}) == 50


async def test_invalid_messages_are_refused(fake: FakeCluster):
    async with Producer("PG", fake.namesrv_addr, max_message_size=10) as producer:
        with pytest.raises(ValueError, match="empty"):
            await producer.send(Message("TopicA", b""))
        with pytest.raises(Exception, match="max_message_size"):
            await producer.send(Message("TopicA", b"x" * 11))
        with pytest.raises(ValueError, match="system topic"):
            await producer.send(Message("SCHEDULE_TOPIC_XXXX", b"x"))
    assert sends(fake) == []
