"""Byte-level mutations of a valid structure, drawn by Hypothesis.

A fuzz case starts from bytes an encoder made (so every length agrees and every check passes) and
applies a few edits. Random bytes alone rarely get past a decoder's first length check; edits of a
valid structure reach the checks behind it. The builder names where the structure's integer
fields lie (`Sample.fields`: offset and width), so the commonest edit puts an extreme value there:
a length that is zero, negative, one past the end, or 2**31 - 1.

    Sample(data, fields) ──draw ops──▶ [IntField | Flip | Insert | Delete | Truncate | BadUtf8]
                          ──apply──▶ mutated bytes
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from hypothesis import strategies as st

# Invalid UTF-8: a lone continuation byte, an overlong NUL, a truncated 3-byte sequence, a UTF-16
# surrogate encoded as UTF-8 (CESU), a byte above F4, and a code point above U+10FFFF.
BAD_UTF8: Final = (b"\x80", b"\xc0\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xff", b"\xf4\x90\x80\x80")

# Extreme values for an integer field of `width` bytes, before masking to the width.
INT_EXTREMES: Final = (0, 1, -1, 2**7 - 1, 2**15 - 1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1)

# Edits per case: enough to break two fields at once, few enough to leave most structure valid.
MUTATIONS_MAX: Final = 4


@dataclass(frozen=True, slots=True)
class Sample:
    """Valid bytes, and where their integer fields (lengths, counts) lie: (offset, width)."""

    data: bytes
    fields: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class IntField:
    """Overwrite integer field `index` (modulo the field count) with `value` (or len±delta)."""

    index: int
    value: int
    relative: bool  # value is added to the field's current value (off-by-one lengths)


@dataclass(frozen=True, slots=True)
class Flip:
    position: int
    bit: int


@dataclass(frozen=True, slots=True)
class Insert:
    position: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    position: int
    count: int


@dataclass(frozen=True, slots=True)
class Truncate:
    keep: int


@dataclass(frozen=True, slots=True)
class BadUtf8:
    position: int
    sequence: bytes


Mutation = IntField | Flip | Insert | Delete | Truncate | BadUtf8

_positions = st.integers(0, 2**16)
mutations: st.SearchStrategy[Mutation] = st.one_of(
    st.builds(
        IntField,
        st.integers(0, 255),
        st.sampled_from(INT_EXTREMES) | st.integers(-(2**31), 2**31 - 1),
        st.just(False),
    ),
    st.builds(IntField, st.integers(0, 255), st.integers(-3, 3), st.just(True)),
    st.builds(Flip, _positions, st.integers(0, 7)),
    st.builds(Insert, _positions, st.binary(min_size=1, max_size=16)),
    st.builds(Delete, _positions, st.integers(1, 16)),
    st.builds(Truncate, _positions),
    st.builds(BadUtf8, _positions, st.sampled_from(BAD_UTF8)),
)
mutation_lists = st.lists(mutations, min_size=1, max_size=MUTATIONS_MAX)


def _write_int(data: bytearray, offset: int, width: int, value: int, relative: bool) -> None:
    if offset + width > len(data):
        return
    if relative:
        value += int.from_bytes(data[offset : offset + width], "big", signed=True)
    data[offset : offset + width] = (value % (1 << (8 * width))).to_bytes(width, "big")


def apply(sample: Sample, edits: Sequence[Mutation]) -> bytes:
    """`sample.data` with `edits` applied in order (positions taken modulo the current length;
    field offsets are the sample's, so an earlier insert or delete shifts what they hit)."""
    data = bytearray(sample.data)
    for edit in edits:
        size = len(data)
        if isinstance(edit, IntField):
            if sample.fields:
                offset, width = sample.fields[edit.index % len(sample.fields)]
                _write_int(data, offset, width, edit.value, edit.relative)
        elif isinstance(edit, Flip):
            if size:
                data[edit.position % size] ^= 1 << edit.bit
        elif isinstance(edit, Insert | BadUtf8):
            inserted = edit.data if isinstance(edit, Insert) else edit.sequence
            at = edit.position % (size + 1)
            data[at:at] = inserted
        elif isinstance(edit, Delete):
            if size:
                at = edit.position % size
                del data[at : at + edit.count]
        else:
            del data[edit.keep % (size + 1) :]
    return bytes(data)
