"""A send that breaks a size limit inside a well-formed frame is answered with a code and a
remark naming the limit, and its connection keeps serving (issue 15 item 4): properties over the
store's 32767 bytes, keys or tags making them so, a topic over 127 characters, and a header over
FRAME_HEADER_SIZE_MAX (the C++ client's 1 MiB KEYS property, which used to close the
connection). Nothing refused is stored.
"""

from __future__ import annotations

import asyncio
import re
import struct

import orjson
from broker_harness import Harness

from tidemq.limits import MIB
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import encode_properties

TOPIC = "LimitsTopic"
STORE_LIMIT = re.compile(r"properties of (\d+) bytes exceed 32767")


async def test_properties_over_32767_bytes_are_message_illegal(broker: Harness) -> None:
    assert (await broker.send(TOPIC, b"first")).code == ResponseCode.SUCCESS
    for name in ("KEYS", "TAGS", "custom"):
        # Twice: the first send to a topic is checked, later ones take the coalesced path.
        for _ in range(2):
            response = await broker.send(TOPIC, b"big", properties={name: "v" * 40_000})
            assert response.code == ResponseCode.MESSAGE_ILLEGAL, response
            match = STORE_LIMIT.search(response.remark or "")
            assert match, response.remark
            assert int(match[1]) > 40_000
    assert (await broker.send(TOPIC, b"after")).code == ResponseCode.SUCCESS
    assert broker.app.store.max_offset(TOPIC, 0) == 2


async def test_a_topic_over_127_characters_is_refused_naming_the_limit(broker: Harness) -> None:
    response = await broker.send("T" * 200, b"x")
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "longer than 127 characters" in (response.remark or "")
    assert (await broker.send(TOPIC, b"after")).code == ResponseCode.SUCCESS


def _send_frame(opaque: int, properties: str, body: bytes) -> bytes:
    """A SEND_MESSAGE_V2 frame built by hand (our encoder refuses a header over the limit)."""
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1,
        flag=0,
        properties=properties,
    )
    head = orjson.dumps(
        {"code": RequestCode.SEND_MESSAGE_V2, "extFields": header.to_fields(v2=True), "flag": 0,
         "language": "CPP", "opaque": opaque, "serializeTypeCurrentRPC": "JSON", "version": 401}
    )  # fmt: skip
    return struct.pack(">II", 4 + len(head) + len(body), len(head)) + head + body


async def test_a_1_mib_keys_property_is_answered_and_the_connection_goes_on(
    broker: Harness,
) -> None:
    host, port = broker.addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        big = encode_properties({"KEYS": "k" * MIB, "TAGS": "t"})
        writer.write(_send_frame(1, big, b"too big"))
        writer.write(_send_frame(2, encode_properties({"TAGS": "t"}), b"fine"))
        decoder = FrameDecoder()
        answers: dict[int, RemotingCommand] = {}
        while len(answers) < 2:
            data = await asyncio.wait_for(reader.read(1 << 16), 10)
            assert data, f"the broker closed the connection after {answers}"
            answers.update((a.opaque, a) for a in decoder.feed(data))
        refused, stored = answers[1], answers[2]
        assert refused.code == ResponseCode.MESSAGE_ILLEGAL
        assert f"of {len(big)} bytes exceed the limit of 32767 bytes" in (refused.remark or "")
        assert stored.code == ResponseCode.SUCCESS
    finally:
        writer.close()
    assert broker.app.store.max_offset(TOPIC, 0) == 1
