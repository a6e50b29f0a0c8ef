"""The send handler's header fast path agrees with SendMessageRequestHeader.from_fields: the same
fields for every map, or the same ProtocolError."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.handlers.send_header import SendHeader, parse_send_header
from tidemq.errors import ProtocolError
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.headers_send import SEND_V1_KEYS, SEND_V2_KEYS

_V1 = list(SEND_V1_KEYS)
_V2 = list(SEND_V2_KEYS)
# Plain values and the near misses a careless fast path would get wrong.
_NUMBER_TEXTS = ["0", "4", "17", "1700000000000", "-1", "+3", " 5", "5 ", "", "x", "²", "1_0"]
_NUMBER_TEXTS += ["9" * 18, "9" * 19, "٣"]
_BOOL_TEXTS = ["true", "false", "1", "0", "TRUE", "", "yes"]
_NUMBERS = st.sampled_from(_NUMBER_TEXTS)
_BOOLS = st.sampled_from(_BOOL_TEXTS)
_TEXTS = st.sampled_from(["", "PG", "TopicA", "TBW102", "UNIQ_KEY\x01u\x02WAIT\x01true\x02"])
_KINDS = ["text", "text", "text", "int", "int", "int", "int", "int", "text", "int", "bool", "int"]
_KINDS += ["bool", "text"]
_VALUES = {"text": _TEXTS, "int": _NUMBERS, "bool": _BOOLS}
_RARE = {"maxReconsumeTimes", "l"}


@st.composite
def _fields(draw: st.DrawFn) -> dict[str, str]:
    names = draw(st.sampled_from([_V1, _V2]))
    fields: dict[str, str] = {}
    for name, kind in zip(names, _KINDS, strict=True):
        # Mostly plain values and mostly present, so the fast path is taken often; clients send
        # maxReconsumeTimes only to retry topics.
        if draw(st.integers(0, 9)) == 0 or (name in _RARE and draw(st.integers(0, 4))):
            continue
        plain = {"text": "T", "int": "7", "bool": "false"}[kind]
        fields[name] = draw(_VALUES[kind]) if draw(st.integers(0, 5)) == 0 else plain
    return fields


def _careful(fields: dict[str, str]) -> SendHeader | type[ProtocolError]:
    try:
        header = SendMessageRequestHeader.from_fields(fields)
    except ProtocolError:
        return ProtocolError
    return SendHeader(**{f.name: getattr(header, f.name) for f in dataclasses.fields(header)})


def _agree(fields: dict[str, str]) -> None:
    expected = _careful(fields)
    if expected is ProtocolError:
        with pytest.raises(ProtocolError):
            parse_send_header(fields)
    else:
        assert parse_send_header(fields) == expected


@given(_fields())
def test_fast_path_agrees_with_the_careful_parser(fields: dict[str, str]) -> None:
    _agree(fields)


@pytest.mark.parametrize("names", [_V1, _V2], ids=["v1", "v2"])
def test_each_field_near_miss_agrees(names: list[str]) -> None:
    # Every odd value in every field, the others plain: each near miss meets the fast path.
    plain = {"text": "T", "int": "7", "bool": "false"}
    base = {n: plain[k] for n, k in zip(names, _KINDS, strict=True) if n not in _RARE}
    for name, kind in zip(names, _KINDS, strict=True):
        texts = {"int": _NUMBER_TEXTS, "bool": _BOOL_TEXTS, "text": ["", "x"]}[kind]
        for text in texts:
            _agree({**base, name: text})
        _agree({k: v for k, v in base.items() if k != name})
    assert parse_send_header(base) == _careful(base)  # and the plain map itself


def test_what_clients_send_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        queue_id=3,
        born_timestamp=1_700_000_000_000,
        properties="UNIQ_KEY\x01u\x02",
        broker_name="broker-a",
    )

    def refuse(fields: object) -> None:
        raise AssertionError("the careful parser was called")

    monkeypatch.setattr(SendMessageRequestHeader, "from_fields", refuse)
    for v2 in (True, False):
        parsed = parse_send_header(header.to_fields(v2=v2))
        assert (parsed.topic, parsed.queue_id, parsed.broker_name) == ("T", 3, "broker-a")
