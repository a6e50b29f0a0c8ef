"""Tolerant JSON reading for request and response bodies (private to `protocol`).

Bodies come from fastjson (Java), jsoncpp (C++) and JavaScript, so readers accept what any of them
writes (remoting.md §3.1, §4.4):

- map keys that are bare numbers, `{0:"127.0.0.1:10911"}` (fastjson, Java ≤ 4.9.3): quoted before
  parsing, on the slow path only, by a regex that steps over string literals so text inside
  strings is never touched;
- map keys that are objects, `{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}` (fastjson's form
  of a map keyed by MessageQueue, e.g. TopicStatsTable.offsetTable): each key object is turned
  into a JSON string holding its text, on the slow path only; readers parse such keys again with
  `load_key_object`. Never eval;
- a trailing "\\n" (C++), which is JSON whitespace anyway;
- integers written as strings ("1795215785519") and booleans as "true"/"1";
- missing keys, which take the field's default.

The slow path (orjson refused the body) costs in proportion to what it must do: orjson's error
position says which key form it met first; bare numeric keys alone (a Java route) take one regex
pass; keys that are flat objects (MessageQueue: no nested object or array) one regex pass that
also quotes numeric keys (`quote_keys`); only keys holding nested containers fall back to the
scanner (`quote_object_keys`), which jumps between structural characters with a regex rather
than stepping byte by byte.

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


# An object with no object or array inside (its strings may hold any character).
_FLAT_OBJECT: Final = rb'\{[^{}\[\]"]*(?:"(?:[^"\\]|\\.)*"[^{}\[\]"]*)*\}'
# A string literal (kept), or a key that is a bare integer (group 2) or a flat object (group 3),
# with what precedes it (group 1) and its colon (group 4). A flat object not followed by a colon
# (an array element) does not match, so it is left alone.
# The first alternative takes a whole run of text that cannot start a key (strings, and any "{"
# or "," not followed by a digit or "{"), so the callback runs about twice per key, not once
# per string literal.
_BARE_KEY: Final = re.compile(
    rb'(?:"(?:[^"\\]|\\.)*"|[^"{,]|[{,](?!\s*[-0-9{]))+'
    rb"|([{,]\s*)(?:(-?[0-9]+)|(" + _FLAT_OBJECT + rb"))(\s*:)",
    re.DOTALL,
)


def _quote_any_key(match: re.Match[bytes]) -> bytes:
    before = match.group(1)
    if before is None:
        return match.group(0)
    number = match.group(2)
    if number is not None:
        return before + b'"' + number + b'"' + match.group(4)
    return before + orjson.dumps(match.group(3).decode("utf-8", "replace")) + match.group(4)


def quote_keys(data: bytes) -> bytes:
    """Bare numeric keys and flat object keys quoted in one pass (see the module docstring)."""
    return _BARE_KEY.sub(_quote_any_key, data)


_QUOTE: Final = 0x22
_OPEN_OBJ: Final = 0x7B
_CLOSE_OBJ: Final = 0x7D
_OPEN_ARR: Final = 0x5B
_CLOSE_ARR: Final = 0x5D
_COLON: Final = 0x3A
_COMMA: Final = 0x2C

# A string literal, a quote that opens no terminated string (a lone `"`), or one structural
# character: what the scanner below stops at.
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|["{}\[\]:,]', re.DOTALL)


def _container_end(data: bytes, start: int) -> int:
    """Index just past the object or array opening at `start` (strings stepped over)."""
    depth = 0
    for match in _TOKEN.finditer(data, start):
        c = data[match.start()]
        if c == _QUOTE:
            if match.end() - match.start() == 1:
                raise ProtocolError("unterminated string in JSON body")
        elif c in (_OPEN_OBJ, _OPEN_ARR):
            depth += 1
        elif c in (_CLOSE_OBJ, _CLOSE_ARR):
            depth -= 1
            if depth == 0:
                return match.end()
    raise ProtocolError("unbalanced JSON body")


def quote_object_keys(data: bytes) -> bytes:
    """`{{"a":1}:2}` → `{"{\\"a\\":1}":2}`: object keys (nested ones too) become strings
    holding their text.

    The stack holds, per open container, whether it is an object now expecting a key. The scan
    jumps from token to token (`_TOKEN`); text between tokens is copied as it is."""
    out: list[bytes] = []
    expecting_key: list[bool | None] = []  # None: an array
    copied = 0
    pos = 0
    n = len(data)
    while pos < n:
        match = _TOKEN.search(data, pos)
        if match is None:
            break
        start = match.start()
        c = data[start]
        pos = match.end()
        if c == _QUOTE:  # a string; or a lone quote, left as it is for orjson to judge
            continue
        if c == _OPEN_OBJ and expecting_key and expecting_key[-1]:
            end = _container_end(data, start)
            out.append(data[copied:start])
            out.append(orjson.dumps(data[start:end].decode("utf-8", "replace")))
            copied = pos = end
            continue
        if c == _OPEN_OBJ:
            expecting_key.append(True)
        elif c == _OPEN_ARR:
            expecting_key.append(None)
        elif c in (_CLOSE_OBJ, _CLOSE_ARR) and expecting_key:
            expecting_key.pop()
        elif c == _COLON and expecting_key and expecting_key[-1] is not None:
            expecting_key[-1] = False
        elif c == _COMMA and expecting_key and expecting_key[-1] is not None:
            expecting_key[-1] = True
    out.append(data[copied:])
    return b"".join(out)


def load_object(data: bytes, what: str) -> dict[str, Any]:
    """The JSON object in `data`, accepting fastjson's bare numeric keys and object keys."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as first:
        value = _load_fastjson(data, what, first.pos)
    return as_object(value, what)


def _load_fastjson(data: bytes, what: str, error_pos: int) -> Any:
    """The slow path of `load_object`: the cheapest rewrite of the keys first (module
    docstring); `error_pos` is where orjson stopped on the original text."""
    rewrites: list[Callable[[bytes], bytes]] = [quote_keys, _quote_all_keys]
    if data[error_pos : error_pos + 1] != b"{":
        rewrites.insert(0, quote_numeric_keys)  # a numeric key came first: maybe all there is
    error: orjson.JSONDecodeError | None = None
    for rewrite in rewrites:
        try:
            return orjson.loads(rewrite(data))
        except orjson.JSONDecodeError as exc:
            error = exc
    raise ProtocolError(f"{what} body is not JSON: {error}") from None


def _quote_all_keys(data: bytes) -> bytes:
    return quote_numeric_keys(quote_object_keys(data))


def load_key_object(key: str, what: str) -> dict[str, Any]:
    """A map key that was an object in fastjson's text (see `quote_object_keys`)."""
    try:
        return as_object(orjson.loads(key), what)
    except orjson.JSONDecodeError:
        raise ProtocolError(f"{what}: key {key[:80]!r} is not a JSON object") from None


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
