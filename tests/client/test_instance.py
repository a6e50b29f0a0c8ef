"""ClientInstance: name-server list, client id, server-initiated requests."""

from __future__ import annotations

import pytest
from client_fakes import FakeCluster, QueueBroker, until

from tidemq.client.consumer import PushConsumer
from tidemq.client.instance import ClientInstance, parse_namesrv_addr
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.protocol import message as pm
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.record import encode_record


def test_parse_namesrv_addr():
    assert parse_namesrv_addr("a:1;b:2") == ["a:1", "b:2"]
    assert parse_namesrv_addr(" a:1 , b:2 ;") == ["a:1", "b:2"]
    assert parse_namesrv_addr(["a:1", "b:2;c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError, match="no name server"):
        parse_namesrv_addr(" ; ")


async def test_client_id_shape_and_uniqueness():
    one = ClientInstance("127.0.0.1:9876", client_ip="10.1.2.3", instance_name="x")
    two = ClientInstance("127.0.0.1:9876", client_ip="10.1.2.3")
    three = ClientInstance("127.0.0.1:9876", client_ip="10.1.2.3")
    assert one.client_id.startswith("10.1.2.3@")
    assert one.client_id.endswith("#x")
    assert two.client_id != three.client_id  # two group members in one process


async def broadcast(broker: QueueBroker, cmd_factory) -> None:
    assert broker.server is not None
    for connection in list(broker.server.connections):
        await connection.oneway(cmd_factory())


async def test_notify_consumer_ids_changed_triggers_rebalance():
    fake = FakeCluster([QueueBroker("broker-a")])
    await fake.start()
    fake.add_topic("TopicA", queues=2)
    broker = fake.brokers[0]
    assert isinstance(broker, QueueBroker)
    consumers = [
        PushConsumer("CG", fake.namesrv_addr, rebalance_interval_ms=60_000) for _ in range(2)
    ]
    try:
        for c in consumers:
            c.subscribe("TopicA")
            c.register_listener(lambda msgs: None)
        await consumers[0].start()
        await until(lambda: len(consumers[0].assigned_queues()) == 2)
        await consumers[1].start()
        await until(lambda: len(consumers[1].assigned_queues()) == 1)
        assert len(consumers[0].assigned_queues()) == 2  # no timer round within a minute
        await broadcast(
            broker,
            lambda: RemotingCommand(
                code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": "CG"}
            ),
        )
        await until(lambda: len(consumers[0].assigned_queues()) == 1)
        assert set(consumers[0].assigned_queues()).isdisjoint(consumers[1].assigned_queues())
    finally:
        for c in consumers:
            await c.shutdown()
        await fake.stop()


async def test_check_transaction_state_reaches_the_producer_of_the_group(fake: FakeCluster):
    fake.add_topic("TopicA", brokers=fake.brokers[:1])
    checks: list[tuple[str, str]] = []
    async with Producer("PG", fake.namesrv_addr) as producer:

        async def on_check(broker_addr, header, message):
            checks.append((header.transaction_id, message.body.decode()))

        producer.on_check_transaction_state = on_check  # type: ignore[method-assign]
        await producer.send(Message("TopicA", b"x"))
        half = encode_record(
            topic="TopicA",
            queue_id=0,
            body=b"half",
            flag=0,
            properties=pm.encode_properties({"PGROUP": "PG", "UNIQ_KEY": "U1", "TRAN_MSG": "true"}),
            sys_flag=0,
            born_timestamp=1,
            born_host=("127.0.0.1", 1),
            store_timestamp=2,
            store_host=("127.0.0.1", 10911),
            reconsume_times=0,
            prepared_transaction_offset=0,
            queue_offset=0,
            physical_offset=0,
        )
        await broadcast(
            fake.brokers[0],
            lambda: RemotingCommand(
                code=RequestCode.CHECK_TRANSACTION_STATE,
                body=half,
                ext_fields={
                    "tranStateTableOffset": "0",
                    "commitLogOffset": "0",
                    "msgId": "U1",
                    "transactionId": "U1",
                },
            ),
        )
        await until(lambda: bool(checks))
    assert checks == [("U1", "half")]
