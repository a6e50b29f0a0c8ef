"""client/sending.py: the fast encoders agree with the careful ones; the send timeouts fire."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.client.message import Message, SendStatus
from tidemq.client.sending import (
    PreparedMessage,
    SendTimeouts,
    SendWaiter,
    message_properties,
    prepare_message,
    send_properties,
    send_result,
)
from tidemq.errors import BrokerError, ProtocolError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import SendMessageResponseHeader
from tidemq.testing.wait import eventually

KEY = "0A0000010001000000000000000A0001"

MESSAGES = [
    Message("T", b"x"),
    Message("T", b"x", tags="TagA"),
    Message("T", b"x", tags=""),
    Message("T", b"x", keys="k1 k2"),
    Message("T", b"x", tags="A", keys=["k"], flag=3),
    Message("T", b"x", properties={"p": "v", "q": "w"}),
    Message("T", b"x", properties={pm.UNIQ_KEY: "MINE"}),
    Message("T", b"x", delay_level=3),
    Message("T", b"x", deliver_time_ms=1_700_000_000_123, tags="B"),
]


@pytest.mark.parametrize("message", MESSAGES)
def test_send_properties_equal_the_property_map(message: Message):
    expected = message_properties(message, KEY)
    text, key = send_properties(message, KEY)
    assert text == pm.encode_properties(expected)
    assert pm.decode_properties(text) == expected
    assert key == expected[pm.UNIQ_KEY]


@pytest.mark.parametrize("tags", ["a\x01b", "a\x02", "\x02"])
def test_tags_with_a_separator_are_refused_on_both_paths(tags: str):
    message = Message("T", b"x", tags=tags)
    with pytest.raises(ProtocolError):
        pm.encode_properties(message_properties(message, KEY))
    with pytest.raises(ProtocolError):
        send_properties(message, KEY)


def test_prepare_message_checks_a_topic_once_and_still_checks_each_body():
    checked: set[str] = set()
    prepared = prepare_message(Message("T", b"hello"), KEY, checked_topics=checked)
    assert prepared == PreparedMessage(
        pm.encode_properties({pm.UNIQ_KEY: KEY, pm.WAIT: "true"}), b"hello", 0, 0, KEY
    )
    assert checked == {"T"}
    with pytest.raises(ValueError, match="empty"):
        prepare_message(Message("T", b""), KEY, checked_topics=checked)
    with pytest.raises(Exception, match="max_message_size"):
        prepare_message(Message("T", b"xx"), KEY, max_message_size=1, checked_topics=checked)
    with pytest.raises(ValueError, match="system topic"):
        prepare_message(Message("SCHEDULE_TOPIC_XXXX", b"x"), KEY, checked_topics=checked)
    with pytest.raises(ProtocolError):
        prepare_message(Message("bad topic", b"x"), KEY, checked_topics=checked)
    assert checked == {"T"}


QUEUE = MessageQueue("T", "broker-a", 2)
RESPONSE_FIELDS = [
    {"msgId": "M", "queueId": "2", "queueOffset": "7"},
    {"msgId": "M", "queueId": "3", "queueOffset": "0", "transactionId": "X"},
    {"msgId": "M,N", "queueId": "2", "queueOffset": "123456789012345678"},
    {"msgId": "M", "queueId": " 2", "queueOffset": "+7"},  # lenient: the careful parser
    {"msgId": "M", "queueId": "-1", "queueOffset": "-5"},
    {"msgId": "M", "queueId": "2", "queueOffset": "1234567890123456789"},
    {"msgId": "M", "queueId": "٢", "queueOffset": "7"},  # a non-ASCII digit
    {"msgId": "M", "queueId": "2"},
    {"queueId": "2", "queueOffset": "7"},
    {"msgId": "M", "queueId": "", "queueOffset": "7"},
]


@pytest.mark.parametrize("fields", RESPONSE_FIELDS)
@pytest.mark.parametrize("code", [ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT])
def test_send_result_agrees_with_the_response_header(fields: dict[str, str], code: int):
    response = RemotingCommand(code=code, flag=1, ext_fields=fields)
    try:
        header = SendMessageResponseHeader.from_fields(fields)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            send_result("T", QUEUE, KEY, response)
        return
    result = send_result("T", QUEUE, KEY, response)
    assert result.status is (SendStatus.SEND_OK if code == 0 else SendStatus.FLUSH_DISK_TIMEOUT)
    assert (result.msg_id, result.offset_msg_id) == (KEY, header.msg_id)
    assert result.message_queue == MessageQueue("T", "broker-a", header.queue_id)
    assert (result.queue_offset, result.transaction_id) == (
        header.queue_offset,
        header.transaction_id,
    )


def test_send_result_raises_the_broker_error_of_a_failure_code():
    response = RemotingCommand(code=ResponseCode.SYSTEM_BUSY, flag=1, remark="busy")
    with pytest.raises(BrokerError) as info:
        send_result("T", QUEUE, KEY, response)
    assert info.value.response_code == ResponseCode.SYSTEM_BUSY


def _waiter() -> SendWaiter:
    future: asyncio.Future = asyncio.get_running_loop().create_future()
    return SendWaiter("T", QUEUE, ("", b"x", 0, KEY), 0, future, 0.0, 1.0, True, _ignore, _ignore)


def _ignore(waiter: SendWaiter, outcome: object) -> None:
    pass


async def test_timeouts_expire_in_deadline_order_and_skip_discarded():
    expired: list[SendWaiter] = []
    timeouts = SendTimeouts(expired.append)
    slow, fast, done = _waiter(), _waiter(), _waiter()
    timeouts.add(slow, 80.0)
    timeouts.add(fast, 10.0)  # earlier than the timer set: the timer moves
    timeouts.add(done, 20.0)
    timeouts.discard(done)
    assert len(timeouts) == 2
    await eventually(lambda: len(expired) == 1)
    assert expired == [fast]
    await eventually(lambda: len(expired) == 2)
    assert expired == [fast, slow]
    assert len(timeouts) == 0
    timeouts.cancel()


async def test_timeouts_cancel_stops_the_timer():
    expired: list[SendWaiter] = []
    first = SendTimeouts(expired.append)
    first.add(_waiter(), 1.0)
    first.cancel()
    second = SendTimeouts(expired.append)
    later = _waiter()
    second.add(later, 20.0)
    await eventually(lambda: bool(expired))
    assert expired == [later]  # the cancelled timer, due earlier, never fired
