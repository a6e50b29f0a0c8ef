"""What a put makes of a message before any I/O: the store's checks, then its prepared record.

`check_message` refuses what the store cannot take (a body over the configured size, a field
outside its int32/int64, a record that fits no commit-log segment) and works out, once, what
the append needs: the stored properties (an explicit tags code kept as `__TAGSCODE#`), their
parsed map (the caller's, when it passed one for this very string), the tags code, and the
record prepared by its owner, `protocol.record.PreparedRecord` (sizes, packed hosts, the topic
as stored: `check_topic`, shared by every message of a topic). The appender
(store/append.py) encodes each with its offsets and joins a segment's run into one write.
"""

from __future__ import annotations

from typing import Final

from tidemq.errors import MessageTooLargeError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import (
    TAGS,
    append_property,
    decode_properties,
    strip_property,
    tag_code,
)
from tidemq.store.config import StoreConfig
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.types import MessageToStore, PutResult, PutStatus

# The record's int and long fields (Java's int32 / int64): a value outside them cannot be stored.
_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_BLANK_MARKER_SIZE: Final = rec.BLANK_MARKER_SIZE  # a segment ends with one: a record leaves room


class Prepared(rec.PreparedRecord):
    """A checked message's record, with what dispatch needs of it: the message (`fields`), its
    parsed properties and its consume-queue tags code (set by `check_message` right after the
    record is prepared)."""

    __slots__ = ("properties", "tags_code")
    fields: MessageToStore
    properties: dict[str, str]
    tags_code: int


def check_topic(topic: str) -> bytes | PutResult:
    """The topic as stored (`rec.topic_part`), or the refusal of a topic that cannot be."""
    try:
        return rec.topic_part(topic)
    except ProtocolError as exc:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, error=str(exc))


def check_message(msg: MessageToStore, topic: bytes, config: StoreConfig) -> PutResult | Prepared:
    """`msg` prepared for the appender, or the refusal. `topic` is the `rec.topic_part` of
    `msg.topic` (checked by the caller: `check_topic`, once per topic)."""
    if len(msg.body) > config.message_size_max:
        return _illegal(f"body {len(msg.body)} bytes exceeds {config.message_size_max}")
    if not (
        _I32_MIN <= msg.flag <= _I32_MAX
        and _I32_MIN <= msg.sys_flag <= _I32_MAX
        and _I32_MIN <= msg.queue_id <= _I32_MAX
        and _I32_MIN <= msg.reconsume_times <= _I32_MAX
        and _I64_MIN <= msg.born_timestamp <= _I64_MAX
        and _I64_MIN <= msg.prepared_transaction_offset <= _I64_MAX
        and (msg.store_timestamp is None or _I64_MIN <= msg.store_timestamp <= _I64_MAX)
    ):
        return _illegal(_out_of_range(msg))
    text = msg.properties
    parsed = msg.parsed
    if TAGS_CODE_PROPERTY in text:
        text = strip_property(text, TAGS_CODE_PROPERTY)
        parsed = None
    properties = parsed[1] if parsed is not None and parsed[0] is text else decode_properties(text)
    tags_code = tag_code(properties.get(TAGS))
    if msg.tags_code is not None and msg.tags_code != tags_code:
        text = append_property(text, TAGS_CODE_PROPERTY, str(msg.tags_code))
        tags_code = msg.tags_code
    try:
        prepared = Prepared(msg, topic, text)
    except ProtocolError as exc:
        return _illegal(str(exc))
    except MessageTooLargeError as exc:
        return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED, error=str(exc))
    if prepared.size + _BLANK_MARKER_SIZE > config.commit_log_file_size:
        return _illegal(f"record of {prepared.size} bytes does not fit a commit-log segment")
    prepared.properties = properties
    prepared.tags_code = tags_code
    return prepared


def _illegal(text: str) -> PutResult:
    return PutResult(PutStatus.MESSAGE_ILLEGAL, error=text)


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
