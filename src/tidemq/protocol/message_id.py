"""Message ids (remoting.md §5.6): the broker's offsetMsgId and the client's UNIQ_KEY.

offsetMsgId, made by the broker and decodable by anyone (clients take the commit-log offset from
it for END_TRANSACTION and send-back):

    +-------------------------+----------------+---------------------------+
    | store host IP (4 or 16) | port: int32 BE | commit-log offset: int64  |   → upper-case hex
    +-------------------------+----------------+---------------------------+
      32 hex characters for IPv4, 56 for IPv6

UNIQ_KEY, made by the producer and opaque to the server; TideMQ follows Java's layout:

    +------------+-------------+-----------------+-----------------------------+---------------+
    | IPv4 (4)   | pid: int16  | instance: int32 | ms since month start: int32 | counter: int16|
    +------------+-------------+-----------------+-----------------------------+---------------+
      32 hex characters; the counter makes ids unique within a process and millisecond.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from tidemq.errors import ProtocolError

_PORT_OFFSET: Final = struct.Struct(">iq")
assert _PORT_OFFSET.size == 12
_PORT: Final = struct.Struct(">i")
_UNIQ_PREFIX: Final = struct.Struct(">4sHI")
assert _UNIQ_PREFIX.size == 10
_UNIQ_SUFFIX: Final = struct.Struct(">IH")
assert _UNIQ_SUFFIX.size == 6
_OFFSET_MSG_ID_V4_LENGTH: Final = 32
_OFFSET_MSG_ID_V6_LENGTH: Final = 56


def offset_msg_id(host: str, port: int, physical_offset: int) -> str:
    """The offsetMsgId of the record at `physical_offset` on the broker at host:port.

    Raises:
        ProtocolError: `host` is not an IP address literal.
    """
    return (_packed_host(host) + _PORT_OFFSET.pack(port, physical_offset)).hex().upper()


def offset_msg_ids(host: str, port: int, physical_offsets: Iterable[int]) -> list[str]:
    """`offset_msg_id` of each offset (one host and port): the prefix is made once.

    Raises:
        ProtocolError: `host` is not an IP address literal.
    """
    prefix = (_packed_host(host) + _PORT.pack(port)).hex().upper()
    return [f"{prefix}{offset:016X}" for offset in physical_offsets]


@functools.lru_cache(maxsize=1024)  # one broker address per call site; parsing costs ~5 µs
def _packed_host(host: str) -> bytes:
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        raise ProtocolError(f"offsetMsgId needs an IP address, not {host!r}") from None


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(host, port, physical offset) of an offsetMsgId (IPv4: 32 hex chars, IPv6: 56).

    Raises:
        ProtocolError: wrong length or not hexadecimal.
    """
    if len(msg_id) not in (_OFFSET_MSG_ID_V4_LENGTH, _OFFSET_MSG_ID_V6_LENGTH):
        raise ProtocolError(f"offsetMsgId {msg_id!r} has {len(msg_id)} characters, not 32 or 56")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ProtocolError(f"offsetMsgId {msg_id!r} is not hexadecimal") from None
    ip_length = len(raw) - _PORT_OFFSET.size
    host = str(ipaddress.ip_address(raw[:ip_length]))
    port, physical_offset = _PORT_OFFSET.unpack_from(raw, ip_length)
    return host, port, physical_offset


_PHYSICAL_OFFSET: Final = struct.Struct(">q")


def physical_offset_of(msg_id: str) -> int:
    """`decode_offset_msg_id(msg_id)[2]` without making the host's text: the producer ends
    every transaction with it (END_TRANSACTION's commitLogOffset). An id of the usual form is
    read directly; anything else takes decode_offset_msg_id, with its errors.

    Raises:
        ProtocolError: as decode_offset_msg_id.
    """
    if len(msg_id) in (_OFFSET_MSG_ID_V4_LENGTH, _OFFSET_MSG_ID_V6_LENGTH) and msg_id.isalnum():
        try:
            raw = bytes.fromhex(msg_id)
        except ValueError:
            pass
        else:
            offset: int = _PHYSICAL_OFFSET.unpack_from(raw, len(raw) - _PHYSICAL_OFFSET.size)[0]
            return offset
    return decode_offset_msg_id(msg_id)[2]


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """[start, end) of the UTC calendar month holding now_ms, in ms since the epoch."""
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        end = start.replace(year=start.year + 1, month=1)
    else:
        end = start.replace(month=start.month + 1)
    return int(start.timestamp() * 1000), int(end.timestamp() * 1000)


class UniqueKeyGenerator:
    """Makes UNIQ_KEY values for one producer process. Not thread-safe (one event loop).

    Args:
        ip: the client's IP; an IPv6 address contributes its last four bytes.
        pid: the process id (its low 16 bits are used).
        instance: distinguishes generators within one process (Java uses a class-loader hash).
    """

    __slots__ = ("_counter", "_month_end_ms", "_month_start_ms", "_prefix")

    def __init__(self, ip: str, pid: int, instance: int = 0) -> None:
        try:
            packed = ipaddress.ip_address(ip).packed[-4:]
        except ValueError:
            raise ProtocolError(f"UNIQ_KEY needs an IP address, not {ip!r}") from None
        self._prefix = _UNIQ_PREFIX.pack(packed, pid & 0xFFFF, instance & 0xFFFFFFFF)
        self._counter = 0
        self._month_start_ms = 0
        self._month_end_ms = 0

    def next(self, now_ms: int) -> str:
        """A fresh 32-character upper-case hex id."""
        if not self._month_start_ms <= now_ms < self._month_end_ms:
            self._month_start_ms, self._month_end_ms = _month_bounds_ms(now_ms)
        self._counter = (self._counter + 1) & 0xFFFF
        elapsed_ms = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        return (self._prefix + _UNIQ_SUFFIX.pack(elapsed_ms, self._counter)).hex().upper()
