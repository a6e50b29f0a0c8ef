"""The frame codec: round trips, every split of the stream, real clients' headers, bad input."""

from __future__ import annotations

import random
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.frame import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
)

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    ext_fields=st.dictionaries(_text, _text, max_size=8),
    body=st.binary(max_size=300),
    remark=st.none() | _text,
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=st.integers(0, 2**15 - 1),
    serialize_type=st.sampled_from(list(SerializeType)),
)


@given(commands)
def test_round_trip_in_one_chunk(command: RemotingCommand) -> None:
    [decoded] = FrameDecoder().feed(encode(command))
    assert decoded == command


@settings(max_examples=50)
@given(st.lists(commands, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_round_trip_at_random_splits(batch: list[RemotingCommand], rnd: random.Random) -> None:
    stream = b"".join(encode(c) for c in batch)
    decoder = FrameDecoder()
    decoded: list[RemotingCommand] = []
    position = 0
    while position < len(stream):
        step = rnd.randint(1, 40)
        decoded += decoder.feed(stream[position : position + step])
        position += step
    assert decoded == batch
    assert decoder.buffered == 0


def test_one_byte_at_a_time() -> None:
    command = RemotingCommand(code=11, opaque=7, ext_fields={"topic": "T"}, body=b"abc")
    stream = encode(command) * 3
    decoder = FrameDecoder()
    decoded = [c for i in range(len(stream)) for c in decoder.feed(stream[i : i + 1])]
    assert decoded == [command] * 3


def _frame_with_header(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def test_cpp_request_header_with_numbers_and_trailing_newline() -> None:
    # As captured from the C++ 1.2.3 client: sorted keys, numbers for some fields, trailing \n.
    header = (
        b'{"code":10,"extFields":{"AccessKey":"","batch":"0","defaultTopicQueueNums":4,'
        b'"queueId":0,"sysFlag":0,"topic":"TopicA"},"flag":0,"language":"CPP","opaque":0,'
        b'"remark":"","version":63}\n'
    )
    [command] = FrameDecoder().feed(_frame_with_header(header, b"hello"))
    assert command.code == 10
    assert command.language == "CPP"
    assert command.ext_fields["queueId"] == "0"
    assert command.ext_fields["defaultTopicQueueNums"] == "4"
    assert command.ext_fields["topic"] == "TopicA"
    assert command.body == b"hello"


def test_ali_ons_booleans_become_text_and_nulls_are_dropped() -> None:
    header = orjson.dumps(
        {
            "code": 310,
            "language": "JAVA",
            "opaque": 1,
            "flag": 0,
            "version": 121,
            "extFields": {"k": False, "m": True, "e": 2, "n": None},
        }
    )
    [command] = FrameDecoder().feed(_frame_with_header(header))
    assert command.ext_fields == {"k": "false", "m": "true", "e": "2"}


def test_response_keeps_opaque_and_serialisation_and_sets_the_response_bit() -> None:
    request = RemotingCommand(code=10, opaque=42, serialize_type=SerializeType.ROCKETMQ)
    response = request.response(0, {"msgId": "X"})
    assert response.opaque == 42
    assert response.flag == FLAG_RESPONSE
    assert response.is_response
    assert not response.is_oneway
    assert response.serialize_type is SerializeType.ROCKETMQ


def test_json_response_has_serialisation_byte_zero_and_string_fields() -> None:
    frame = encode(RemotingCommand(code=0, opaque=1, flag=FLAG_RESPONSE, ext_fields={"q": "2"}))
    total, type_and_length = struct.unpack_from(">II", frame)
    assert total == len(frame) - 4
    assert type_and_length >> 24 == 0
    header = orjson.loads(frame[8 : 8 + type_and_length])
    assert header["extFields"] == {"q": "2"}
    assert "remark" not in header


def test_oneway_flag() -> None:
    assert RemotingCommand(code=1, flag=FLAG_ONEWAY).is_oneway


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (struct.pack(">I", 0), "below the minimum"),
        (struct.pack(">I", 3), "below the minimum"),
        (struct.pack(">I", 0xFFFFFFFF), "exceeds the limit"),
        (struct.pack(">II", 8, 100) + b"xxxx", "exceeds frame length"),
        (_frame_with_header(b"not json"), "not JSON"),
        (_frame_with_header(b"[1,2]"), "not a JSON object"),
        (_frame_with_header(b'{"opaque":1}'), "code"),
        (_frame_with_header(b'{"code":1,"extFields":[1]}'), "extFields"),
        (struct.pack(">II", 6, 0x07000002) + b"{}", "serialisation type"),
        (_frame_with_header(b'{"code":10,"opaque":99999999999999999999}'), "32-bit range"),
        (_frame_with_header(b'{"code":10,"opaque":1,"flag":4294967296}'), "32-bit range"),
        (_frame_with_header(b'{"code":1e400}'), "not JSON"),
    ],
)
def test_bad_frames_raise_protocol_error(stream: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        FrameDecoder().feed(stream)


def test_frame_size_limit_is_configurable() -> None:
    frame = encode(RemotingCommand(code=1, body=b"x" * 100))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        FrameDecoder(frame_size_max=50).feed(frame)


def test_short_frame_is_rejected() -> None:
    with pytest.raises(ProtocolError):
        decode_frame(b"\x00\x00")


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_decoder_raises_only_protocol_error(data: bytes) -> None:
    try:
        FrameDecoder(frame_size_max=1024).feed(data)
    except ProtocolError:
        pass


@settings(max_examples=200)
@given(commands, st.integers(0, 10_000), st.integers(0, 255))
def test_fuzz_corrupted_binary_header_raises_only_protocol_error(
    command: RemotingCommand, position: int, value: int
) -> None:
    command.serialize_type = SerializeType.ROCKETMQ
    frame = bytearray(encode(command))
    index = 8 + position % max(1, len(frame) - 8)
    if index < len(frame):
        frame[index] = value
    try:
        FrameDecoder().feed(bytes(frame))
    except ProtocolError:
        pass
