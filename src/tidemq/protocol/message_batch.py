"""The batch send body (remoting.md §5.4) and the zlib helpers of §5.5.

A batch request (code 320, or code 10 with batch "1" from C++) carries its messages concatenated:

    +----------------+--------------+-------------+-------------+-------------+------+
    | total_size:i32 | magic: i32=0 | body_crc:=0 | flag: i32   | body_len:i32| body |
    +----------------+--------------+-------------+-------------+-------------+------+
    | props_len: i16 | properties (UTF-8, §5.3)                                      |
    +----------------+---------------------------------------------------------------+
      total_size = 20 + body_len + 2 + props_len

The decoder reads field by field and ignores total_size, magic and body_crc, as Java's does
(clients are not consistent about them). C++ 1.2.3 may zlib the whole batch body and set the
outer COMPRESSED flag: `inflate` it before `decode_batch`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tidemq.errors import ProtocolError
from tidemq.limits import FRAME_SIZE_MAX, MESSAGE_PROPERTIES_SIZE_MAX

_ITEM_HEAD: Final = struct.Struct(">iiiii")  # total_size, magic, body_crc, flag, body_len
assert _ITEM_HEAD.size == 20
_PROPS_LEN: Final = struct.Struct(">h")
assert _PROPS_LEN.size == 2
# What C++ and Java clients use.
DEFLATE_LEVEL_DEFAULT: Final = 5


@dataclass(frozen=True, slots=True)
class BatchItem:
    flag: int
    body: bytes
    properties: str  # raw properties string (§5.3)


def encode_batch(items: Sequence[BatchItem]) -> bytes:
    """The batch body of `items` (magic and CRC zero, as clients send them).

    Raises:
        ProtocolError: an item's properties exceed the int16 length field.
    """
    parts: list[bytes] = []
    for item in items:
        props = item.properties.encode()
        if len(props) > MESSAGE_PROPERTIES_SIZE_MAX:
            raise ProtocolError(
                f"batch item properties of {len(props)} bytes exceed {MESSAGE_PROPERTIES_SIZE_MAX}"
            )
        total_size = _ITEM_HEAD.size + len(item.body) + _PROPS_LEN.size + len(props)
        parts.append(_ITEM_HEAD.pack(total_size, 0, 0, item.flag, len(item.body)))
        parts.append(item.body)
        parts.append(_PROPS_LEN.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def decode_batch(body: bytes) -> list[BatchItem]:
    """The items of a (plain) batch body.

    Raises:
        ProtocolError: a truncated item, a negative length or properties that are not UTF-8.
    """
    return [BatchItem(flag, data, properties) for flag, data, properties in decode_batch_raw(body)]


def decode_batch_raw(body: bytes) -> list[tuple[int, bytes, str]]:
    """`decode_batch` as (flag, body, properties) tuples: the broker's hot path, no objects."""
    items: list[tuple[int, bytes, str]] = []
    view = memoryview(body)
    position = 0
    end = len(body)
    while position < end:
        if end - position < _ITEM_HEAD.size:
            raise ProtocolError(f"batch item at {position} is truncated in its header")
        _total, _magic, _crc, flag, body_len = _ITEM_HEAD.unpack_from(view, position)
        position += _ITEM_HEAD.size
        if body_len < 0 or end - position < body_len + _PROPS_LEN.size:
            raise ProtocolError(f"batch item body length {body_len} at {position} overruns")
        item_body = bytes(view[position : position + body_len])
        position += body_len
        (props_len,) = _PROPS_LEN.unpack_from(view, position)
        position += _PROPS_LEN.size
        if props_len < 0 or end - position < props_len:
            raise ProtocolError(f"batch item properties length {props_len} at {position} overruns")
        try:
            properties = str(view[position : position + props_len], "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"batch item properties are not UTF-8: {exc}") from None
        position += props_len
        items.append((flag, item_body, properties))
    return items


def deflate(body: bytes, level: int = DEFLATE_LEVEL_DEFAULT) -> bytes:
    """zlib (RFC 1950) compression, as bodies with the COMPRESSED sys flag carry."""
    return zlib.compress(body, level)


def inflate(body: bytes, size_max: int = FRAME_SIZE_MAX) -> bytes:
    """Undo `deflate`, refusing output over `size_max` bytes (a small body can inflate hugely).

    Raises:
        ProtocolError: not a complete zlib stream, or the output exceeds size_max.
    """
    decompressor = zlib.decompressobj()
    try:
        data = decompressor.decompress(body, size_max + 1)
    except zlib.error as exc:
        raise ProtocolError(f"body is not zlib data: {exc}") from None
    if len(data) > size_max or decompressor.unconsumed_tail:
        raise ProtocolError(f"inflated body exceeds {size_max} bytes")
    if not decompressor.eof:
        raise ProtocolError("zlib body is truncated")
    return data


# Output bytes per step of `inflated_size`: the check holds this much, not the whole body.
INFLATE_CHECK_CHUNK_BYTES: Final = 256 * 1024
# Input bytes per step of `inflated_size`. zlib hands back the input a step did not consume as a
# new bytes object (`unconsumed_tail`); fed the whole body at once, each step copied the rest of
# it, quadratic in the body: 3.5 ms instead of 1.8 ms for a 4 MiB incompressible body.
INFLATE_CHECK_INPUT_BYTES: Final = 64 * 1024


def inflated_size(body: bytes, size_max: int) -> int:
    """The size `inflate(body, size_max)` would return, without holding the inflated body: the
    broker checks every COMPRESSED body it is sent this way (a body that does not inflate would
    stop every consumer of its queue), so the check costs no more memory than a chunk.

    Raises:
        ProtocolError: as `inflate` (not zlib data, truncated, or more than size_max bytes).
    """
    decompressor = zlib.decompressobj()
    size = 0
    view = memoryview(body)
    try:
        for start in range(0, len(view), INFLATE_CHECK_INPUT_BYTES):
            pending: bytes | memoryview = view[start : start + INFLATE_CHECK_INPUT_BYTES]
            while pending and not decompressor.eof:
                size += len(decompressor.decompress(pending, INFLATE_CHECK_CHUNK_BYTES))
                if size > size_max:
                    raise ProtocolError(f"inflated body exceeds {size_max} bytes")
                pending = decompressor.unconsumed_tail
            if decompressor.eof:
                break
    except zlib.error as exc:
        raise ProtocolError(f"body is not zlib data: {exc}") from None
    if not decompressor.eof:
        raise ProtocolError("zlib body is truncated")
    return size
