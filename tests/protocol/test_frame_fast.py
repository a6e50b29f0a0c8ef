"""The JSON header's fast path decodes every header exactly as the careful path does.

The careful path (`_decode_json_object`) is the decoder as it was before the fast path: any JSON
value, lenient where Java is. The fast path takes only what every client sends and hands
everything else to it, so for any header both must give the same command (same values and the
same types: a bool is not an int here) or the same ProtocolError.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol import frame as frame_module
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, SerializeType, encode

_MISSING = object()
_INT32 = st.integers(-(2**31), 2**31 - 1)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _INT32,
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["10", "-3", " 7", "x"]),
)
_numbers = st.one_of(_INT32, _INT32, _scalars, st.just(_MISSING))
_field_values = st.one_of(
    st.text(max_size=10), st.none(), st.booleans(), _INT32, st.floats(allow_nan=False)
)
_ext_fields = st.one_of(
    st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=6),
    st.dictionaries(st.text(max_size=5), _field_values, max_size=6),
    st.dictionaries(st.text(max_size=3), st.lists(_INT32, max_size=2), max_size=2),
    st.just({}),
    _scalars,
    st.lists(_INT32, max_size=2),
    st.just(_MISSING),
)
_headers = st.fixed_dictionaries(
    {
        "code": _numbers,
        "opaque": _numbers,
        "flag": _numbers,
        "version": _numbers,
        "extFields": _ext_fields,
        "language": st.one_of(st.sampled_from(["JAVA", "CPP", "GO"]), _scalars, st.just(_MISSING)),
        "remark": st.one_of(st.none(), st.text(max_size=8), _scalars, st.just(_MISSING)),
        "serializeTypeCurrentRPC": st.sampled_from(["JSON", _MISSING]),
    }
)


def _frame(header: dict[str, Any], body: bytes) -> bytes:
    data = orjson.dumps({k: v for k, v in header.items() if v is not _MISSING})
    return (
        (4 + len(data) + len(body)).to_bytes(4, "big")
        + len(data).to_bytes(4, "big")
        + (data + body)
    )


def _typed(command: RemotingCommand) -> list[tuple[type, Any]]:
    """Every field with its exact type, so True and 1 (or 1.0 and 1) do not compare equal."""
    values = [
        command.code,
        command.opaque,
        command.flag,
        command.version,
        command.remark,
        command.language,
        command.body,
        command.serialize_type,
        *command.ext_fields.keys(),
        *command.ext_fields.values(),
    ]
    return [(type(value), value) for value in values]


def _careful(stream: bytes) -> RemotingCommand | str:
    header_len = int.from_bytes(stream[4:8], "big")
    try:
        command = frame_module._decode_json_object(orjson.loads(stream[8 : 8 + header_len]))
    except ProtocolError as exc:
        return str(exc)
    command.body = stream[8 + header_len :]
    return command


def _fast(stream: bytes) -> RemotingCommand | str:
    try:
        [command] = FrameDecoder().feed(stream)
    except ProtocolError as exc:
        return str(exc)
    return command


@settings(max_examples=400)
@given(_headers, st.binary(max_size=40))
def test_fast_path_agrees_with_the_careful_path(header: dict[str, Any], body: bytes) -> None:
    stream = _frame(header, body)
    fast, careful = _fast(stream), _careful(stream)
    if isinstance(careful, str) or isinstance(fast, str):
        assert fast == careful  # the same refusal, word for word
    else:
        assert fast == careful
        assert _typed(fast) == _typed(careful)


@pytest.mark.parametrize(
    "header",
    [
        {"code": True, "opaque": 1, "flag": 0, "version": 1, "extFields": {}, "language": "J"},
        {"code": 10.0, "opaque": 1, "flag": 0, "version": 1, "extFields": {}, "language": "J"},
        {"code": "10", "opaque": 1, "flag": 0, "version": 1, "extFields": {}, "language": "J"},
        {"code": 10, "opaque": 1, "flag": 0, "version": 1, "extFields": {"a": 4}, "language": "J"},
        {"code": 10, "opaque": 1, "flag": 0, "version": 1, "extFields": {"a": None}},
        {"code": 10, "opaque": 1, "flag": 0, "version": 1, "extFields": None, "language": 3},
        {"code": 10, "opaque": 2**31, "flag": 0, "version": 1, "extFields": {}, "language": "J"},
        {"code": 10, "opaque": 1, "flag": 0, "version": 1, "extFields": 0, "language": "J"},
        {"code": 10, "opaque": 1, "flag": 0, "version": 1, "extFields": {}, "remark": 5},
        {"code": 10},
    ],
)
def test_unusual_headers_take_the_careful_path(header: dict[str, Any]) -> None:
    stream = _frame(header, b"body")
    fast, careful = _fast(stream), _careful(stream)
    assert fast == careful
    if not isinstance(fast, str):
        assert not isinstance(careful, str)
        assert _typed(fast) == _typed(careful)


def test_a_clients_header_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    command = RemotingCommand(
        code=310, opaque=7, ext_fields={"a": "PG", "b": "T", "d": "4"}, body=b"x" * 10
    )

    def refuse(header: Any) -> RemotingCommand:
        raise AssertionError("the careful path was taken")

    monkeypatch.setattr(frame_module, "_decode_json_object", refuse)
    assert FrameDecoder().feed(encode(command)) == [command]
    command.remark = "a remark"
    assert FrameDecoder().feed(encode(command)) == [command]


def test_a_partial_tail_in_the_buffer_decodes_alike() -> None:
    """A frame completed across two reads is decoded from the bytearray buffer."""
    command = RemotingCommand(
        code=11, opaque=3, ext_fields={"k": "v"}, body=b"y" * 50, serialize_type=SerializeType.JSON
    )
    stream = encode(command)
    decoder = FrameDecoder()
    assert decoder.feed(stream[:30]) == []
    [decoded] = decoder.feed(stream[30:])
    assert decoded == command
    assert type(decoded.body) is bytes
