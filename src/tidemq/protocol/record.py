"""The stored-message record: the one definition of its bytes (remoting.md §5.1, §7).

The same bytes are the commit-log record, the body of a PULL answer (records concatenated), and
the body of VIEW_MESSAGE_BY_ID / QUERY_MESSAGE answers, so the layout must match RocketMQ 4.x
exactly. All integers are big-endian; hosts are IPv4 (4 bytes + int32 port), because the C++ and
ali-ons clients cannot parse the 20-byte IPv6 form.

    off  size  field
    ---  ----  ---------------------------------------------------------
      0     4  TOTALSIZE                 whole record, = 91 + n + t + p
      4     4  MAGICCODE                 0xDAA320A7
      8     4  BODYCRC                   crc32(body) & 0x7FFFFFFF
     12     4  QUEUEID
     16     4  FLAG                      user flag
     20     8  QUEUEOFFSET               consume-queue index
     28     8  PHYSICALOFFSET            commit-log offset of this record
     36     4  SYSFLAG                   §6.1 (bits 0x10/0x20 never set: IPv4 only)
     40     8  BORNTIMESTAMP             ms
     48     8  BORNHOST                  IPv4 (4) + port (int32)
     56     8  STORETIMESTAMP            ms
     64     8  STOREHOST                 IPv4 (4) + port (int32)
     72     4  RECONSUMETIMES
     76     8  PREPAREDTRANSACTIONOFFSET
     84     4  BODYLENGTH n  +  n bytes BODY
   88+n     1  TOPICLENGTH t (signed)  +  t bytes TOPIC (UTF-8)
   89+n+t   2  PROPERTIESLENGTH p (int16)  +  p bytes PROPERTIES (UTF-8, k\\x01v\\x02...)

Whole-record integrity. BODYCRC covers only the body, so a torn or flipped header, topic or
property would go unnoticed. The encoder therefore appends one last property

    ... \\x02 __CRC32# \\x01 dddddddddd          (no trailing \\x02; the record ends here)

whose ten decimal digits are zlib.crc32 of every record byte before the digits. The digits are
the last 10 bytes of the record, so a decoder finds them without parsing the properties. Clients
ignore unknown properties and accept a missing trailing separator (Java >= 4.9.3 omits it).
Records made elsewhere may lack the property; then only BODYCRC is checked, unless the caller
(the store, which only reads its own records) demands it with `require_crc=True`.

End of a commit-log segment. When a record plus 8 bytes does not fit in the rest of a segment,
the writer puts an 8-byte blank marker and continues in the next segment:

    +--------------------------+-----------------------------+
    | remaining size: int32    | BLANK_MAGIC 0xCBD43194      |
    +--------------------------+-----------------------------+
"""

from __future__ import annotations

import functools
import ipaddress
import mmap
import struct
import zlib
from dataclasses import dataclass
from typing import Final, TypeAlias

from tidemq.errors import CorruptRecordError, MessageTooLargeError, ProtocolError
from tidemq.limits import MESSAGE_PROPERTIES_SIZE_MAX, TOPIC_NAME_LENGTH_MAX

# Anything the decoders read from: bytes, a pull body's memoryview, or a mapped segment.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

MAGIC_RECORD: Final = 0xDAA320A7
BLANK_MAGIC: Final = 0xCBD43194

# Everything up to and including BODYLENGTH.
RECORD_HEADER: Final = struct.Struct(">iIiiiqqiq4siq4siiqi")
assert RECORD_HEADER.size == 88
# TOTALSIZE + MAGICCODE: enough to tell a record from a blank marker or zeros.
RECORD_HEAD: Final = struct.Struct(">iI")
assert RECORD_HEAD.size == 8
BLANK_MARKER: Final = RECORD_HEAD  # remaining size, BLANK_MAGIC
BLANK_MARKER_SIZE: Final = 8
_TOPIC_LEN: Final = struct.Struct(">b")
_PROPS_LEN: Final = struct.Struct(">h")
_QUEUE_OFFSET: Final = struct.Struct(">q")

# 88 header bytes + 1 topic length + 2 properties length.
RECORD_FIXED_SIZE: Final = 91
BODY_OFFSET: Final = 88
QUEUE_OFFSET_POS: Final = 20
PHYSICAL_OFFSET_POS: Final = 28
STORE_TIMESTAMP_POS: Final = 56

CRC_PROPERTY: Final = "__CRC32#"
_CRC_KEY_BYTES: Final = b"__CRC32#\x01"
CRC_DIGITS_LEN: Final = 10
# "\x02" before the key (when other properties precede it) + key + "\x01" + digits.
CRC_PROPERTY_SIZE_MAX: Final = 1 + len(_CRC_KEY_BYTES) + CRC_DIGITS_LEN
assert CRC_PROPERTY_SIZE_MAX == 20
_CRC_TAIL_LEN: Final = len(_CRC_KEY_BYTES) + CRC_DIGITS_LEN

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

# sysFlag bits that would make the host fields 20 bytes (we never write them).
_SYSFLAG_HOSTS_V6: Final = 0x10 | 0x20


@dataclass(slots=True)
class StoredMessage:
    """One decoded record. `properties` is the raw text, `__CRC32#` included."""

    total_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: str

    def property_map(self) -> dict[str, str]:
        """Properties as a dict; fragments without a separator or with an empty side are skipped."""
        result: dict[str, str] = {}
        for fragment in self.properties.split(PROPERTY_SEPARATOR):
            key, sep, value = fragment.partition(NAME_VALUE_SEPARATOR)
            if sep and key and value:
                result[key] = value
        return result


def body_crc(body: bytes) -> int:
    """BODYCRC as RocketMQ computes it: crc32 masked to a non-negative int32."""
    return zlib.crc32(body) & 0x7FFFFFFF


@functools.lru_cache(maxsize=1024)  # a broker sees few distinct hosts; parsing one costs ~5 µs
def pack_ipv4(host: str) -> bytes:
    """The 4 bytes stored for `host`; IPv6 loopback and v4-mapped addresses map to IPv4."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ProtocolError(f"host {host!r} is not an IP address") from None
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_loopback:
            return b"\x7f\x00\x00\x01"
        mapped = address.ipv4_mapped
        if mapped is None:
            raise ProtocolError(f"host {host!r} is IPv6; stored records carry IPv4 hosts only")
        return mapped.packed
    return address.packed


def _unpack_ipv4(packed: bytes) -> str:
    return f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}"


def strip_crc_property(properties: str) -> str:
    """`properties` without any `__CRC32#` pair (an encoder always writes a fresh one)."""
    if CRC_PROPERTY not in properties:
        return properties
    kept = [
        fragment
        for fragment in properties.split(PROPERTY_SEPARATOR)
        if fragment and not fragment.startswith(CRC_PROPERTY + NAME_VALUE_SEPARATOR)
    ]
    return "".join(fragment + PROPERTY_SEPARATOR for fragment in kept)


def encoded_properties_size(properties: str) -> int:
    """PROPERTIESLENGTH the encoder will write for `properties` (the CRC pair included)."""
    text = strip_crc_property(properties)
    size = len(text.encode())
    if size and not text.endswith(PROPERTY_SEPARATOR):
        size += 1
    return size + _CRC_TAIL_LEN


def properties_prefix(properties: str) -> bytes:
    """The stored PROPERTIES bytes before the CRC digits: `properties` without any CRC pair,
    separator-terminated, then `__CRC32#\x01` (its length plus CRC_DIGITS_LEN is PROPERTIESLENGTH).
    """
    text = strip_crc_property(properties)
    if text and not text.endswith(PROPERTY_SEPARATOR):
        text += PROPERTY_SEPARATOR
    return text.encode() + _CRC_KEY_BYTES


def encode_record(
    *,
    topic: str,
    queue_id: int,
    body: bytes,
    flag: int,
    properties: str,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_timestamp: int,
    store_host: tuple[str, int],
    reconsume_times: int,
    prepared_transaction_offset: int,
    queue_offset: int,
    physical_offset: int,
) -> bytes:
    """The record bytes, ending with a fresh `__CRC32#` property.

    Raises MessageTooLargeError when the properties exceed their int16 field, ProtocolError for a
    topic over 127 bytes or a host that is not IPv4 (or IPv6 loopback / v4-mapped).
    """
    topic_bytes = topic.encode()
    if not 0 < len(topic_bytes) <= TOPIC_NAME_LENGTH_MAX:
        raise ProtocolError(f"topic length {len(topic_bytes)} outside 1..{TOPIC_NAME_LENGTH_MAX}")
    props_prefix = properties_prefix(properties)
    props_len = len(props_prefix) + CRC_DIGITS_LEN
    if props_len > MESSAGE_PROPERTIES_SIZE_MAX:
        raise MessageTooLargeError(
            f"properties of {props_len} bytes exceed {MESSAGE_PROPERTIES_SIZE_MAX}"
        )
    body_len = len(body)
    total = RECORD_FIXED_SIZE + body_len + len(topic_bytes) + props_len
    header = RECORD_HEADER.pack(
        total,
        MAGIC_RECORD,
        body_crc(body),
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag & ~_SYSFLAG_HOSTS_V6,
        born_timestamp,
        pack_ipv4(born_host[0]),
        born_host[1],
        store_timestamp,
        pack_ipv4(store_host[0]),
        store_host[1],
        reconsume_times,
        prepared_transaction_offset,
        body_len,
    )
    parts = [
        header,
        body,
        _TOPIC_LEN.pack(len(topic_bytes)),
        topic_bytes,
        _PROPS_LEN.pack(props_len),
        props_prefix,
    ]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    parts.append(b"%010d" % crc)
    record = b"".join(parts)
    assert len(record) == total
    return record


def record_head_at(buf: Buffer, offset: int) -> tuple[int, int]:
    """(TOTALSIZE or blank remaining size, magic) at `offset`; raises if fewer than 8 bytes."""
    if offset < 0 or offset + RECORD_HEAD.size > len(buf):
        raise CorruptRecordError(f"no record head at {offset}: buffer ends at {len(buf)}")
    size, magic = RECORD_HEAD.unpack_from(buf, offset)
    return size, magic


def queue_offset_at(buf: Buffer, offset: int = 0) -> int:
    """QUEUEOFFSET of the record at `offset`, unchecked: for records the store handed out."""
    value: int = _QUEUE_OFFSET.unpack_from(buf, offset + QUEUE_OFFSET_POS)[0]
    return value


def record_size_at(buf: Buffer, offset: int = 0) -> int:
    """TOTALSIZE of the record at `offset`, after a cheap check of its magic and bounds."""
    size, magic = record_head_at(buf, offset)
    if magic != MAGIC_RECORD:
        raise CorruptRecordError(f"bad magic 0x{magic:08X} at {offset}")
    if size < RECORD_FIXED_SIZE or offset + size > len(buf):
        raise CorruptRecordError(f"record size {size} at {offset} does not fit")
    return size


def check_record(buf: Buffer, offset: int = 0) -> int:
    """Cheap integrity check of one record written by an encoder here; returns its size.

    Verifies magic, bounds and the whole-record CRC (which also covers BODYCRC and the body)
    without decoding fields. Raises CorruptRecordError, also when the CRC property is missing.
    """
    size = record_size_at(buf, offset)
    end = offset + size
    if bytes(buf[end - _CRC_TAIL_LEN : end - CRC_DIGITS_LEN]) != _CRC_KEY_BYTES:
        raise CorruptRecordError(f"record at {offset} lacks its {CRC_PROPERTY} property")
    digits = bytes(buf[end - CRC_DIGITS_LEN : end])
    with memoryview(buf) as view:
        expected = zlib.crc32(view[offset : end - CRC_DIGITS_LEN])
    if not digits.isdigit() or int(digits) != expected:
        raise CorruptRecordError(f"record CRC mismatch at {offset}")
    return size


def decode_record(
    buf: Buffer,
    offset: int = 0,
    *,
    verify_crc: bool = True,
    require_crc: bool = False,
) -> StoredMessage:
    """Decode the record at `offset`. Raises CorruptRecordError on any layout or CRC failure.

    With `verify_crc`, BODYCRC is always checked and the whole-record CRC when present;
    `require_crc` additionally rejects records without it (the store reads only its own).
    """
    size = record_size_at(buf, offset)
    end = offset + size
    try:
        (
            _total,
            _magic,
            crc_of_body,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            born_ip,
            born_port,
            store_timestamp,
            store_ip,
            store_port,
            reconsume_times,
            prepared_transaction_offset,
            body_len,
        ) = RECORD_HEADER.unpack_from(buf, offset)
        if sys_flag & _SYSFLAG_HOSTS_V6:
            raise CorruptRecordError(f"record at {offset} has IPv6 hosts (sysFlag {sys_flag})")
        pos = offset + BODY_OFFSET
        if body_len < 0 or pos + body_len + 3 > end:
            raise CorruptRecordError(f"body length {body_len} overruns record at {offset}")
        body = bytes(buf[pos : pos + body_len])
        pos += body_len
        (topic_len,) = _TOPIC_LEN.unpack_from(buf, pos)
        pos += 1
        if topic_len <= 0 or pos + topic_len + 2 > end:
            raise CorruptRecordError(f"topic length {topic_len} overruns record at {offset}")
        topic = bytes(buf[pos : pos + topic_len]).decode()
        pos += topic_len
        (props_len,) = _PROPS_LEN.unpack_from(buf, pos)
        pos += 2
        if props_len < 0 or pos + props_len != end:
            raise CorruptRecordError(
                f"properties length {props_len} disagrees with total size {size} at {offset}"
            )
        props_raw = bytes(buf[pos:end])
        properties = props_raw.decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"record at {offset}: {exc}") from None
    if verify_crc:
        if body_crc(body) != crc_of_body:
            raise CorruptRecordError(f"body CRC mismatch in record at {offset}")
        tail = props_raw[-_CRC_TAIL_LEN:]
        if len(tail) == _CRC_TAIL_LEN and tail[:-CRC_DIGITS_LEN] == _CRC_KEY_BYTES:
            digits = tail[-CRC_DIGITS_LEN:]
            with memoryview(buf) as view:
                expected = zlib.crc32(view[offset : end - CRC_DIGITS_LEN])
            if not digits.isdigit() or int(digits) != expected:
                raise CorruptRecordError(f"record CRC mismatch at {offset}")
        elif require_crc:
            raise CorruptRecordError(f"record at {offset} lacks its {CRC_PROPERTY} property")
    return StoredMessage(
        total_size=size,
        body_crc=crc_of_body,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=(_unpack_ipv4(born_ip), born_port),
        store_timestamp=store_timestamp,
        store_host=(_unpack_ipv4(store_ip), store_port),
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        body=body,
        topic=topic,
        properties=properties,
    )


def decode_records(buf: Buffer, *, verify_crc: bool = True) -> list[StoredMessage]:
    """Decode a pull body: records back to back, which must fill `buf` exactly."""
    messages: list[StoredMessage] = []
    offset = 0
    while offset < len(buf):
        message = decode_record(buf, offset, verify_crc=verify_crc)
        messages.append(message)
        offset += message.total_size
    return messages


def encode_blank_marker(remaining: int) -> bytes:
    """The end-of-segment marker for a segment with `remaining` bytes left after `offset`."""
    assert remaining >= BLANK_MARKER_SIZE
    return BLANK_MARKER.pack(remaining, BLANK_MAGIC)
