"""index_keys' shortcut for messages without KEYS gives what the general rule gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.protocol import message as props
from tidemq.store.dispatch import index_keys


def _general(properties: dict[str, str]) -> list[str]:
    """The rule spelled out: KEYS split on spaces (empty keys skipped), then UNIQ_KEY."""
    keys = [k for k in properties.get(props.KEYS, "").split(" ") if k]
    uniq = properties.get(props.UNIQ_KEY)
    if uniq and uniq not in keys:
        keys.append(uniq)
    return keys


@given(
    st.dictionaries(
        st.sampled_from([props.KEYS, props.UNIQ_KEY, props.TAGS]),
        st.sampled_from(["", " ", "a", "a b", " a  b ", "U1", "a U1"]) | st.text(max_size=6),
    )
)
def test_index_keys_follow_the_general_rule(properties: dict[str, str]) -> None:
    assert index_keys(properties) == _general(properties)
