"""The send answer: its fields (`send_response_fields`, what SendMessageResponseHeader.to_fields
gives) and the SUCCESS frame the coalescer writes (`encode_send_success`), checked against
hand-written values and by decoding them back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import (
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    encode,
    encode_send_success,
)
from tidemq.protocol.headers_send import SendMessageResponseHeader, send_response_fields
from tidemq.protocol.message import offset_msg_id

_MSG_ID = "0A00000700002A9F0000000000000400"


def test_response_fields_are_the_wire_names() -> None:
    want = {
        "msgId": _MSG_ID,
        "queueId": "3",
        "queueOffset": "77",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    header = SendMessageResponseHeader(msg_id=_MSG_ID, queue_id=3, queue_offset=77)
    for fields in (send_response_fields(_MSG_ID, 3, 77), header.to_fields()):
        assert fields == want
        assert list(fields) == list(want)
    with_tx = SendMessageResponseHeader(
        msg_id=_MSG_ID, queue_id=3, queue_offset=77, transaction_id="X"
    ).to_fields()
    assert list(with_tx) == [
        "msgId",
        "queueId",
        "queueOffset",
        "transactionId",
        "MSG_REGION",
        "TRACE_ON",
    ]
    assert SendMessageResponseHeader.from_fields(with_tx).transaction_id == "X"


def test_success_frame_hand_written() -> None:
    header = (
        b'{"code":0,"extFields":{"msgId":"AB","queueId":"3","queueOffset":"99",'
        b'"MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"JAVA",'
        b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":407}'
    )
    lengths = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big")
    assert encode_send_success(7, "AB", 3, 99) == lengths + header


@given(
    opaque=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    offset=st.integers(min_value=0, max_value=2**63 - 1),
    queue_id=st.integers(min_value=0, max_value=2**31 - 1),
    queue_offset=st.integers(min_value=0, max_value=2**63 - 1),
    version=st.integers(min_value=0, max_value=500),
)
def test_success_frame_round_trips(
    opaque: int, offset: int, queue_id: int, queue_offset: int, version: int
) -> None:
    msg_id = offset_msg_id("10.0.0.7", 10911, offset)
    frame = encode_send_success(opaque, msg_id, queue_id, queue_offset)
    (answer,) = FrameDecoder().feed(frame)
    assert (answer.code, answer.opaque, answer.flag) == (
        ResponseCode.SUCCESS,
        opaque,
        FLAG_RESPONSE,
    )
    header = SendMessageResponseHeader.from_fields(answer.ext_fields)
    assert header == SendMessageResponseHeader(
        msg_id=msg_id, queue_id=queue_id, queue_offset=queue_offset
    )
    # The template is the frame encoder's bytes, whatever the request's version.
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=opaque, version=version)
    fields = send_response_fields(msg_id, queue_id, queue_offset)
    assert frame == encode(request.response(ResponseCode.SUCCESS, fields))
