"""`inflated_size`, the broker's check of a COMPRESSED body, agrees with the consumer's `inflate`.

The check streams the body a chunk at a time and keeps no output; `inflate` (what a consumer
runs) returns the whole body. For any input they must agree: the same size, or both refuse.
"""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.message_batch import (
    INFLATE_CHECK_CHUNK_BYTES,
    INFLATE_CHECK_INPUT_BYTES,
    inflate,
    inflated_size,
)


def outcome(function: object, body: bytes, size_max: int) -> object:
    assert callable(function)
    try:
        result = function(body, size_max)
    except ProtocolError:
        return "refused"
    return len(result) if isinstance(result, bytes) else result


@given(st.binary(max_size=2_000), st.integers(min_value=0, max_value=3_000))
def test_agrees_with_inflate_on_any_bytes(body: bytes, size_max: int) -> None:
    assert outcome(inflated_size, body, size_max) == outcome(inflate, body, size_max)


@given(
    st.binary(max_size=3_000),
    st.integers(min_value=0, max_value=4_000),
    st.integers(min_value=0, max_value=40),
)
def test_agrees_with_inflate_on_cut_streams(plain: bytes, size_max: int, cut: int) -> None:
    body = zlib.compress(plain)
    body = body[: max(0, len(body) - cut)]
    assert outcome(inflated_size, body, size_max) == outcome(inflate, body, size_max)


def test_bodies_over_several_chunks() -> None:
    plain = bytes(range(256)) * (3 * INFLATE_CHECK_CHUNK_BYTES // 256 + 7)
    body = zlib.compress(plain)
    assert inflated_size(body, len(plain)) == len(plain)
    with pytest.raises(ProtocolError, match=f"exceeds {len(plain) - 1} bytes"):
        inflated_size(body, len(plain) - 1)
    with pytest.raises(ProtocolError, match="truncated"):
        inflated_size(body[: len(body) // 2], len(plain))


@pytest.mark.parametrize("cut", [0, 1, 5, INFLATE_CHECK_INPUT_BYTES, -1])
def test_incompressible_bodies_over_several_input_steps(cut: int) -> None:
    """Input is fed a step at a time too: bodies of several steps, whole, cut at and around a
    step's boundary, or with bytes after the stream (ignored, as `inflate` ignores them)."""
    plain = random.Random(cut).randbytes(3 * INFLATE_CHECK_INPUT_BYTES + 123)
    body = zlib.compress(plain, 1)
    assert len(body) > 3 * INFLATE_CHECK_INPUT_BYTES
    if cut == -1:
        body += b"trailing bytes"
    elif cut:
        body = body[: 3 * INFLATE_CHECK_INPUT_BYTES - cut + 1]
    for size_max in (len(plain), len(plain) - 1, 2 * INFLATE_CHECK_INPUT_BYTES):
        assert outcome(inflated_size, body, size_max) == outcome(inflate, body, size_max)
