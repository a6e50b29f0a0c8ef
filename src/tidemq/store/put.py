"""What a put makes of a message before any I/O: its checks and its record's bytes.

`check_message` refuses what cannot be stored and works out, once, what the record needs: the
stored properties (an explicit tags code kept as `__TAGSCODE#`), their parsed map (the caller's,
when it passed one for this very string), the tags code, the record size, the packed hosts and
the topic as stored (`topic_part`, shared by every message of a topic). `record_parts` then
makes the record as four pieces (header, body, topic and properties, CRC digits) for the store
to join with its neighbours into one write (store/append.py). The bytes are exactly
`protocol.record.encode_record`'s (tests/store/test_batch_fast_path.py and test_put_each.py hold
them to it); this path only skips re-deriving per record what a batch shares.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, TypeAlias

from tidemq.errors import ProtocolError
from tidemq.limits import MESSAGE_PROPERTIES_SIZE_MAX, TOPIC_NAME_LENGTH_MAX
from tidemq.protocol import message as props
from tidemq.protocol import record as rec
from tidemq.store import dispatch as dsp
from tidemq.store.config import StoreConfig
from tidemq.store.types import MessageToStore, PutResult, PutStatus

_TOPIC_LEN: Final = struct.Struct(">b")
_PROPS_LEN: Final = struct.Struct(">h")
_SYSFLAG_HOSTS_V6: Final = props.SysFlag.BORNHOST_V6 | props.SysFlag.STOREHOST_V6
_BODY_CRC_MASK: Final = 0x7FFFFFFF
# The record's int and long fields (Java's int32 / int64): a value outside them cannot be stored.
_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

# A checked message: it, its properties prefix bytes (rec.properties_prefix), parsed properties,
# tags code, record size, packed born and store hosts, topic part (`topic_part`).
Prepared: TypeAlias = tuple[MessageToStore, bytes, dict[str, str], int, int, bytes, bytes, bytes]
# Where the record size sits in a Prepared (the appender reads it to fill segments).
PREPARED_SIZE: Final = 4


def check_topic(topic: str) -> bytes | PutResult:
    """The topic's `topic_part`, or the refusal of a topic that cannot be stored."""
    topic_bytes = topic.encode()
    if not 0 < len(topic_bytes) <= TOPIC_NAME_LENGTH_MAX:
        return PutResult(
            PutStatus.MESSAGE_ILLEGAL,
            error=f"topic length {len(topic_bytes)} outside 1..{TOPIC_NAME_LENGTH_MAX}",
        )
    return topic_part(topic_bytes)


def check_message(msg: MessageToStore, topic: bytes, config: StoreConfig) -> PutResult | Prepared:
    """`msg` prepared for `record_parts`, or the refusal. `topic` is the `topic_part` of
    `msg.topic` (checked by the caller: `check_topic`, once per topic)."""

    def illegal(text: str) -> PutResult:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, error=text)

    if len(msg.body) > config.message_size_max:
        return illegal(f"body {len(msg.body)} bytes exceeds {config.message_size_max}")
    if not (
        _I32_MIN <= msg.flag <= _I32_MAX
        and _I32_MIN <= msg.sys_flag <= _I32_MAX
        and _I32_MIN <= msg.queue_id <= _I32_MAX
        and _I32_MIN <= msg.reconsume_times <= _I32_MAX
        and _I64_MIN <= msg.born_timestamp <= _I64_MAX
        and _I64_MIN <= msg.prepared_transaction_offset <= _I64_MAX
        and (msg.store_timestamp is None or _I64_MIN <= msg.store_timestamp <= _I64_MAX)
    ):
        return illegal(_out_of_range(msg))
    try:
        born_ip = rec.pack_ipv4(msg.born_host[0])
        store_ip = rec.pack_ipv4(msg.store_host[0])
    except ProtocolError as exc:
        return illegal(str(exc))
    text = msg.properties
    parsed = msg.parsed
    if dsp.TAGS_CODE_PROPERTY in text:
        text = dsp.strip_property(text, dsp.TAGS_CODE_PROPERTY)
        parsed = None
    if parsed is not None and parsed[0] is text:
        properties = parsed[1]
    else:
        properties = props.decode_properties(text)
    tags_code = props.tag_code(properties.get(props.TAGS))
    if msg.tags_code is not None and msg.tags_code != tags_code:
        if text and not text.endswith("\x02"):
            text += "\x02"
        text += f"{dsp.TAGS_CODE_PROPERTY}\x01{msg.tags_code}\x02"
        tags_code = msg.tags_code
    props_prefix = rec.properties_prefix(text)
    props_size = len(props_prefix) + rec.CRC_DIGITS_LEN
    if props_size > MESSAGE_PROPERTIES_SIZE_MAX:
        return PutResult(
            PutStatus.PROPERTIES_SIZE_EXCEEDED,
            error=f"properties {props_size} bytes exceed {MESSAGE_PROPERTIES_SIZE_MAX}",
        )
    # The topic part holds TOPICLENGTH's byte, which RECORD_FIXED_SIZE counts already.
    size = rec.RECORD_FIXED_SIZE - 1 + len(topic) + len(msg.body) + props_size
    if size + rec.BLANK_MARKER_SIZE > config.commit_log_file_size:
        return illegal(f"record of {size} bytes does not fit a commit-log segment")
    return msg, props_prefix, properties, tags_code, size, born_ip, store_ip, topic


def _out_of_range(msg: MessageToStore) -> str:
    fields = (
        ("flag", msg.flag, _I32_MIN, _I32_MAX),
        ("sysFlag", msg.sys_flag, _I32_MIN, _I32_MAX),
        ("queueId", msg.queue_id, _I32_MIN, _I32_MAX),
        ("reconsumeTimes", msg.reconsume_times, _I32_MIN, _I32_MAX),
        ("bornTimestamp", msg.born_timestamp, _I64_MIN, _I64_MAX),
        ("preparedTransactionOffset", msg.prepared_transaction_offset, _I64_MIN, _I64_MAX),
        ("storeTimestamp", msg.store_timestamp or 0, _I64_MIN, _I64_MAX),
    )
    for name, value, low, high in fields:
        if not low <= value <= high:
            return f"{name} {value} outside {low}..{high}"
    return "a field is out of range"  # not reached: the caller found one


def topic_part(topic_bytes: bytes) -> bytes:
    """TOPICLENGTH and TOPIC as stored: the same for every record of a batch."""
    return _TOPIC_LEN.pack(len(topic_bytes)) + topic_bytes


def record_parts(
    prepared: Prepared, queue_offset: int, physical_offset: int, store_timestamp: int
) -> tuple[bytes, bytes, bytes, bytes]:
    """The record of a prepared message, as header, body, topic+properties, CRC digits."""
    msg, props_prefix, _properties, _tags_code, size, born_ip, store_ip, topic = prepared
    body = msg.body
    crc32 = zlib.crc32
    header = rec.RECORD_HEADER.pack(
        size,
        rec.MAGIC_RECORD,
        crc32(body) & _BODY_CRC_MASK,
        msg.queue_id,
        msg.flag,
        queue_offset,
        physical_offset,
        msg.sys_flag & ~_SYSFLAG_HOSTS_V6,
        msg.born_timestamp,
        born_ip,
        msg.born_host[1],
        store_timestamp,
        store_ip,
        msg.store_host[1],
        msg.reconsume_times,
        msg.prepared_transaction_offset,
        len(body),
    )
    tail = topic + _PROPS_LEN.pack(len(props_prefix) + rec.CRC_DIGITS_LEN) + props_prefix
    crc = crc32(tail, crc32(body, crc32(header)))
    return header, body, tail, b"%010d" % crc
