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
from typing import Final, NamedTuple, Protocol, TypeAlias

from tidemq.errors import CorruptRecordError, MessageTooLargeError, ProtocolError
from tidemq.limits import MESSAGE_PROPERTIES_SIZE_MAX, TOPIC_NAME_LENGTH_MAX
from tidemq.protocol.crc import crc32_around
from tidemq.protocol.message import (
    CRC32_PROPERTY,
    NAME_VALUE_SEPARATOR,
    SysFlag,
    decode_properties,
    strip_property,
    terminated_without,
)

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

CRC_PROPERTY: Final = CRC32_PROPERTY
_CRC_KEY_BYTES: Final = f"{CRC_PROPERTY}{NAME_VALUE_SEPARATOR}".encode()
CRC_DIGITS_LEN: Final = 10
# "\x02" before the key (when other properties precede it) + key + "\x01" + digits.
CRC_PROPERTY_SIZE_MAX: Final = 1 + len(_CRC_KEY_BYTES) + CRC_DIGITS_LEN
assert CRC_PROPERTY_SIZE_MAX == 20
_CRC_TAIL_LEN: Final = len(_CRC_KEY_BYTES) + CRC_DIGITS_LEN

_BODY_CRC_MASK: Final = 0x7FFFFFFF  # BODYCRC is a non-negative int32
# sysFlag bits that would make the host fields 20 bytes (we never write them).
_SYSFLAG_HOSTS_V6: Final = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6


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
        return decode_properties(self.properties)


def body_crc(body: bytes) -> int:
    """BODYCRC as RocketMQ computes it: crc32 masked to a non-negative int32."""
    return zlib.crc32(body) & _BODY_CRC_MASK


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
    return strip_property(properties, CRC_PROPERTY)


def encoded_properties_size(properties: str) -> int:
    """PROPERTIESLENGTH the encoder will write for `properties` (the CRC pair included)."""
    return len(properties_prefix(properties)) + CRC_DIGITS_LEN


def properties_prefix(properties: str) -> bytes:
    """The stored PROPERTIES bytes before the CRC digits: `properties` without any CRC pair,
    separator-terminated, then `__CRC32#\x01` (its length plus CRC_DIGITS_LEN is PROPERTIESLENGTH).
    """
    return terminated_without(properties, CRC_PROPERTY).encode() + _CRC_KEY_BYTES


@functools.lru_cache(maxsize=4096)  # a broker serves a few thousand topics at most
def topic_part(topic: str) -> bytes:
    """TOPICLENGTH and TOPIC as stored (the same for every record of a topic, so cached).

    Raises:
        ProtocolError: the topic is empty or longer than 127 UTF-8 bytes.
    """
    topic_bytes = topic.encode()
    if not 0 < len(topic_bytes) <= TOPIC_NAME_LENGTH_MAX:
        raise ProtocolError(f"topic length {len(topic_bytes)} outside 1..{TOPIC_NAME_LENGTH_MAX}")
    return _TOPIC_LEN.pack(len(topic_bytes)) + topic_bytes


class RecordFields(Protocol):
    """What a record takes from its message besides topic, properties and the store's offsets
    and time (the store's MessageToStore has these attributes)."""

    @property
    def body(self) -> bytes: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def flag(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def born_host(self) -> tuple[str, int]: ...
    @property
    def store_host(self) -> tuple[str, int]: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Fields:
    """RecordFields for `encode_record`'s keyword arguments."""

    body: bytes
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int


class PreparedRecord:
    """A record worked out up to what only the writer knows: its queue and physical offsets and
    its store time. Preparing once lets a writer size a run of records (segment fit) before it
    encodes any, and encode each in one pass (`encode`) when the offsets are known.

    Slotted rather than a NamedTuple: built once per stored message, and its attributes are read
    on the store's hot path, where slot reads beat a tuple's index or a NamedTuple's property.
    A writer may subclass it with slots of its own (the store keeps its dispatch data there).
    """

    __slots__ = ("born_ip", "fields", "props_prefix", "size", "store_ip", "topic_part")

    def __init__(self, fields: RecordFields, topic_part: bytes, properties: str) -> None:
        """`topic_part` is `topic_part(topic)` (worked out once per topic by the caller).

        Raises:
            ProtocolError: a host is not IPv4 (nor IPv6 loopback or v4-mapped).
            MessageTooLargeError: the properties, CRC pair included, exceed their int16 field.
        """
        self.fields = fields
        self.topic_part = topic_part
        self.born_ip = pack_ipv4(fields.born_host[0])
        self.store_ip = pack_ipv4(fields.store_host[0])
        # properties_prefix(properties), spelled out: one call less per stored message.
        prefix = terminated_without(properties, CRC_PROPERTY).encode() + _CRC_KEY_BYTES
        self.props_prefix = prefix
        props_len = len(prefix) + CRC_DIGITS_LEN
        if props_len > MESSAGE_PROPERTIES_SIZE_MAX:
            raise MessageTooLargeError(
                f"properties of {props_len} bytes exceed {MESSAGE_PROPERTIES_SIZE_MAX}"
            )
        # The topic part holds TOPICLENGTH's byte, which RECORD_FIXED_SIZE counts already.
        self.size = RECORD_FIXED_SIZE - 1 + len(topic_part) + len(fields.body) + props_len

    def encode(
        self, queue_offset: int, physical_offset: int, store_timestamp: int
    ) -> tuple[bytes, bytes, bytes, bytes]:
        """The record as four pieces to join: header, body, topic and properties, CRC digits."""
        fields = self.fields
        body = fields.body
        body_crc = zlib.crc32(body)  # read once: crc32_around combines it into the record's
        header = RECORD_HEADER.pack(
            self.size,
            MAGIC_RECORD,
            body_crc & _BODY_CRC_MASK,
            fields.queue_id,
            fields.flag,
            queue_offset,
            physical_offset,
            fields.sys_flag & ~_SYSFLAG_HOSTS_V6,
            fields.born_timestamp,
            self.born_ip,
            fields.born_host[1],
            store_timestamp,
            self.store_ip,
            fields.store_host[1],
            fields.reconsume_times,
            fields.prepared_transaction_offset,
            len(body),
        )
        prefix = self.props_prefix
        tail = self.topic_part + _PROPS_LEN.pack(len(prefix) + CRC_DIGITS_LEN) + prefix
        return header, body, tail, b"%010d" % crc32_around(header, body, body_crc, tail)


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
    """The record bytes, ending with a fresh `__CRC32#` property: `PreparedRecord` for one
    record, the same code the store writes with.

    Raises MessageTooLargeError when the properties exceed their int16 field, ProtocolError for a
    topic over 127 bytes or a host that is not IPv4 (or IPv6 loopback / v4-mapped).
    """
    fields = _Fields(
        body=body,
        queue_id=queue_id,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
    )
    prepared = PreparedRecord(fields, topic_part(topic), properties)
    record = b"".join(prepared.encode(queue_offset, physical_offset, store_timestamp))
    assert len(record) == prepared.size
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


def physical_offset_at(buf: Buffer, offset: int = 0) -> int:
    """PHYSICALOFFSET of the record at `offset`, unchecked: for records the store handed out."""
    value: int = _QUEUE_OFFSET.unpack_from(buf, offset + PHYSICAL_OFFSET_POS)[0]
    return value


STORE_TIMESTAMP_SIZE: Final = 8
_STORE_TIMESTAMP: Final = struct.Struct(">q")
assert _STORE_TIMESTAMP.size == STORE_TIMESTAMP_SIZE
# The 4 bytes every record starts its MAGICCODE field with: what a scan for the next record after
# damage looks for.
MAGIC_RECORD_BYTES: Final = struct.pack(">I", MAGIC_RECORD)


def store_timestamp_at(buf: Buffer, offset: int = 0) -> int:
    """STORETIMESTAMP of the record at `offset`, unchecked: for records the store handed out."""
    value: int = _STORE_TIMESTAMP.unpack_from(buf, offset + STORE_TIMESTAMP_POS)[0]
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
    try:
        message, props_raw = _decode_fields(buf, offset, size)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"record at {offset}: {exc}") from None
    if verify_crc:
        if body_crc(message.body) != message.body_crc:
            raise CorruptRecordError(f"body CRC mismatch in record at {offset}")
        _verify_record_crc(buf, offset, offset + size, props_raw, require_crc)
    return message


def _decode_fields(buf: Buffer, offset: int, size: int) -> tuple[StoredMessage, bytes]:
    """The record's fields, and its PROPERTIES bytes (where the CRC property is checked)."""
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
    body, topic, props_raw = _variable_parts(buf, offset, offset + size, body_len)
    message = StoredMessage(
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
        properties=props_raw.decode(),
    )
    return message, props_raw


def _variable_parts(buf: Buffer, offset: int, end: int, body_len: int) -> tuple[bytes, str, bytes]:
    """BODY, TOPIC and the PROPERTIES bytes of the record at `offset`, each length checked
    against the record's end."""
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
            f"properties length {props_len} disagrees with total size {end - offset} at {offset}"
        )
    return body, topic, bytes(buf[pos:end])


def _verify_record_crc(
    buf: Buffer, offset: int, end: int, props_raw: bytes, require_crc: bool
) -> None:
    """Check the whole-record CRC when the record carries it (or must: `require_crc`)."""
    tail = props_raw[-_CRC_TAIL_LEN:]
    if len(tail) == _CRC_TAIL_LEN and tail[:-CRC_DIGITS_LEN] == _CRC_KEY_BYTES:
        digits = tail[-CRC_DIGITS_LEN:]
        with memoryview(buf) as view:
            expected = zlib.crc32(view[offset : end - CRC_DIGITS_LEN])
        if not digits.isdigit() or int(digits) != expected:
            raise CorruptRecordError(f"record CRC mismatch at {offset}")
    elif require_crc:
        raise CorruptRecordError(f"record at {offset} lacks its {CRC_PROPERTY} property")


# RECORD_HEADER's fields a PlacedRecord needs; skipped: 4x FLAG, 16x BORNTIMESTAMP and BORNHOST,
# 20x STOREHOST, RECONSUMETIMES and PREPAREDTRANSACTIONOFFSET.
_PLACE_HEADER: Final = struct.Struct(">iIii4xqqi16xq20xi")
assert _PLACE_HEADER.size == RECORD_HEADER.size
_TOPIC_LENGTH_MAX: Final = 127  # TOPICLENGTH is a signed byte
_PROPS_LENGTH_MAX: Final = 0x7FFF  # PROPERTIESLENGTH a signed int16
# The last bytes of a record that carries its CRC: the property's key, then the digits.
_CRC_TAIL: Final = struct.Struct(f"{len(_CRC_KEY_BYTES)}s{CRC_DIGITS_LEN}s")
assert _CRC_TAIL.size == _CRC_TAIL_LEN


class PlacedRecord(NamedTuple):
    """What `placed_record_at` reads of a record it found whole and valid: where it lies and
    what its dispatch needs (consume queue, index keys, events), nothing else decoded."""

    total_size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    topic: str
    properties: str  # the raw text, `__CRC32#` included


_new_placed: Final = tuple.__new__  # PlacedRecord(...) without its Python-level constructor


def placed_record_at(
    buf: Buffer, offset: int, physical_offset: int, room: int
) -> PlacedRecord | None:
    """The record at `buf[offset]` when it lies there whole, is at most `room` bytes, claims
    `physical_offset`, and passes every check of `decode_record(require_crc=True)` (layout,
    UTF-8 topic and properties, BODYCRC, the whole-record CRC); else None, and the caller asks
    `decode_record` why. For a reader of many records (a slave's append of its master's log):
    no message is built, no body copied. Pass a memoryview or mmap: a bytes `buf` is sliced.
    """
    if len(buf) - offset < RECORD_FIXED_SIZE:
        return None
    (size, magic, crc_of_body, queue_id, queue_offset, claimed, sys_flag, store_ts, body_len) = (
        _PLACE_HEADER.unpack_from(buf, offset)
    )
    end = offset + size
    if (
        magic != MAGIC_RECORD
        or not RECORD_FIXED_SIZE <= size <= room
        or end > len(buf)
        or claimed != physical_offset
        or sys_flag & _SYSFLAG_HOSTS_V6
        or body_len < 0
    ):
        return None
    body_at = offset + BODY_OFFSET
    topic_at = body_at + body_len + 1
    if topic_at + 2 > end:
        return None
    topic_len = buf[topic_at - 1]  # unsigned here: above 127 it is a negative length
    props_at = topic_at + topic_len + 2
    if not 0 < topic_len <= _TOPIC_LENGTH_MAX or props_at > end:
        return None
    props_len = (buf[props_at - 2] << 8) | buf[props_at - 1]  # unsigned: see topic_len
    if not _CRC_TAIL_LEN <= props_len <= _PROPS_LENGTH_MAX or props_at + props_len != end:
        return None
    key, digits = _CRC_TAIL.unpack_from(buf, end - _CRC_TAIL_LEN)
    crc32 = zlib.crc32
    if (
        key != _CRC_KEY_BYTES
        or not digits.isdigit()
        or int(digits) != crc32(buf[offset : end - CRC_DIGITS_LEN])
        or crc32(buf[body_at : topic_at - 1]) & _BODY_CRC_MASK != crc_of_body
    ):
        return None
    try:
        topic = str(buf[topic_at : topic_at + topic_len], "utf-8")
        properties = str(buf[props_at:end], "utf-8")
    except UnicodeDecodeError:
        return None
    return _new_placed(
        PlacedRecord,
        (size, queue_id, queue_offset, claimed, sys_flag, store_ts, topic, properties),
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
