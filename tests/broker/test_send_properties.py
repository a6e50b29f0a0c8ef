"""stored_properties: the string fast path must equal the careful decode/edit/encode exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.broker.handlers.send import stored_properties
from tidemq.errors import ProtocolError
from tidemq.protocol.message import CLUSTER, WAIT, decode_properties, encode_properties

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
def test_fast_path_matches_careful(pieces: list[str], extra_value: str) -> None:
    text = "".join(pieces)
    extra = {CLUSTER: extra_value, "OUTER": "o"}
    props = decode_properties(text)
    try:
        want_text, want_props = _careful(text, extra)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            stored_properties(text, props, extra)
        return
    got = stored_properties(text, props, extra)
    assert got == want_text
    assert props == want_props
    assert list(props) == list(want_props)


def test_canonical_text_takes_the_fast_path() -> None:
    text = "TAGS\x01t\x02UNIQ_KEY\x01u\x02"
    props = decode_properties(text)
    got = stored_properties(text, props, {CLUSTER: "c"}, "CLUSTER\x01c\x02")
    assert got == text + "CLUSTER\x01c\x02"
    assert props == {"TAGS": "t", "UNIQ_KEY": "u", CLUSTER: "c"}


def test_wait_is_cut_out_wherever_it_stands() -> None:
    for text in (
        "WAIT\x01true\x02TAGS\x01t\x02",
        "TAGS\x01t\x02WAIT\x01false\x02",
        "TAGS\x01WAIT\x02WAIT\x01true\x02a\x01b\x02",
        "xWAIT\x01true\x02TAGS\x01t\x02WAIT\x01true\x02",
    ):
        props = decode_properties(text)
        want_text, want_props = _careful(text, {CLUSTER: "c"})
        assert stored_properties(text, props, {CLUSTER: "c"}) == want_text
        assert props == want_props
