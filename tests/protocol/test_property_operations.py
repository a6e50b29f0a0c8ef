"""The property-string operations of protocol/message.py: each equals the careful decode, edit
and encode of the map, byte for byte, whatever the string (canonical or not)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.message import (
    CLUSTER,
    WAIT,
    decode_properties,
    edit_properties,
    encode_properties,
    properties_are_canonical,
    remove_canonical_property,
)

_PIECE = st.sampled_from(
    ["TAGS", "KEYS", WAIT, CLUSTER, "a", "", "x\x01y", "v", "\x01", "\x02"]
    + [f"{k}\x01{v}\x02" for k in (WAIT, "TAGS", "a", "xWAIT") for v in ("true", "WAIT", "1")]
    + ["a\x01\x02", f"\x02{WAIT}\x01true", f"{CLUSTER}\x01c\x02"]
)


def _careful(text: str, extra: dict[str, str]) -> tuple[str, dict[str, str]]:
    props = decode_properties(text)
    props.pop(WAIT, None)
    props.update(extra)
    return encode_properties(props), props


@settings(max_examples=400)
@given(pieces=st.lists(_PIECE, max_size=12), extra_value=st.sampled_from(["C1", "DefaultCluster"]))
def test_edit_equals_decode_edit_encode(pieces: list[str], extra_value: str) -> None:
    text = "".join(pieces)
    extra = {CLUSTER: extra_value, "OUTER": "o"}
    props = decode_properties(text)
    try:
        want_text, want_props = _careful(text, extra)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            edit_properties(text, props, WAIT, extra)
        return
    got = edit_properties(text, props, WAIT, extra)
    assert got == want_text
    assert props == want_props
    assert list(props) == list(want_props)
    assert properties_are_canonical(got, props)


@settings(max_examples=400)
@given(pieces=st.lists(_PIECE, max_size=12))
def test_canonical_means_encoding_gives_it_back(pieces: list[str]) -> None:
    text = "".join(pieces)
    props = decode_properties(text)
    try:
        encoded = encode_properties(props)
    except ProtocolError:  # a separator inside a key or value: never canonical
        assert not properties_are_canonical(text, props)
        return
    assert properties_are_canonical(text, props) == (encoded == text)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("WAIT\x01true\x02TAGS\x01t\x02", WAIT, "TAGS\x01t\x02"),
        ("TAGS\x01t\x02WAIT\x01false\x02", WAIT, "TAGS\x01t\x02"),
        ("TAGS\x01WAIT\x02WAIT\x01true\x02a\x01b\x02", WAIT, "TAGS\x01WAIT\x02a\x01b\x02"),
        ("xWAIT\x01true\x02TAGS\x01t\x02WAIT\x01true\x02", WAIT, "xWAIT\x01true\x02TAGS\x01t\x02"),
        ("TAGS\x01t\x02", WAIT, "TAGS\x01t\x02"),
        ("", WAIT, ""),
    ],
)
def test_remove_cuts_only_the_whole_fragment(text: str, key: str, expected: str) -> None:
    props = decode_properties(text)
    assert remove_canonical_property(text, props, key) == expected
    assert props == decode_properties(expected)


def test_canonical_text_takes_the_string_way() -> None:
    text = "TAGS\x01t\x02UNIQ_KEY\x01u\x02"
    props = decode_properties(text)
    # The add_text passed in is used as given: proof that no re-encoding happened.
    got = edit_properties(text, props, WAIT, {CLUSTER: "c"}, "CLUSTER\x01c\x02")
    assert got == text + "CLUSTER\x01c\x02"
    assert props == {"TAGS": "t", "UNIQ_KEY": "u", CLUSTER: "c"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("WAIT\x01true\x02TAGS\x01t\x02", "TAGS\x01t\x02CLUSTER\x01c\x02"),
        ("TAGS\x01t\x02WAIT\x01false\x02", "TAGS\x01t\x02CLUSTER\x01c\x02"),
        ("TAGS\x01t", "TAGS\x01t\x02CLUSTER\x01c\x02"),  # no trailing separator: careful way
        ("TAGS\x01t\x02CLUSTER\x01old\x02", "TAGS\x01t\x02CLUSTER\x01c\x02"),  # key of `add`
        ("a\x01\x02TAGS\x01t\x02", "TAGS\x01t\x02CLUSTER\x01c\x02"),  # an empty value dropped
    ],
)
def test_edit_gives_hand_written_results(text: str, expected: str) -> None:
    props = decode_properties(text)
    assert edit_properties(text, props, WAIT, {CLUSTER: "c"}) == expected
    assert props == decode_properties(expected)
