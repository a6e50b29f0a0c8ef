"""Tolerant JSON reading for request and response bodies (private to `protocol`).

Bodies come from fastjson (Java), jsoncpp (C++) and JavaScript, so readers accept what any of them
writes (remoting.md §3.1, §4.4):

- map keys that are bare numbers, `{0:"127.0.0.1:10911"}` (fastjson, Java ≤ 4.9.3): quoted before
  parsing, on the slow path only, by a regex that steps over string literals so text inside
  strings is never touched;
- a trailing "\\n" (C++), which is JSON whitespace anyway;
- integers written as strings ("1795215785519") and booleans as "true"/"1";
- missing keys, which take the field's default.

Every failure is a ProtocolError naming the body and the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import orjson

from tidemq.errors import ProtocolError
from tidemq.protocol._fields import parse_bool_text, parse_int_text

T = TypeVar("T")

# A string literal (kept as is) or an object key that is a bare integer (group 1: what precedes
# it, group 2: the number, group 3: the colon with its leading whitespace).
_BARE_NUMERIC_KEY: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?[0-9]+)(\s*:)', re.DOTALL)


def _quote_key(match: re.Match[bytes]) -> bytes:
    if match.group(1) is None:
        return match.group(0)
    return match.group(1) + b'"' + match.group(2) + b'"' + match.group(3)


def quote_numeric_keys(data: bytes) -> bytes:
    """`{0:"a"}` → `{"0":"a"}`, leaving string literals alone."""
    return _BARE_NUMERIC_KEY.sub(_quote_key, data)


def load_object(data: bytes, what: str) -> dict[str, Any]:
    """The JSON object in `data`, accepting fastjson's bare numeric keys."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            value = orjson.loads(quote_numeric_keys(data))
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"{what} body is not JSON: {exc}") from None
    return as_object(value, what)


def load_list(data: bytes, what: str) -> list[Any]:
    """The JSON array in `data`."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    return as_list(value, what)


def dump(value: Any) -> bytes:
    """Standard JSON; orjson refuses non-string keys, so writers quote map keys themselves."""
    return orjson.dumps(value)


def as_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return value


def as_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{what} is not a JSON array")
    return value


def to_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ProtocolError(f"{what} is a boolean, not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return parse_int_text(value, what=what)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ProtocolError(f"{what} is not an integer: {value!r}")


def to_str(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ProtocolError(f"{what} is not a string: {value!r}")


def to_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return parse_bool_text(value, what=what)
    raise ProtocolError(f"{what} is not a boolean: {value!r}")


def to_float(value: Any, what: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ProtocolError(f"{what} is not a number: {value!r}")


class ObjectReader:
    """Typed, defaulting access to the keys of one decoded JSON object."""

    __slots__ = ("_obj", "_what")

    def __init__(self, value: Any, what: str) -> None:
        self._obj = as_object(value, what)
        self._what = what

    def _key(self, key: str) -> str:
        return f"{self._what}.{key}"

    def _present(self, key: str) -> Any:
        return self._obj.get(key)

    def raw(self, key: str, default: Any = None) -> Any:
        """The undecoded value at `key` (`default` when missing or null)."""
        value = self._obj.get(key)
        return default if value is None else value

    def required(self, key: str) -> Any:
        value = self._obj.get(key)
        if value is None:
            raise ProtocolError(f"{self._what} lacks {key!r}")
        return value

    def req_str(self, key: str) -> str:
        return to_str(self.required(key), self._key(key))

    def str_or(self, key: str, default: str) -> str:
        value = self._present(key)
        return default if value is None else to_str(value, self._key(key))

    def opt_str(self, key: str) -> str | None:
        value = self._present(key)
        return None if value is None else to_str(value, self._key(key))

    def int_or(self, key: str, default: int) -> int:
        value = self._present(key)
        if value is None or value == "":
            return default
        return to_int(value, self._key(key))

    def req_int(self, key: str) -> int:
        return to_int(self.required(key), self._key(key))

    def bool_or(self, key: str, default: bool) -> bool:
        value = self._present(key)
        if value is None or value == "":
            return default
        return to_bool(value, self._key(key))

    def float_or(self, key: str, default: float) -> float:
        value = self._present(key)
        return default if value is None else to_float(value, self._key(key))

    def list_of(self, key: str, item: Callable[[Any, str], T]) -> list[T]:
        """The array at `key` mapped through `item(value, what)`; missing or null → []."""
        value = self._present(key)
        if value is None:
            return []
        what = self._key(key)
        return [
            item(element, f"{what}[{index}]") for index, element in enumerate(as_list(value, what))
        ]

    def map_of(self, key: str, item: Callable[[Any, str], T]) -> dict[str, T]:
        """The object at `key` with values mapped through `item`; missing or null → {}."""
        value = self._present(key)
        if value is None:
            return {}
        what = self._key(key)
        return {
            str(name): item(element, f"{what}[{name!r}]")
            for name, element in as_object(value, what).items()
        }
