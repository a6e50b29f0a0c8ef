from __future__ import annotations

import array
import dataclasses
import mmap

import pytest

from tidemq.client.api import decode_pull_response
from tidemq.client.message import Message, MessageExt, PullStatus
from tidemq.errors import BrokerError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.record import decode_record, encode_record

MQ = MessageQueue("T", "broker-a", 1)


def record(
    body: bytes, props: dict[str, str], *, offset: int = 0, sys_flag: int = 0, topic: str = "T"
) -> bytes:
    return encode_record(
        topic=topic,
        queue_id=1,
        body=body,
        flag=3,
        properties=pm.encode_properties(props),
        sys_flag=sys_flag,
        born_timestamp=111,
        born_host=("10.0.0.5", 4000),
        store_timestamp=222,
        store_host=("127.0.0.1", 10911),
        reconsume_times=2,
        prepared_transaction_offset=0,
        queue_offset=offset,
        physical_offset=1000 + offset,
    )


def test_message_normalises_keys():
    assert Message("T", b"x", keys="k1 k2").keys == ("k1", "k2")
    assert Message("T", b"x", keys=["a"]).keys == ("a",)
    with pytest.raises(ValueError, match="delay_level"):
        Message("T", b"x", delay_level=-1)


def test_message_body_is_bytes_or_utf8_str():
    assert Message("T", b"raw").body == b"raw"
    assert Message("T", "h\u00e9llo").body == "h\u00e9llo".encode()
    assert Message("T", bytearray(b"ab")).body == b"ab"
    assert type(Message("T", memoryview(b"ab")).body) is bytes
    # Before issue 16, bytes(5) made five zero bytes and bytes([1]) a one-byte body.
    for wrong in (5, None, [1], {"a": 1}, 1.5):
        with pytest.raises(TypeError, match=r"Message body must be bytes or str \(sent as UTF-8\)"):
            Message("T", wrong)  # type: ignore[arg-type]


def test_message_body_takes_any_buffer():
    """array.array, mmap, NumPy arrays... were taken through bytes(x) before the TypeError for
    ints: anything with the buffer protocol still is, as its raw bytes."""
    numbers = array.array("i", [1, -2, 3])
    assert Message("T", numbers).body == numbers.tobytes()
    assert Message("T", memoryview(b"abcdef")[::2]).body == b"ace"  # not contiguous
    with mmap.mmap(-1, 4) as mapped:
        mapped.write(b"page")
        assert Message("T", mapped).body == b"page"
    # closing the map above would raise BufferError had the message kept a view of it


def test_message_keeps_dataclass_behaviour():
    message = Message("T", "x", tags="A", keys="k1 k2", properties={"a": "1"})
    assert message == Message("T", b"x", tags="A", keys=["k1", "k2"], properties={"a": "1"})
    assert dataclasses.replace(message, topic="U").keys == ("k1", "k2")
    assert "topic='T'" in repr(message)
    with pytest.raises(ValueError, match="delay_level"):
        Message("T", b"", delay_level=-1)


def test_message_ext_from_stored_uses_uniq_key_and_inflates():
    raw = record(
        pm.deflate(b"hello" * 1000),
        {"UNIQ_KEY": "ABC", "TAGS": "TagA", "KEYS": "a b"},
        sys_flag=pm.SysFlag.COMPRESSED,
    )
    message = MessageExt.from_stored(decode_record(raw), "broker-a")
    assert message.body == b"hello" * 1000
    assert message.msg_id == "ABC"
    assert message.offset_msg_id == pm.offset_msg_id("127.0.0.1", 10911, 1000)
    assert (message.tags, message.keys) == ("TagA", ("a", "b"))
    assert (message.queue_id, message.queue_offset, message.commit_log_offset) == (1, 0, 1000)
    assert (message.reconsume_times, message.flag, message.born_host) == (2, 3, ("10.0.0.5", 4000))
    assert message.message_queue == MQ
    plain = MessageExt.from_stored(decode_record(record(b"x", {})), "broker-a")
    assert plain.msg_id == plain.offset_msg_id  # no UNIQ_KEY (ali-ons producers)


def pull_response(code: int, body: bytes = b"", next_offset: int = 5) -> RemotingCommand:
    return RemotingCommand(
        code=code,
        body=body,
        ext_fields={
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": str(next_offset),
            "minOffset": "0",
            "maxOffset": "9",
        },
    )


def test_decode_pull_response_filters_by_tag_string():
    body = record(b"a", {"TAGS": "TagA"}, offset=3) + record(b"b", {"TAGS": "TagB"}, offset=4)
    result = decode_pull_response(pull_response(0, body), MQ, pm.parse_tag_expression("TagA"))
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.messages] == [b"a"]
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (5, 0, 9)
    everything = decode_pull_response(pull_response(0, body), MQ, pm.parse_tag_expression("*"))
    assert [m.queue_offset for m in everything.messages] == [3, 4]


@pytest.mark.parametrize(
    ("code", "status"),
    [(19, PullStatus.NO_NEW_MSG), (20, PullStatus.NO_MATCHED_MSG), (21, PullStatus.OFFSET_ILLEGAL)],
)
def test_decode_pull_statuses(code, status):
    result = decode_pull_response(pull_response(code), MQ, pm.parse_tag_expression("*"))
    assert result.status is status
    assert result.messages == []


def test_decode_pull_error_code_raises():
    with pytest.raises(BrokerError) as info:
        decode_pull_response(pull_response(24), MQ, pm.parse_tag_expression("*"))
    assert info.value.response_code == 24
