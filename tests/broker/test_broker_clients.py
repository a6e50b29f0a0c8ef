"""Heartbeats, consumer lists, id-change notifications, unregister, expiry and queue locks."""

from __future__ import annotations

from typing import Any

from broker_harness import Harness, eventually, messages

from tidemq.broker.clients import (
    QUEUE_LOCKS_MAX,
    ClientChannel,
    ClientRegistry,
    QueueLockTable,
)
from tidemq.clock import FakeClock
from tidemq.protocol.bodies import (
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    SubscriptionData,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerListByGroupRequestHeader,
    UnregisterClientRequestHeader,
)
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.handlers import HandlerTable

# As observed from the C++ 1.2.3 client (remoting.md §4.4): ints for enums, subVersion as a
# string, codeSet = atoi(tag) zeros, trailing newline.
CPP_HEARTBEAT = (
    b'{"clientID":"23736-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
    b'"consumeType":1,"groupName":"CG_TEST","messageModel":1,"subscriptionDataSet":['
    b'{"subString":"*","subVersion":"1795215785519","topic":"%RETRY%CG_TEST"},'
    b'{"codeSet":[0,0],"subString":"TagA || TagB","subVersion":"1795215785519",'
    b'"tagsSet":["TagA","TagB"],"topic":"TopicA"}]}],"producerDataSet":[{"groupName":"PG_TEST"}]}\n'
)


def _heartbeat(client_id: str, group: str = "CG_TEST") -> bytes:
    return CPP_HEARTBEAT.replace(b"23736-127.0.0.1@DEFAULT", client_id.encode()).replace(
        b"CG_TEST", group.encode()
    )


async def _consumer_list(broker: Harness, group: str) -> RemotingCommand:
    fields = GetConsumerListByGroupRequestHeader(consumer_group=group).to_fields()
    return await broker.call(
        RemotingCommand(code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields=fields)
    )


async def test_cpp_heartbeat_registers_and_creates_the_retry_topic(broker: Harness) -> None:
    response = await broker.call(
        RemotingCommand(code=RequestCode.HEART_BEAT, body=CPP_HEARTBEAT, language="CPP")
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    retry = broker.app.topics.get("%RETRY%CG_TEST")
    assert retry is not None
    assert retry.write_queue_nums == 1
    listed = await _consumer_list(broker, "CG_TEST")
    assert b"23736-127.0.0.1@DEFAULT" in listed.body
    assert broker.app.clients.producer_groups() == ["PG_TEST"]
    # A pull without the SUBSCRIPTION bit uses the heartbeat's expression, with tag codes
    # recomputed (the heartbeat's codeSet of zeros would match nothing).
    for tag in ("TagA", "TagC", "TagB"):
        await broker.send("TopicA", tag.encode(), properties={"TAGS": tag})
    pulled = await broker.pull("TopicA", group="CG_TEST", sys_flag=0, subscription=None)
    assert [m.body for m in messages(pulled)] == [b"TagA", b"TagB"]
    no_sub = await broker.pull("TopicA", group="CG_OTHER", sys_flag=0, subscription=None)
    assert no_sub.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


async def test_unknown_group_has_no_consumer_list(broker: Harness) -> None:
    response = await _consumer_list(broker, "CG_NONE")
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "no consumer" in (response.remark or "")


async def test_members_are_notified_and_dropped_on_close(broker: Harness) -> None:
    notified: list[str] = []

    async def on_notify(connection: Any, request: RemotingCommand) -> None:
        notified.append(request.ext_fields["consumerGroup"])

    handlers = HandlerTable()
    handlers.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
    first = RemotingClient(handlers)
    second = RemotingClient()
    try:
        beat = RemotingCommand(code=RequestCode.HEART_BEAT, body=_heartbeat("c1"))
        assert (await first.invoke(broker.addr, beat, 3000)).code == 0
        await eventually(lambda: notified == ["CG_TEST"])
        beat2 = RemotingCommand(code=RequestCode.HEART_BEAT, body=_heartbeat("c2"))
        assert (await second.invoke(broker.addr, beat2, 3000)).code == 0
        await eventually(lambda: notified == ["CG_TEST", "CG_TEST"])
        # The same heartbeat again changes nothing: no notification.
        beat1 = RemotingCommand(code=RequestCode.HEART_BEAT, body=_heartbeat("c1"))
        assert (await first.invoke(broker.addr, beat1, 3000)).code == 0
        assert broker.app.clients.consumer_ids("CG_TEST") == ["c1", "c2"]
        await second.close()
        await eventually(lambda: broker.app.clients.consumer_ids("CG_TEST") == ["c1"])
        await eventually(lambda: len(notified) == 3)
        # UNREGISTER_CLIENT with C++'s empty producer group.
        fields = UnregisterClientRequestHeader(
            client_id="c1", producer_group="", consumer_group="CG_TEST"
        ).to_fields()
        fields["producerGroup"] = ""
        cmd = RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields=fields)
        assert (await first.invoke(broker.addr, cmd, 3000)).code == 0
        assert broker.app.clients.consumer_ids("CG_TEST") == []
    finally:
        await first.close()
        await second.close()


class _Conn:
    """Stands in for a Connection as a dict key (the registry only hashes and names it)."""

    peer_text = "127.0.0.1:1"


def test_registrations_expire_after_silence() -> None:
    clock = FakeClock()
    changes: list[str] = []
    registry = ClientRegistry(
        clock, expiry_ms=120_000, on_consumer_ids_changed=lambda g, c: changes.append(g)
    )
    conn_a, conn_b = _Conn(), _Conn()
    sub = [SubscriptionData(topic="T", sub_string="*")]

    def beat(conn: Any, client_id: str) -> None:
        channel = ClientChannel(conn, client_id, "CPP", 63, clock.monotonic_ms())
        registry.register_consumer(
            "G",
            channel,
            consume_type="PUSH",
            message_model="CLUSTERING",
            consume_from_where="LAST",
            subscriptions=sub,
        )

    beat(conn_a, "a")
    clock.advance(60_000)
    beat(conn_b, "b")
    clock.advance(61_000)
    assert registry.expire() == 1
    assert registry.consumer_ids("G") == ["b"]
    assert changes == ["G", "G", "G"]


def test_queue_locks() -> None:
    clock = FakeClock()
    locks = QueueLockTable(clock, expiry_ms=60_000)
    q0, q1 = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1)
    assert locks.lock_batch("G", [q0, q1], "A") == {q0, q1}
    assert locks.lock_batch("G", [q0, q1], "B") == set()
    assert locks.lock_batch("OTHER", [q0], "B") == {q0}  # locks are per group
    locks.unlock_batch("G", [q1], "B")  # not B's: ignored
    assert locks.holder("G", q1) == "A"
    locks.unlock_batch("G", [q1], "A")
    assert locks.lock_batch("G", [q1], "B") == {q1}
    clock.advance(60_001)
    assert locks.lock_batch("G", [q0], "B") == {q0}  # A's lock expired


async def test_lock_batch_over_the_wire(broker: Harness) -> None:
    q0 = MessageQueue("T", "broker-a", 0)
    body = LockBatchRequestBody(consumer_group="G", client_id="A", mq_set=frozenset({q0}))
    response = await broker.call(
        RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=body.to_json())
    )
    assert LockBatchResponseBody.from_json(response.body).lock_ok_mq_set == {q0}
    other = LockBatchRequestBody(consumer_group="G", client_id="B", mq_set=frozenset({q0}))
    response = await broker.call(
        RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=other.to_json())
    )
    assert LockBatchResponseBody.from_json(response.body).lock_ok_mq_set == frozenset()
    response = await broker.call(
        RemotingCommand(code=RequestCode.UNLOCK_BATCH_MQ, body=body.to_json())
    )
    assert response.code == ResponseCode.SUCCESS
    assert broker.app.locks.holder("G", q0) is None


def test_queue_locks_are_bounded_and_swept() -> None:
    clock = FakeClock()
    locks = QueueLockTable(clock, expiry_ms=1_000, locks_max=3)
    queues = [MessageQueue("T", "broker-a", i) for i in range(5)]
    assert locks.lock_batch("G", queues, "A") == set(queues[:3])
    assert locks.count == 3
    assert locks.refused == 2
    assert locks.lock_batch("G", queues[:3], "A") == set(queues[:3])  # renewals still work
    clock.advance(1_001)
    assert locks.sweep() == 3
    assert locks.count == 0
    assert locks.holder("G", queues[0]) is None
    # A full table sweeps expired locks before refusing a new one.
    assert locks.lock_batch("G", queues[:3], "A") == set(queues[:3])
    clock.advance(1_001)
    assert locks.lock_batch("G2", [queues[4]], "B") == {queues[4]}
    assert locks.count == 1
    assert QUEUE_LOCKS_MAX == 100_000


async def test_locks_go_with_their_connection_and_names_are_checked(broker: Harness) -> None:
    q0 = MessageQueue("T", "broker-a", 0)
    other = RemotingClient()
    body = LockBatchRequestBody(consumer_group="G", client_id="A", mq_set=frozenset({q0}))
    response = await Harness(broker.app, other).call(
        RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=body.to_json())
    )
    assert LockBatchResponseBody.from_json(response.body).lock_ok_mq_set == {q0}
    assert broker.app.locks.holder("G", q0) == "A"
    await other.close()
    await eventually(lambda: broker.app.locks.count == 0)
    assert broker.app.locks.holder("G", q0) is None
    for group, topic in (("G@x", "T"), ("G", "T T")):
        bad = LockBatchRequestBody(
            consumer_group=group, client_id="A", mq_set=frozenset({MessageQueue(topic, "b", 0)})
        )
        response = await broker.call(
            RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=bad.to_json())
        )
        assert response.code == ResponseCode.SYSTEM_ERROR
    assert broker.app.locks.count == 0
