"""TransactionProducer.send_half: a half message is an ordinary send on the producer's fast path,
flagged PREPARED as the Java producer flags it; an invalid message raises before anything is sent,
a failed send is reported in the HalfSend."""

from __future__ import annotations

from typing import Any

import pytest
from client_fakes import FakeCluster, answer
from test_send_fast_path import connected, headers, vars_of

from tidemq.client.message import Message, MessageExt, SendStatus
from tidemq.client.sending import prepare_parts
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.errors import BrokerError, MessageTooLargeError, ProtocolError
from tidemq.protocol import message as pm
from tidemq.protocol.codes import RequestCode, ResponseCode

SEND = RequestCode.SEND_MESSAGE_V2


class _Listener:
    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE


def _producer(fake: FakeCluster) -> TransactionProducer:
    return TransactionProducer("PG_TX", fake.namesrv_addr, listener=_Listener(), retry_times=1)


@pytest.mark.parametrize(
    ("properties", "prepared"),
    [
        ({}, False),
        ({"TRAN_MSG": "true"}, True),
        ({"TRAN_MSG": "TRUE"}, True),
        ({"TRAN_MSG": "1"}, True),  # what the broker reads as a half message too
        ({"TRAN_MSG": "false"}, False),
        ({"TRAN_MSG": "yes"}, False),
    ],
)
@pytest.mark.parametrize("size", [10, 5000])  # 5000: compressed, both flags kept
def test_prepare_parts_flags_a_half_message_prepared(
    properties: dict[str, str], prepared: bool, size: int
) -> None:
    message = Message("TopicA", b"x" * size, properties=properties)
    _, _, sys_flag, _ = prepare_parts(message, "KEY", 4096, 5, 1 << 20, None)
    assert bool(sys_flag & pm.SysFlag.PREPARED) is prepared
    assert pm.SysFlag.transaction_type(sys_flag) in (
        pm.SysFlag.TRANSACTION_NOT,
        pm.SysFlag.PREPARED,
    )
    assert bool(sys_flag & pm.SysFlag.COMPRESSED) is (size >= 4096)


async def test_half_send_takes_the_fast_path_and_agrees_with_the_coroutine_path(
    fake: FakeCluster,
) -> None:
    fake.add_topic("TopicA", brokers=fake.brokers[:1])
    async with _producer(fake) as producer:
        message = Message("TopicA", b"half", tags="T", keys="k", properties={"p": "v"}, flag=5)
        first = await producer.send_half(message)  # route lookup and connect: coroutine path

        async def coroutine_path(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the half send took the coroutine path")

        producer._send_with_retries = coroutine_path  # type: ignore[method-assign]
        second = await producer.send_half(message)
    slow, fast = headers(fake)
    for half, header in ((first, slow), (second, fast)):
        assert half.send_result is not None
        assert half.send_result.status is SendStatus.SEND_OK
        assert half.send_result.msg_id == half.msg_id
        props = pm.decode_properties(header.properties or "")
        assert props.pop(pm.UNIQ_KEY) == half.msg_id == half.message.properties[pm.UNIQ_KEY]
        assert props == {
            "p": "v", "TRAN_MSG": "true", "PGROUP": "PG_TX", "WAIT": "true", "TAGS": "T",
            "KEYS": "k",
        }  # fmt: skip
        assert header.sys_flag == pm.SysFlag.PREPARED
        assert header.producer_group == "PG_TX"
    unstable = {"born_timestamp", "queue_id", "properties"}
    assert {k: v for k, v in vars_of(slow).items() if k not in unstable} == {
        k: v for k, v in vars_of(fast).items() if k not in unstable
    }


async def test_half_send_keeps_a_caller_uniq_key(fake: FakeCluster) -> None:
    fake.add_topic("TopicA")
    async with _producer(fake) as producer:
        await connected(producer, fake)
        half = await producer.send_half(Message("TopicA", b"h", properties={pm.UNIQ_KEY: "MINE-1"}))
    assert half.msg_id == "MINE-1"
    assert half.send_result is not None
    assert half.send_result.msg_id == "MINE-1"
    sent = [pm.decode_properties(h.properties or "") for h in headers(fake)]
    assert [p[pm.UNIQ_KEY] for p in sent if pm.TRAN_MSG in p] == ["MINE-1"]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("TopicA", b""), ValueError),
        (Message("TopicA", b"x" * 2048), MessageTooLargeError),
        (Message("TopicA", b"x", properties={"bad": "a\x02b"}), ProtocolError),
        (Message("TopicA", b"x", delay_level=2), ValueError),
    ],
)
async def test_an_invalid_half_message_raises_and_sends_nothing(
    fake: FakeCluster, message: Message, error: type[Exception]
) -> None:
    fake.add_topic("TopicA")
    producer = TransactionProducer(
        "PG_TX", fake.namesrv_addr, listener=_Listener(), max_message_size=1024
    )
    async with producer:
        await connected(producer, fake)
        sent = len(headers(fake))
        with pytest.raises(error):
            await producer.send_half(message)
    assert len(headers(fake)) == sent


async def test_a_refused_half_send_is_reported_after_the_producer_retries(
    fake: FakeCluster,
) -> None:
    fake.add_topic("TopicA")
    async with _producer(fake) as producer:
        await connected(producer, fake)
        sent = len(headers(fake))
        for broker in fake.brokers:
            broker.replies[SEND] = answer(ResponseCode.SYSTEM_BUSY, "[TRANSACTIONS_BUSY]")
        half = await producer.send_half(Message("TopicA", b"h"))
        listener_ran = half.run_local
        result = await producer.end_transaction(half, LocalTransactionState.ROLLBACK_MESSAGE)
    assert not listener_ran
    assert half.send_result is None
    assert isinstance(half.error, BrokerError)
    assert half.error.response_code == ResponseCode.SYSTEM_BUSY
    assert len(headers(fake)) == sent + 2  # the first attempt and its one retry
    assert result.send_result is None
    assert not any(b.of_code(RequestCode.END_TRANSACTION) for b in fake.brokers)
