"""SendMessageRequestHeader.from_fields, the one parser of the send header (fast branch included).

Every map is checked against a hand-written model of remoting.md §1.4's leniency (`_expected`),
and what parses round-trips through `to_fields` in both spellings. The inputs are the plain
values clients send and the near misses a careless fast branch would get wrong.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.headers_send import SEND_V1_KEYS, SEND_V2_KEYS

_V1 = list(SEND_V1_KEYS)
_V2 = list(SEND_V2_KEYS)
# Plain values and the near misses a careless fast path would get wrong.
_NUMBER_TEXTS = ["0", "4", "17", "1700000000000", "-1", "+3", " 5", "5 ", "", "x", "²", "1_0"]
_NUMBER_TEXTS += ["9" * 18, "9" * 19, "٣", "9223372036854775808"]
_BOOL_TEXTS = ["true", "false", "1", "0", "TRUE", "", "yes", " true"]
_NUMBERS = st.sampled_from(_NUMBER_TEXTS)
_BOOLS = st.sampled_from(_BOOL_TEXTS)
_TEXTS = st.sampled_from(["", "PG", "TopicA", "TBW102", "UNIQ_KEY\x01u\x02WAIT\x01true\x02"])
_KINDS = ["text", "text", "text", "int", "int", "int", "int", "int", "text", "int", "bool", "int"]
_KINDS += ["bool", "text"]
_VALUES = {"text": _TEXTS, "int": _NUMBERS, "bool": _BOOLS}
_RARE = {"maxReconsumeTimes", "l"}
_FIELD_NAMES = [
    "producer_group",
    "topic",
    "default_topic",
    "default_topic_queue_nums",
    "queue_id",
    "sys_flag",
    "born_timestamp",
    "flag",
    "properties",
    "reconsume_times",
    "unit_mode",
    "max_reconsume_times",
    "batch",
    "broker_name",
]
_REQUIRED = {0, 1, 2, 3, 4, 5, 6, 7}  # positions in the V2 alphabet Java marks required


# What a Java producer sends, as a header.
_CLIENT_HEADER = SendMessageRequestHeader(
    producer_group="PG",
    topic="T",
    queue_id=3,
    born_timestamp=1_700_000_000_000,
    properties="UNIQ_KEY\x01u\x02",
    broker_name="broker-a",
)


@st.composite
def _fields(draw: st.DrawFn) -> dict[str, str]:
    names = draw(st.sampled_from([_V1, _V2]))
    fields: dict[str, str] = {}
    for name, kind in zip(names, _KINDS, strict=True):
        # Mostly plain values and mostly present, so the fast branch is taken often; clients
        # send maxReconsumeTimes only to retry topics.
        if draw(st.integers(0, 9)) == 0 or (name in _RARE and draw(st.integers(0, 4))):
            continue
        plain = {"text": "T", "int": "7", "bool": "false"}[kind]
        fields[name] = draw(_VALUES[kind]) if draw(st.integers(0, 5)) == 0 else plain
    return fields


def _model_int(text: str) -> int:
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", stripped, re.ASCII):
        raise ProtocolError(text)
    value = int(stripped)
    if not -(2**63) <= value < 2**63:
        raise ProtocolError(text)
    return value


def _model_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "1", "false", "0"):
        raise ProtocolError(text)
    return lowered in ("true", "1")


def _expected(fields: dict[str, str]) -> dict[str, object] | type[ProtocolError]:
    """The header's fields by the rules of §1.4, written out independently of the parser."""
    names = _V2 if "a" in fields and "producerGroup" not in fields else _V1
    values: dict[str, object] = {}
    try:
        for position, (name, kind) in enumerate(zip(names, _KINDS, strict=True)):
            text = fields.get(name)
            field = _FIELD_NAMES[position]
            if text is None or (position not in _REQUIRED and kind != "text" and not text.strip()):
                if position in _REQUIRED:
                    return ProtocolError
                values[field] = {9: 0, 10: False, 11: None, 12: False}.get(position)
            elif kind == "int":
                values[field] = _model_int(text)
            elif kind == "bool":
                values[field] = _model_bool(text)
            else:
                values[field] = text
    except ProtocolError:
        return ProtocolError
    values["broker_name"] = values["broker_name"] or None
    return values


def _check(fields: dict[str, str]) -> None:
    expected = _expected(fields)
    if expected is ProtocolError:
        with pytest.raises(ProtocolError):
            SendMessageRequestHeader.from_fields(fields)
        return
    header = SendMessageRequestHeader.from_fields(fields)
    assert {name: getattr(header, name) for name in _FIELD_NAMES} == expected
    for v2 in (False, True):
        assert SendMessageRequestHeader.from_fields(header.to_fields(v2=v2)) == header


@given(_fields())
def test_parse_matches_the_rules_and_round_trips(fields: dict[str, str]) -> None:
    _check(fields)


@pytest.mark.parametrize("names", [_V1, _V2], ids=["v1", "v2"])
def test_each_field_near_miss(names: list[str]) -> None:
    # Every odd value in every field, the others plain: each near miss meets the fast branch.
    plain = {"text": "T", "int": "7", "bool": "false"}
    base = {n: plain[k] for n, k in zip(names, _KINDS, strict=True) if n not in _RARE}
    for name, kind in zip(names, _KINDS, strict=True):
        texts = {"int": _NUMBER_TEXTS, "bool": _BOOL_TEXTS, "text": ["", "x"]}[kind]
        for text in texts:
            _check({**base, name: text})
        _check({k: v for k, v in base.items() if k != name})
    _check(base)


def test_what_a_client_sends_parses_to_hand_written_values() -> None:
    fields = {
        "a": "PG",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "3",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "UNIQ_KEY\x01u\x02",
        "j": "0",
        "k": "false",
        "m": "false",
        "n": "broker-a",
    }
    header = SendMessageRequestHeader.from_fields(fields)
    assert header == _CLIENT_HEADER
    assert header.to_fields(v2=True) == fields
    assert list(header.to_fields(v2=True)) == list(fields)


def test_what_clients_send_takes_the_fast_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    header = _CLIENT_HEADER

    def refuse(fields: object) -> None:
        raise AssertionError("the careful parser was called")

    monkeypatch.setattr(SendMessageRequestHeader, "_from_fields_careful", refuse)
    for v2 in (True, False):
        assert SendMessageRequestHeader.from_fields(header.to_fields(v2=v2)) == header
