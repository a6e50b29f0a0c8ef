"""The hot-path parsers (issue 6) agree with the careful ones they short-cut."""

from __future__ import annotations

import pytest

from tidemq.errors import ProtocolError
from tidemq.protocol._fields import parse_int_text, parse_plain_int
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.protocol.headers_send import SendMessageRequestHeader, SendMessageResponseHeader

_HEADER = SendMessageRequestHeader(
    producer_group="PG",
    topic="T",
    queue_id=-1,
    sys_flag=4,
    born_timestamp=1_700_000_000_000,
    properties="UNIQ_KEY\x01AB\x02",
    max_reconsume_times=16,
    batch=True,
    broker_name="broker-a",
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("-1", -1),
        ("123456789012345678", 123456789012345678),
        ("", None),
        ("-", None),
        ("+4", None),
        (" 4", None),
        ("1_0", None),
        ("\u0663", None),
        ("1234567890123456789", None),
    ],
)
def test_plain_int_takes_only_plain_digits(text: str, value: int | None) -> None:
    assert parse_plain_int(text) == value


@pytest.mark.parametrize("text", ["+4", " 4 ", "-0", "9223372036854775807"])
def test_careful_int_parsing_still_applies(text: str) -> None:
    assert parse_int_text(text, what="x") == int(text)


def test_int_out_of_range_is_refused() -> None:
    with pytest.raises(ProtocolError, match="64-bit"):
        parse_int_text("9223372036854775808", what="x")


@pytest.mark.parametrize("v2", [False, True])
def test_send_header_round_trips_in_both_spellings(v2: bool) -> None:
    assert SendMessageRequestHeader.from_fields(_HEADER.to_fields(v2=v2)) == _HEADER


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"e": " 3", "k": "TRUE", "j": ""}, {"queue_id": 3, "unit_mode": True}),
        (
            {"f": "+4", "m": "0", "l": ""},
            {"sys_flag": 4, "batch": False, "max_reconsume_times": None},
        ),
        ({"n": ""}, {"broker_name": None}),
    ],
)
def test_send_header_lenient_forms_take_the_careful_path(
    changes: dict[str, str], expected: dict[str, object]
) -> None:
    fields = _HEADER.to_fields(v2=True) | changes
    header = SendMessageRequestHeader.from_fields(fields)
    for name, value in expected.items():
        assert getattr(header, name) == value


@pytest.mark.parametrize(
    ("letter", "wire"), [("d", "defaultTopicQueueNums"), ("g", "bornTimestamp")]
)
def test_send_header_errors_still_name_the_field(letter: str, wire: str) -> None:
    fields = _HEADER.to_fields(v2=True) | {letter: "x"}
    with pytest.raises(ProtocolError, match=wire):
        SendMessageRequestHeader.from_fields(fields)
    del fields[letter]
    with pytest.raises(ProtocolError, match=wire):
        SendMessageRequestHeader.from_fields(fields)


def test_send_response_header_fast_and_careful() -> None:
    header = SendMessageResponseHeader(msg_id="M", queue_id=2, queue_offset=7, transaction_id="X")
    assert SendMessageResponseHeader.from_fields(header.to_fields()) == header
    lenient = {"msgId": "M", "queueId": " 2", "queueOffset": "+7"}
    assert SendMessageResponseHeader.from_fields(lenient).queue_offset == 7


def test_decoder_keeps_a_partial_tail_after_whole_frames() -> None:
    frames = [
        encode(RemotingCommand(code=10 + i, opaque=i, ext_fields={"k": str(i)}, body=b"x" * i))
        for i in range(3)
    ]
    data = b"".join(frames)
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert [c.opaque for c in got] == [0, 1, 2]
        assert [c.body for c in got] == [b"", b"x", b"xx"]
        assert decoder.buffered == 0


def test_decoder_turns_non_string_json_fields_into_text() -> None:
    header = b'{"code":10,"opaque":1,"flag":0,"extFields":{"a":4,"b":true,"c":null,"d":"s"}}'
    frame = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
    (command,) = FrameDecoder().feed(frame)
    assert command.ext_fields == {"a": "4", "b": "true", "d": "s"}
