"""The property-string operations the store and the transaction path use (protocol/message.py):
`strip_property`, `terminated_without` and `append_property` keep every other fragment as sent,
whatever the string; `add_properties` equals the careful decode, update and encode of the map."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol.message import (
    add_properties,
    append_property,
    decode_properties,
    encode_properties,
    strip_property,
    terminated_without,
)

CRC = "__CRC32#"
TAGS_CODE = "__TAGSCODE#"

# Fragments clients send, and the odd ones a string may still hold: empty sides, a longer key
# that starts with the one stripped, no trailing separator.
_PIECE = st.sampled_from(
    [
        f"{k}\x01{v}\x02"
        for k in ("TAGS", CRC, TAGS_CODE, "a", f"x{CRC}", f"{CRC}x")
        for v in ("1", "v")
    ]
    + ["a\x01\x02", "\x01v\x02", "noseparator\x02", "\x02", f"{CRC}\x02", f"a\x01{CRC}\x02"]
)
_TEXT = st.lists(_PIECE, max_size=6).map("".join) | st.lists(_PIECE, max_size=6).map(
    lambda pieces: "".join(pieces).rstrip("\x02")
)
_VALUE = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("", CRC, ""),
        ("a\x011\x02", CRC, "a\x011\x02"),  # key absent: the very string
        ("a\x011", CRC, "a\x011"),
        (f"a\x011\x02{CRC}\x01123\x02b\x012", CRC, "a\x011\x02b\x012\x02"),
        (f"{CRC}\x011\x02{CRC}\x012\x02", CRC, ""),
        (f"x{CRC}\x011\x02{CRC}x\x012\x02{CRC}\x013", CRC, f"x{CRC}\x011\x02{CRC}x\x012\x02"),
        (f"a\x01{CRC}\x02\x02\x02", CRC, f"a\x01{CRC}\x02"),  # a value naming it stays
    ],
)
def test_strip_property(text: str, key: str, expected: str) -> None:
    assert strip_property(text, key) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("a\x011\x02", "a\x011\x02"),
        ("a\x011", "a\x011\x02"),
        (f"a\x011\x02{CRC}\x019\x02", "a\x011\x02"),
        (f"{CRC}\x019", ""),
    ],
)
def test_terminated_without(text: str, expected: str) -> None:
    assert terminated_without(text, CRC) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", f"{TAGS_CODE}\x017\x02"),
        ("a\x011\x02", f"a\x011\x02{TAGS_CODE}\x017\x02"),
        ("a\x011", f"a\x011\x02{TAGS_CODE}\x017\x02"),
    ],
)
def test_append_property(text: str, expected: str) -> None:
    assert append_property(text, TAGS_CODE, "7") == expected


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, key=st.sampled_from([CRC, TAGS_CODE, "a"]), value=_VALUE)
def test_string_operations_agree_with_the_map(text: str, key: str, value: str) -> None:
    props = decode_properties(text)
    without = {k: v for k, v in props.items() if k != key}
    stripped = strip_property(text, key)
    assert decode_properties(stripped) == without
    assert f"\x02{key}\x01" not in "\x02" + stripped
    terminated = terminated_without(text, key)
    assert terminated == (stripped + "\x02" if stripped and stripped[-1] != "\x02" else stripped)
    assert decode_properties(append_property(stripped, key, value)) == {**without, key: value}
    # Every other fragment is kept as sent, in order.
    kept = [f for f in text.split("\x02") if f and not f.startswith(f"{key}\x01")]
    assert [f for f in terminated.split("\x02") if f] == kept


@settings(max_examples=300, deadline=None)
@given(
    text=_TEXT | st.dictionaries(_VALUE, _VALUE, max_size=4).map(encode_properties),
    add=st.dictionaries(st.sampled_from(["REAL_TOPIC", "REAL_QID", "PGROUP", "a"]), _VALUE),
)
def test_add_properties_equals_the_careful_encoding(text: str, add: dict[str, str]) -> None:
    props = decode_properties(text)
    expected = {**props, **add}
    assert add_properties(text, props, add) == encode_properties(expected)
    assert props == expected


@pytest.mark.parametrize(
    ("text", "add", "expected"),
    [
        ("a\x011\x02", {"b": "2"}, "a\x011\x02b\x012\x02"),  # canonical: concatenated
        ("a\x011\x02", {"a": "2", "b": "3"}, "a\x012\x02b\x013\x02"),  # a key again: re-encoded
        ("a\x011", {"b": "2"}, "a\x011\x02b\x012\x02"),  # not canonical: re-encoded
        ("junk\x02a\x011\x02", {"b": "2"}, "a\x011\x02b\x012\x02"),
        ("", {"b": "2"}, "b\x012\x02"),
    ],
)
def test_add_properties(text: str, add: dict[str, str], expected: str) -> None:
    props = decode_properties(text)
    assert add_properties(text, props, add) == expected
    assert props == decode_properties(expected)
