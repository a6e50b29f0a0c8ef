"""Parsing and rendering of extFields, the string map every typed header travels in.

Private to `protocol`: the header modules spell each header's wire names explicitly and use these
two helpers for the conversions, so the leniency rules of remoting.md §1.4 live in one place:

- inbound integers are decimal text ("4", "-1"); the frame decoder has already turned JSON numbers
  into text;
- inbound booleans accept "true"/"1" and "false"/"0" in any case (C++ sends "0"/"1", ali-ons
  JSON booleans, Java "true"/"false");
- an optional integer or boolean sent as "" counts as absent (lenient towards sloppy clients);
- outbound, every value is a string and None means "no key", as Java omits null fields.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from tidemq.errors import ProtocolError

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_TRUE_TEXTS: Final = frozenset({"true", "1"})
_FALSE_TEXTS: Final = frozenset({"false", "0"})
# Java longs are signed 64-bit; a bigger value is a broken peer, not a big offset.
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_INT64_DIGITS_MAX: Final = len(str(_INT64_MAX))  # 19
# Decimal figures that always fit an int64 (10**18 - 1 < 2**63), so the hot path skips the check.
PLAIN_DIGITS_MAX: Final = 18

Scalar = str | int | bool | None  # bool before int: True is an int too


def render(pairs: Mapping[str, Scalar]) -> dict[str, str]:
    """extFields from wire-name → value pairs: None dropped, booleans as "true"/"false"."""
    out: dict[str, str] = {}
    for key, value in pairs.items():
        if value is None:
            continue
        if value is True:
            out[key] = "true"
        elif value is False:
            out[key] = "false"
        else:
            out[key] = str(value)
    return out


def parse_int_text(text: str, *, what: str) -> int:
    """A decimal integer within the signed 64-bit range, else ProtocolError naming `what`."""
    plain = parse_plain_int(text)
    if plain is not None:
        return plain
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise ProtocolError(f"{what} is not an integer: {text!r}")
    # Leading zeros aside, more figures than any int64 has is out of range; checked before int(),
    # which refuses text of over 4300 digits with a ValueError (found by tests/fuzz).
    if len(stripped.lstrip("+-").lstrip("0")) > _INT64_DIGITS_MAX:
        raise ProtocolError(f"{what} is out of the 64-bit range: {text[:40]!r}...")
    value = int(stripped)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ProtocolError(f"{what} is out of the 64-bit range: {text!r}")
    return value


def parse_plain_int(text: str) -> int | None:
    """The hot path of parse_int_text: ASCII digits with an optional "-", at most 18 figures (so
    within int64); None for anything else, which the caller then parses the careful way."""
    digits = text[1:] if text[:1] == "-" else text
    if digits.isdigit() and digits.isascii() and len(digits) <= PLAIN_DIGITS_MAX:
        return int(text)
    return None


# Booleans as clients actually spell them, for the hot path; other spellings take the careful one.
PLAIN_BOOLS: Final = {"true": True, "false": False, "1": True, "0": False}


def parse_bool_text(text: str, *, what: str) -> bool:
    """ "true"/"1" → True, "false"/"0" → False (case-insensitive), else ProtocolError."""
    lowered = text.strip().lower()
    if lowered in _TRUE_TEXTS:
        return True
    if lowered in _FALSE_TEXTS:
        return False
    raise ProtocolError(f"{what} is not a boolean: {text!r}")


def is_true_text(value: str | None) -> bool:
    """Lenient flag reading (TRAN_MSG and the like): True only for "true"/"1" in any case."""
    return value is not None and value.strip().lower() in _TRUE_TEXTS


class FieldReader:
    """Typed access to one header's extFields; errors name the header and the wire field."""

    __slots__ = ("_fields", "_header")

    def __init__(self, header: str, fields: Mapping[str, str]) -> None:
        self._header = header
        self._fields = fields

    def _what(self, name: str) -> str:
        return f"{self._header} field {name!r}"

    def _required(self, name: str) -> str:
        value = self._fields.get(name)
        if value is None:
            raise ProtocolError(f"{self._header} lacks the required field {name!r}")
        return value

    def req_str(self, name: str) -> str:
        return self._required(name)

    def opt_str(self, name: str) -> str | None:
        return self._fields.get(name)

    def opt_str_nonempty(self, name: str) -> str | None:
        """As opt_str, but "" also means absent (C++ sends "" for unused groups)."""
        value = self._fields.get(name)
        return value if value else None

    def req_int(self, name: str) -> int:
        return parse_int_text(self._required(name), what=self._what(name))

    def opt_int(self, name: str) -> int | None:
        value = self._fields.get(name)
        if value is None or not value.strip():
            return None
        return parse_int_text(value, what=self._what(name))

    def int_or(self, name: str, default: int) -> int:
        value = self.opt_int(name)
        return default if value is None else value

    def req_bool(self, name: str) -> bool:
        return parse_bool_text(self._required(name), what=self._what(name))

    def bool_or(self, name: str, default: bool) -> bool:
        value = self._fields.get(name)
        if value is None or not value.strip():
            return default
        return parse_bool_text(value, what=self._what(name))
