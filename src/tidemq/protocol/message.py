"""Message-level facts of the protocol: property names and codec, flags, tag hash and filter, enums.

What lives here is shared by the client, the broker and the store, so it is spelled once:

- property names (remoting.md §6.3) and the properties string (§5.3):

      key \\x01 value \\x02 key \\x01 value \\x02 ...        (trailing \\x02 optional on input)

- `SysFlag` (§6.1), `Perm` and `TopicSysFlag` (§6.2);
- the consume-queue tag hash (§5.7): Java `String.hashCode` over UTF-16 code units, signed 32-bit;
- tag expressions ("TagA || TagB", "*") as a `TagFilter` (§4.2);
- the consumer enums of the heartbeat (§4.4) with a lenient parser (ints, digit strings, names).

Message ids, the batch body codec and topic/group names are defined in `message_id`,
`message_batch` and `names` and re-exported here, so `tidemq.protocol.message` is the one import.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Self

from tidemq.errors import ProtocolError
from tidemq.protocol._fields import is_true_text
from tidemq.protocol.message_batch import (
    BatchItem,
    decode_batch,
    decode_batch_raw,
    deflate,
    encode_batch,
    inflate,
)
from tidemq.protocol.message_id import (
    UniqueKeyGenerator,
    decode_offset_msg_id,
    offset_msg_id,
    offset_msg_ids,
)
from tidemq.protocol.names import (
    BENCHMARK_TOPIC,
    CID_RMQ_SYS_PREFIX,
    CLIENT_INNER_PRODUCER_GROUP,
    DEFAULT_CONSUMER_GROUP,
    DEFAULT_PRODUCER_GROUP,
    DLQ_GROUP_TOPIC_PREFIX,
    MASTER_BROKER_ID,
    OFFSET_MOVED_EVENT,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRACE_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC_XXXX,
    SELF_TEST_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    TBW102,
    TRANS_CHECK_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    dlq_topic,
    group_of_retry_topic,
    is_dlq_topic,
    is_retry_topic,
    is_system_topic,
    retry_topic,
    validate_group,
    validate_topic,
)

__all__ = [
    "ARRIVE_TIME",
    "BENCHMARK_TOPIC",
    "BUYER_ID",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "CID_RMQ_SYS_PREFIX",
    "CLIENT_INNER_PRODUCER_GROUP",
    "CLUSTER",
    "CONSUME_START_TIME",
    "CORRECTION_FLAG",
    "CORRELATION_ID",
    "CRC32_PROPERTY",
    "DEFAULT_CONSUMER_GROUP",
    "DEFAULT_PRODUCER_GROUP",
    "DELAY",
    "DLQ_GROUP_TOPIC_PREFIX",
    "EXPRESSION_TYPE_SQL92",
    "EXPRESSION_TYPE_TAG",
    "INSTANCE_ID",
    "KEYS",
    "KEY_SEPARATOR",
    "MASTER_BROKER_ID",
    "MAX_OFFSET",
    "MAX_RECONSUME_TIMES",
    "MIN_OFFSET",
    "MQ2_FLAG",
    "MSG_REGION",
    "MSG_TYPE",
    "NAME_VALUE_SEPARATOR",
    "OFFSET_MOVED_EVENT",
    "ORIGIN_MESSAGE_ID",
    "PGROUP",
    "PROPERTY_SEPARATOR",
    "PUSH_REPLY_TIME",
    "REAL_QID",
    "REAL_TOPIC",
    "RECONSUME_TIME",
    "REPLY_TO_CLIENT",
    "RETRY_GROUP_TOPIC_PREFIX",
    "RETRY_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "SELF_TEST_TOPIC",
    "SHARDING_KEY",
    "SUB_ALL",
    "SYSTEM_TOPIC_PREFIX",
    "TAGS",
    "TBW102",
    "TRACE_ON",
    "TRANSACTION_CHECK_TIMES",
    "TRANSFER_FLAG",
    "TRANS_CHECK_GROUP",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "TRAN_MSG",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "TTL",
    "UNIQ_KEY",
    "WAIT",
    "BatchItem",
    "ConsumeFromWhere",
    "ConsumeType",
    "MessageModel",
    "Perm",
    "SysFlag",
    "TagFilter",
    "TopicSysFlag",
    "UniqueKeyGenerator",
    "add_properties",
    "append_property",
    "decode_batch",
    "decode_batch_raw",
    "decode_offset_msg_id",
    "decode_properties",
    "deflate",
    "dlq_topic",
    "edit_properties",
    "encode_batch",
    "encode_properties",
    "group_of_retry_topic",
    "inflate",
    "is_dlq_topic",
    "is_retry_topic",
    "is_system_topic",
    "is_true_text",
    "java_string_hash",
    "offset_msg_id",
    "offset_msg_ids",
    "parse_tag_expression",
    "properties_are_canonical",
    "remove_canonical_property",
    "retry_topic",
    "strip_property",
    "tag_code",
    "terminated_without",
    "validate_group",
    "validate_topic",
]

# ---------------------------------------------------------------------------------------------
# Property names (MessageConst, §6.3)

KEYS: Final = "KEYS"  # user keys, space-separated (KEY_SEPARATOR); indexed
KEY_SEPARATOR: Final = " "
TAGS: Final = "TAGS"  # one tag; hashed into the consume queue
WAIT: Final = "WAIT"  # "true": the producer waits for the store; dropped before storing
DELAY: Final = "DELAY"  # delay level, 1..18
# RocketMQ 5's delivery-time properties: an absolute time in ms since the epoch, or a delay.
TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
RETRY_TOPIC: Final = "RETRY_TOPIC"  # original topic of a retried message
REAL_TOPIC: Final = "REAL_TOPIC"  # destination while parked in the schedule or half topic
REAL_QID: Final = "REAL_QID"
TRAN_MSG: Final = "TRAN_MSG"  # "true" marks a half message
PGROUP: Final = "PGROUP"  # producer group of a transactional message
# TideMQ: "<sinkId>/<batchId>/<partition>/<attempt>" of a Spark sink half message; such a half
# is resolved by TIDEMQ_END_BATCH and the batch records, never by producer check-back.
SPARK_TXN: Final = "__SPARKTXN#"
MIN_OFFSET: Final = "MIN_OFFSET"  # added client-side on pull
MAX_OFFSET: Final = "MAX_OFFSET"
BUYER_ID: Final = "BUYER_ID"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"  # msgId before the first retry
TRANSFER_FLAG: Final = "TRANSFER_FLAG"
CORRECTION_FLAG: Final = "CORRECTION_FLAG"
MQ2_FLAG: Final = "MQ2_FLAG"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MSG_REGION: Final = "MSG_REGION"
TRACE_ON: Final = "TRACE_ON"
UNIQ_KEY: Final = "UNIQ_KEY"  # client-made message id
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME: Final = "CONSUME_START_TIME"
TRAN_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID: Final = "INSTANCE_ID"
CORRELATION_ID: Final = "CORRELATION_ID"
REPLY_TO_CLIENT: Final = "REPLY_TO_CLIENT"
TTL: Final = "TTL"
ARRIVE_TIME: Final = "ARRIVE_TIME"
PUSH_REPLY_TIME: Final = "PUSH_REPLY_TIME"
CLUSTER: Final = "CLUSTER"  # added by the broker on store
MSG_TYPE: Final = "MSG_TYPE"
SHARDING_KEY: Final = "__SHARDINGKEY"
# TideMQ's whole-record CRC property: the stored record (protocol/record.py) ends with it.
CRC32_PROPERTY: Final = "__CRC32#"

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

# ---------------------------------------------------------------------------------------------
# Properties codec (§5.3)


def encode_properties(props: Mapping[str, str]) -> str:
    """`key\\x01value\\x02` for each pair, with the trailing separator (what 4.x clients send).

    Raises:
        ProtocolError: a key or value contains a separator, or a key or value is empty (it would
            be dropped on decoding, so the map would not survive the trip).
    """
    parts: list[str] = []
    for key, value in props.items():
        if not key or not value:
            raise ProtocolError(f"property {key!r} has an empty key or value")
        for text in (key, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ProtocolError(f"property {key!r} contains a separator character")
        parts.append(f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def decode_properties(text: str) -> dict[str, str]:
    """The map of a properties string, with or without the trailing separator.

    As Java's parser: fragments without a name/value separator are skipped, and so are pairs with
    an empty key or an empty value; a later duplicate key wins. Never raises.
    """
    props: dict[str, str] = {}
    for fragment in text.split(PROPERTY_SEPARATOR):
        key, separator, value = fragment.partition(NAME_VALUE_SEPARATOR)
        if separator and key and value:
            props[key] = value
    return props


# ---------------------------------------------------------------------------------------------
# -- property-string operations (fast paths)
#
# A message's properties travel and are stored as the string; what a handler or the store
# changes in them (drop WAIT, add CLUSTER, ...) is done here. The careful way edits the map and
# re-encodes it; when the string is canonical (what encoding its own map gives back) the same
# result comes by string operations alone, byte for byte. `props` is always
# decode_properties(text), passed in because the caller decoded it already, and is kept equal to
# the result's map.


def properties_are_canonical(text: str, props: Mapping[str, str]) -> bool:
    """Whether `text` is encode_properties(props) (`props` = decode_properties(text)): every
    fragment one distinct `key\x01value\x02` with a non-empty key and value, nothing else."""
    n = len(props)
    return (
        not text or (text[-1] == PROPERTY_SEPARATOR and text.count(PROPERTY_SEPARATOR) == n)
    ) and text.count(NAME_VALUE_SEPARATOR) == n


def remove_canonical_property(text: str, props: dict[str, str], key: str) -> str:
    """Canonical `text` without the property `key` (popped from `props` too); as it was when
    `key` is absent."""
    value = props.pop(key, None)
    if value is None:
        return text
    fragment = f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
    if text.startswith(fragment):
        return text[len(fragment) :]
    # Behind a separator: a fragment of a longer key ("xWAIT") or of a value never matches.
    return text.replace(PROPERTY_SEPARATOR + fragment, PROPERTY_SEPARATOR, 1)


def edit_properties(
    text: str,
    props: dict[str, str],
    remove: str | None,
    add: Mapping[str, str],
    add_text: str | None = None,
) -> str:
    """`text` with the property `remove` (if any) dropped and then `add` set, as
    encode_properties of the edited map gives it; `props` is edited to match. `add_text` is
    encode_properties(add), when the caller holds it.

    By string operations when `text` is canonical and has no key of `add` (what every client
    sends); else the careful way.

    Raises:
        ProtocolError: as encode_properties, for a key or value of `add` it cannot encode.
    """
    if properties_are_canonical(text, props) and add.keys().isdisjoint(props):
        if remove is not None:
            text = remove_canonical_property(text, props, remove)
        props.update(add)
        return text + (encode_properties(add) if add_text is None else add_text)
    if remove is not None:
        props.pop(remove, None)
    props.update(add)
    return encode_properties(props)


def add_properties(text: str, props: dict[str, str], add: Mapping[str, str]) -> str:
    """`text` with `add` set, as encode_properties of the updated map gives it; `props` is
    updated to match. By concatenation when `text` is canonical and has no key of `add`.

    Raises:
        ProtocolError: as encode_properties, for a key or value of `add` it cannot encode.
    """
    return edit_properties(text, props, None, add)


# The operations below work on any properties string, canonical or not, and keep every other
# fragment as it is (the stored record keeps what the client sent, byte for byte).


def append_property(text: str, key: str, value: str) -> str:
    """`text` followed by the pair `key`=`value` (on decoding it wins over an earlier `key`)."""
    if text and text[-1] != PROPERTY_SEPARATOR:
        text += PROPERTY_SEPARATOR
    return f"{text}{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"


def terminated_without(text: str, key: str) -> str:
    """`strip_property(text, key)`, separator-terminated (unless empty): what a writer appends
    its own `key` pair to. The usual case, `key` absent and `text` terminated, costs one test."""
    if key in text:
        return strip_property(text, key)  # rebuilt, so terminated
    if text and text[-1] != PROPERTY_SEPARATOR:
        return text + PROPERTY_SEPARATOR
    return text


def strip_property(text: str, key: str) -> str:
    """`text` without any pair named `key`; as it was when `key` does not occur in it, else
    rebuilt from its non-empty fragments, each separator-terminated."""
    if key not in text:
        return text
    prefix = key + NAME_VALUE_SEPARATOR
    return "".join(
        fragment + PROPERTY_SEPARATOR
        for fragment in text.split(PROPERTY_SEPARATOR)
        if fragment and not fragment.startswith(prefix)
    )


# ---------------------------------------------------------------------------------------------
# Flags (§6.1, §6.2)


class SysFlag:
    """MessageSysFlag bits; `sys_flag & TRANSACTION_MASK` is the transaction type."""

    COMPRESSED: Final = 0x1
    MULTI_TAGS: Final = 0x2
    TRANSACTION_NOT: Final = 0x0
    PREPARED: Final = 0x4
    COMMIT: Final = 0x8
    ROLLBACK: Final = 0xC
    TRANSACTION_MASK: Final = 0xC
    BORNHOST_V6: Final = 0x10
    STOREHOST_V6: Final = 0x20
    # RocketMQ 4.9+/5 name the codec of a COMPRESSED body in bits 8-10; 4.x clients leave them 0,
    # which means zlib.
    COMPRESSION_TYPE_MASK: Final = 0x700
    COMPRESSION_LZ4: Final = 0x100
    COMPRESSION_ZSTD: Final = 0x200
    COMPRESSION_ZLIB: Final = 0x300

    @staticmethod
    def is_zlib_compressed(sys_flag: int) -> bool:
        """The body is a zlib stream: COMPRESSED, with no codec named or zlib named."""
        codec = sys_flag & SysFlag.COMPRESSION_TYPE_MASK
        return bool(sys_flag & SysFlag.COMPRESSED) and codec in (0, SysFlag.COMPRESSION_ZLIB)

    @staticmethod
    def transaction_type(sys_flag: int) -> int:
        return sys_flag & SysFlag.TRANSACTION_MASK

    @staticmethod
    def with_transaction_type(sys_flag: int, transaction_type: int) -> int:
        assert transaction_type & ~SysFlag.TRANSACTION_MASK == 0, transaction_type
        return (sys_flag & ~SysFlag.TRANSACTION_MASK) | transaction_type


class Perm:
    """PermName bits of a topic (normal topics 6, TBW102 7)."""

    PRIORITY: Final = 8
    READ: Final = 4
    WRITE: Final = 2
    INHERIT: Final = 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        return bool(perm & Perm.READ)

    @staticmethod
    def is_writable(perm: int) -> bool:
        return bool(perm & Perm.WRITE)

    @staticmethod
    def is_inherited(perm: int) -> bool:
        return bool(perm & Perm.INHERIT)

    @staticmethod
    def to_text(perm: int) -> str:
        """As Java's PermName.perm2String: "RWX" with "-" for a missing bit ("X" = inherit)."""
        return "".join(
            letter if perm & bit else "-"
            for letter, bit in (("R", Perm.READ), ("W", Perm.WRITE), ("X", Perm.INHERIT))
        )


class TopicSysFlag:
    UNIT: Final = 0x1
    UNIT_SUB: Final = 0x2


# ---------------------------------------------------------------------------------------------
# Tag hash (§5.7) and tag expressions (§4.2)

_UINT32_MASK: Final = 0xFFFFFFFF
_INT32_SIGN: Final = 0x80000000


def java_string_hash(text: str) -> int:
    """Java `String.hashCode()`: sum of c_i·31^(n-1-i) over UTF-16 code units, signed 32-bit."""
    data = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for (unit,) in struct.iter_unpack(">H", data):
        value = (value * 31 + unit) & _UINT32_MASK
    return value - (1 << 32) if value & _INT32_SIGN else value


def tag_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a message's TAGS property (0 when there is no tag)."""
    return java_string_hash(tags) if tags else 0


SUB_ALL: Final = "*"
EXPRESSION_TYPE_TAG: Final = "TAG"
EXPRESSION_TYPE_SQL92: Final = "SQL92"
_TAG_OR: Final = "||"


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed tag expression. `tags` None means every message matches."""

    tags: frozenset[str] | None
    codes: frozenset[int]

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches_code(self, code: int) -> bool:
        """The broker's test on a consume-queue entry's tag hash."""
        return self.tags is None or code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        """The client's second test on the tag string itself (hashes can collide)."""
        return self.tags is None or (tag is not None and tag in self.tags)


_MATCH_ALL: Final = TagFilter(tags=None, codes=frozenset())


def parse_tag_expression(expression: str | None) -> TagFilter:
    """ "*", "" or None → all; else tags split on "||" and stripped, with their Java hashes.

    A "*" inside a list ("TagA || *") is an ordinary tag, as in Java.

    Raises:
        ProtocolError: the expression has separators but no tag ("||").
    """
    if expression is None:
        return _MATCH_ALL
    stripped = expression.strip()
    if not stripped or stripped == SUB_ALL:
        return _MATCH_ALL
    tags = frozenset(tag for part in stripped.split(_TAG_OR) if (tag := part.strip()))
    if not tags:
        raise ProtocolError(f"tag expression {expression!r} names no tag")
    return TagFilter(tags=tags, codes=frozenset(java_string_hash(tag) for tag in tags))


# ---------------------------------------------------------------------------------------------
# Consumer enums (§4.4). C++ sends ordinals, Java and ali-ons names.


_DECIMAL: Final = re.compile(r"[+-]?[0-9]+")


class _LenientEnum(IntEnum):
    @classmethod
    def parse(cls, value: int | str) -> Self:
        """From an int, a digit string ("1") or a member name (any case).

        Raises:
            ProtocolError: the value names no member.
        """
        if isinstance(value, str):
            text = value.strip()
            if _DECIMAL.fullmatch(text):
                return cls._from_int(int(text))
            member = cls.__members__.get(text.upper())
            if member is None:
                raise ProtocolError(f"{cls.__name__}: unknown name {value!r}")
            return member
        if isinstance(value, bool):
            raise ProtocolError(f"{cls.__name__}: a boolean is not a valid value")
        return cls._from_int(value)

    @classmethod
    def _from_int(cls, value: int) -> Self:
        try:
            return cls(value)
        except ValueError:
            raise ProtocolError(f"{cls.__name__}: unknown value {value}") from None


class MessageModel(_LenientEnum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeType(_LenientEnum):
    CONSUME_ACTIVELY = 0  # pull consumer
    CONSUME_PASSIVELY = 1  # push consumer


class ConsumeFromWhere(_LenientEnum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1  # deprecated in Java
    CONSUME_FROM_MIN_OFFSET = 2  # deprecated in Java
    CONSUME_FROM_MAX_OFFSET = 3  # deprecated in Java
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5
