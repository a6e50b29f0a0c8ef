"""Java .properties text (the format of RocketMQ's broker.conf) as ordered (key, value) pairs,
and the boolean values such files spell in several ways.

Supported: `key=value`, `key: value` and `key value`; `#` and `!` comment lines; a trailing odd
backslash continues the logical line; escapes \\t \\n \\r \\f, \\uXXXX and backslash-anything.
"""

from __future__ import annotations

from typing import Final

__all__ = ["parse_bool", "parse_properties"]


def parse_properties(text: str) -> list[tuple[str, str]]:
    """Java .properties lines → (key, value) pairs in order (last one wins when applied)."""
    pairs: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        logical = ""
        if key:
            pairs.append((key, value))
    if logical:
        key, value = _split_property(logical)
        if key:
            pairs.append((key, value))
    return pairs


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no, on/off (any case); anything else raises ValueError."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    key_chars: list[str] = []
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line):
            key_chars.append(line[i : i + 2])
            i += 2
            continue
        if ch in "=: \t":
            break
        key_chars.append(ch)
        i += 1
    rest = line[i:].lstrip(" \t")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t")
    return _unescape("".join(key_chars)), _unescape(rest).rstrip()


_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and i + 6 <= len(text):
            try:
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            except ValueError:
                pass
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)
