"""A header over FRAME_HEADER_SIZE_MAX is decoded no further than its answer needs: a binary
header's fixed part (its fields are never walked: garbage there is still answered), a JSON
header's fixed fields and a send's properties, and a JSON header over twice the limit closes
the connection (ProtocolError) instead of being parsed."""

from __future__ import annotations

import struct

import orjson
import pytest

from tidemq.errors import ProtocolError
from tidemq.limits import FRAME_HEADER_SIZE_MAX
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import (
    FLAG_ONEWAY,
    OVERSIZED_JSON_HEADER_MAX,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    encode,
)


def frame(serialize_type: int, header: bytes, body: bytes = b"") -> bytes:
    return (
        struct.pack(">II", 4 + len(header) + len(body), (serialize_type << 24) | len(header))
        + header
        + body
    )


def binary_header(code: int, opaque: int, flag: int, rest: bytes) -> bytes:
    """The 17-byte fixed part (remark_len 0), then `rest` where extFields would be."""
    return struct.pack(">hBhiii", code, 0, 401, opaque, flag, 0) + rest


def json_header(code: int, opaque: int, ext_fields: dict[str, object]) -> bytes:
    return orjson.dumps(
        {"code": code, "extFields": ext_fields, "flag": 0, "language": "CPP",
         "opaque": opaque, "version": 401}
    )  # fmt: skip


def test_a_binary_header_is_answered_from_its_fixed_part_only() -> None:
    # Not a valid field list at all: walking it would raise; the fixed part suffices.
    garbage = b"\xff" * (FRAME_HEADER_SIZE_MAX + 1)
    decoder = FrameDecoder()
    after = encode(RemotingCommand(code=RequestCode.HEART_BEAT, opaque=9))
    header = binary_header(RequestCode.SEND_MESSAGE_V2, 42, FLAG_ONEWAY, garbage)
    assert decoder.feed(frame(SerializeType.ROCKETMQ, header, b"body") + after)[0].opaque == 9
    [refused] = decoder.oversized
    command = refused.command
    assert (command.code, command.opaque, command.flag) == (
        RequestCode.SEND_MESSAGE_V2,
        42,
        FLAG_ONEWAY,
    )
    assert command.serialize_type == SerializeType.ROCKETMQ
    assert command.ext_fields == {}
    assert refused.header_size == len(header)
    assert not refused.complete


def test_a_json_header_keeps_its_fixed_fields_and_a_sends_properties_only() -> None:
    properties = "KEYS\x01" + "k" * FRAME_HEADER_SIZE_MAX + "\x02"
    fields: dict[str, object] = {"a": "PG", "b": "T", "i": properties, "n": 5, "z": [1, {}]}
    decoder = FrameDecoder()
    assert decoder.feed(frame(SerializeType.JSON, json_header(310, 3, fields), b"x")) == []
    [refused] = decoder.oversized
    assert (refused.command.code, refused.command.opaque) == (310, 3)
    assert refused.command.ext_fields == {"i": properties}
    assert refused.command.language == "CPP"
    assert not refused.complete


def test_a_json_header_over_twice_the_limit_is_not_parsed() -> None:
    # 1-byte fields make the most keys per byte: what made such a header costly to parse.
    fields = {f"{i:x}": "" for i in range(OVERSIZED_JSON_HEADER_MAX // 8)}
    header = json_header(10, 1, fields)
    assert len(header) > OVERSIZED_JSON_HEADER_MAX
    with pytest.raises(ProtocolError, match=f"over {OVERSIZED_JSON_HEADER_MAX} bytes"):
        FrameDecoder().feed(frame(SerializeType.JSON, header))


@pytest.mark.parametrize(
    "header",
    [
        b"[" + b" " * FRAME_HEADER_SIZE_MAX + b"]",
        b'{"opaque":1}' + b" " * FRAME_HEADER_SIZE_MAX,
        b'{"code":' + b" " * FRAME_HEADER_SIZE_MAX,
    ],
    ids=["not-an-object", "no-code", "not-json"],
)
def test_a_malformed_oversized_json_header_closes(header: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(frame(SerializeType.JSON, header))
