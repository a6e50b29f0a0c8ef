"""Typed headers of sending and pulling (remoting.md §4.1, §4.2; transactions: headers_tx.py).

Conventions for every header module (`headers` re-exports them all): a frozen dataclass per header
with snake_case fields; `to_fields()` renders the wire's extFields map (every value a string, None
fields omitted) and `from_fields()` parses it, raising ProtocolError naming the missing or invalid
wire field. Wire names are spelled out in each pair of methods (no reflection), so a grep for a
wire name finds its one definition. Inbound parsing is lenient as §1.4 requires (see `_fields`):
"0"/"1" booleans, numbers as text, "" for optional numbers. Fields Java marks required are
required inbound; the rest default.

The send path (one request and one answer per message) has its fast paths here, behind the
careful names: `SendMessageRequestHeader.from_fields` reads the plain form every client sends
without a helper call per field, `send_fields_v2` is a producer's `to_fields(v2=True)` without
the header object, and `send_response_fields` is the one spelling of the answer's fields (the
frame module's `encode_send_success` makes the whole SUCCESS frame of them from a template).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntFlag
from typing import Final, Self

from tidemq.limits import PULL_SUSPEND_MS_DEFAULT
from tidemq.protocol._fields import (
    PLAIN_DIGITS_MAX,
    FieldReader,
    parse_plain_int,
    render,
)
from tidemq.protocol.names import TBW102

DEFAULT_TOPIC: Final = TBW102
# What every target client sends as defaultTopicQueueNums (§4.1).
DEFAULT_TOPIC_QUEUE_NUMS: Final = 4
# Extra response fields Java adds to every send response; clients ignore them but expect them.
MSG_REGION_DEFAULT: Final = "DefaultRegion"
TRACE_ON_DEFAULT: Final = "true"

# ---------------------------------------------------------------------------------------------
# SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320): §4.1

# (V1 long name, V2 letter) in the order of the V2 alphabet, which is the header's field order.
_SEND_NAMES: Final = (
    ("producerGroup", "a"),
    ("topic", "b"),
    ("defaultTopic", "c"),
    ("defaultTopicQueueNums", "d"),
    ("queueId", "e"),
    ("sysFlag", "f"),
    ("bornTimestamp", "g"),
    ("flag", "h"),
    ("properties", "i"),
    ("reconsumeTimes", "j"),
    ("unitMode", "k"),
    ("maxReconsumeTimes", "l"),
    ("batch", "m"),
    ("bname", "n"),
)
# The wire names in the header's field order, per spelling.
SEND_V1_KEYS: Final = tuple(v1 for v1, _ in _SEND_NAMES)
SEND_V2_KEYS: Final = tuple(v2 for _, v2 in _SEND_NAMES)
_GROUP_V1, _GROUP_V2 = _SEND_NAMES[0]
# The letter of each field, for send_fields_v2's dict display.
(
    _V2_PRODUCER_GROUP,
    _V2_TOPIC,
    _V2_DEFAULT_TOPIC,
    _V2_DEFAULT_TOPIC_QUEUE_NUMS,
    _V2_QUEUE_ID,
    _V2_SYS_FLAG,
    _V2_BORN_TIMESTAMP,
    _V2_FLAG,
    _V2_PROPERTIES,
    _V2_RECONSUME_TIMES,
    _V2_UNIT_MODE,
    _,  # maxReconsumeTimes: a producer's send has none
    _V2_BATCH,
    _V2_BROKER_NAME,
) = SEND_V2_KEYS
# Booleans as every client spells them in a send header; "1"/"0", "TRUE" go the careful way.
_PLAIN_WORDS: Final = {"true": True, "false": False}
_BOOL_TEXTS: Final = ("false", "true")  # indexed by the bool
_new: Final = object.__new__


def is_v2_send(fields: Mapping[str, str]) -> bool:
    """Whether a send header is spelled in V2 letters: "producerGroup" absent, "a" present."""
    return _GROUP_V2 in fields and _GROUP_V1 not in fields


def _send_fields(names: tuple[str, ...], values: tuple[str | None, ...]) -> dict[str, str]:
    """extFields of a send header: `names` paired with `values` in order, None values omitted."""
    return {name: value for name, value in zip(names, values, strict=True) if value is not None}


@dataclass(slots=True, kw_only=True)
class SendMessageRequestHeader:
    """The send header; one class for the long V1 names and the V2 single letters.

    Not frozen, unlike the other headers: one is built per message, and a frozen dataclass of
    fourteen fields costs several times a plain slotted one to build (each field goes through
    object.__setattr__). Nothing keeps or hashes it; treat it as read-only.
    """

    producer_group: str
    topic: str
    default_topic: str = DEFAULT_TOPIC
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS
    queue_id: int
    sys_flag: int = 0
    born_timestamp: int
    flag: int = 0
    properties: str | None = None
    reconsume_times: int = 0
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False
    broker_name: str | None = None

    def to_fields(self, *, v2: bool = False) -> dict[str, str]:
        """extFields with the long names, or with the letters a..n when `v2` (codes 310/320)."""
        max_reconsume_times = self.max_reconsume_times
        values = (
            self.producer_group,
            self.topic,
            self.default_topic,
            str(self.default_topic_queue_nums),
            str(self.queue_id),
            str(self.sys_flag),
            str(self.born_timestamp),
            str(self.flag),
            self.properties,
            str(self.reconsume_times),
            _BOOL_TEXTS[self.unit_mode],
            None if max_reconsume_times is None else str(max_reconsume_times),
            _BOOL_TEXTS[self.batch],
            self.broker_name,
        )
        return _send_fields(SEND_V2_KEYS if v2 else SEND_V1_KEYS, values)

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        """Parse either spelling: V2 when "producerGroup" is absent and the letter "a" present.

        The request code does not decide it: C++ sends long names with code 10, Java and ali-ons
        letters with 310/320, and a client could mix them up without harm. What every client
        sends is read by `_from_plain_fields` (one header per message); anything else by
        `_from_fields_careful`, which also names what is wrong.
        """
        keys = SEND_V2_KEYS if is_v2_send(fields) else SEND_V1_KEYS
        header = cls._from_plain_fields(fields, keys)
        return header if header is not None else cls._from_fields_careful(fields)

    @classmethod
    def _from_plain_fields(cls, fields: Mapping[str, str], keys: tuple[str, ...]) -> Self | None:
        """The header of the plain form (decimal digits, "true"/"false", no maxReconsumeTimes),
        with no helper call per field; None for anything else (a negative or padded number, "1"
        for true, a missing field, maxReconsumeTimes: send-back's retries)."""
        (
            group_key,
            topic_key,
            default_topic_key,
            nums_key,
            queue_id_key,
            sys_flag_key,
            born_key,
            flag_key,
            properties_key,
            reconsume_key,
            unit_mode_key,
            max_reconsume_key,
            batch_key,
            broker_name_key,
        ) = keys
        get = fields.get
        group, topic, default_topic = get(group_key), get(topic_key), get(default_topic_key)
        nums, queue_id, sys_flag = get(nums_key), get(queue_id_key), get(sys_flag_key)
        born, flag, reconsume = get(born_key), get(flag_key), get(reconsume_key) or "0"
        unit_mode = _PLAIN_WORDS.get(get(unit_mode_key) or "false")
        batch = _PLAIN_WORDS.get(get(batch_key) or "false")
        if not (
            group is not None
            and topic is not None
            and default_topic is not None
            and nums is not None
            and queue_id is not None
            and sys_flag is not None
            and born is not None
            and flag is not None
            and unit_mode is not None
            and batch is not None
            and max_reconsume_key not in fields
            and 0 < len(nums) <= PLAIN_DIGITS_MAX
            and 0 < len(queue_id) <= PLAIN_DIGITS_MAX
            and 0 < len(sys_flag) <= PLAIN_DIGITS_MAX
            and 0 < len(born) <= PLAIN_DIGITS_MAX
            and 0 < len(flag) <= PLAIN_DIGITS_MAX
            and len(reconsume) <= PLAIN_DIGITS_MAX
            and (digits := nums + queue_id + sys_flag + born + flag + reconsume).isdigit()
            and digits.isascii()
        ):
            return None
        # Every field set by name on a bare instance: half the cost of any __init__ call (a
        # field added to the class and not set here fails the fast-branch test's comparison).
        header = _new(cls)
        header.producer_group, header.topic, header.default_topic = group, topic, default_topic
        header.default_topic_queue_nums, header.queue_id = int(nums), int(queue_id)
        header.sys_flag, header.born_timestamp, header.flag = int(sys_flag), int(born), int(flag)
        header.properties, header.reconsume_times = get(properties_key), int(reconsume)
        header.unit_mode, header.max_reconsume_times, header.batch = unit_mode, None, batch
        header.broker_name = get(broker_name_key) or None
        return header

    @classmethod
    def _from_fields_careful(cls, fields: Mapping[str, str]) -> Self:
        """Any spelling FieldReader accepts; names the field that is wrong."""
        if is_v2_send(fields):
            fields = {v1: fields[v2] for v1, v2 in _SEND_NAMES if v2 in fields}
        r = FieldReader(cls.__name__, fields)
        return cls(
            producer_group=r.req_str("producerGroup"),
            topic=r.req_str("topic"),
            default_topic=r.req_str("defaultTopic"),
            default_topic_queue_nums=r.req_int("defaultTopicQueueNums"),
            queue_id=r.req_int("queueId"),
            sys_flag=r.req_int("sysFlag"),
            born_timestamp=r.req_int("bornTimestamp"),
            flag=r.req_int("flag"),
            properties=r.opt_str("properties"),
            reconsume_times=r.int_or("reconsumeTimes", 0),
            unit_mode=r.bool_or("unitMode", False),
            max_reconsume_times=r.opt_int("maxReconsumeTimes"),
            batch=r.bool_or("batch", False),
            broker_name=r.opt_str_nonempty("bname"),
        )


def send_fields_v2(
    producer_group: str,
    topic: str,
    default_topic: str,
    default_topic_queue_nums: int,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    flag: int,
    properties: str | None,
    batch: bool,
    broker_name: str | None,
) -> dict[str, str]:
    """`SendMessageRequestHeader(...).to_fields(v2=True)` of a producer's send (reconsumeTimes
    0, unitMode false, no maxReconsumeTimes), built without the header object: one per send.

    A dict display of the letters `_SEND_NAMES` gives: building the map from the names tuple
    (zip) costs twice as much.
    """
    fields = {
        _V2_PRODUCER_GROUP: producer_group,
        _V2_TOPIC: topic,
        _V2_DEFAULT_TOPIC: default_topic,
        _V2_DEFAULT_TOPIC_QUEUE_NUMS: str(default_topic_queue_nums),
        _V2_QUEUE_ID: str(queue_id),
        _V2_SYS_FLAG: str(sys_flag),
        _V2_BORN_TIMESTAMP: str(born_timestamp),
        _V2_FLAG: str(flag),
        _V2_PROPERTIES: properties or "",
        _V2_RECONSUME_TIMES: "0",
        _V2_UNIT_MODE: "false",
        _V2_BATCH: _BOOL_TEXTS[batch],
        _V2_BROKER_NAME: broker_name or "",
    }
    if properties is None:
        del fields[_V2_PROPERTIES]
    if broker_name is None:
        del fields[_V2_BROKER_NAME]
    return fields


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageResponseHeader:
    """msg_id is the offsetMsgId (comma-joined for a batch); queue_offset the first one."""

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        return send_response_fields(
            self.msg_id, self.queue_id, self.queue_offset, self.transaction_id
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        msg_id, queue_id, queue_offset, transaction_id = parse_send_response(fields)
        return cls(
            msg_id=msg_id,
            queue_id=queue_id,
            queue_offset=queue_offset,
            transaction_id=transaction_id,
        )


def parse_send_response(fields: Mapping[str, str]) -> tuple[str, int, int, str | None]:
    """(msgId, queueId, queueOffset, transactionId) of a send's answer, without the header
    object (the producer reads one per send): the plain form every broker writes is read
    directly; anything else takes the careful reader, which names the bad field.

    Raises:
        ProtocolError: a field is missing or malformed.
    """
    msg_id, queue_id_text, offset_text = (
        fields.get("msgId"),
        fields.get("queueId"),
        fields.get("queueOffset"),
    )
    if msg_id is not None and queue_id_text is not None and offset_text is not None:
        queue_id, queue_offset = parse_plain_int(queue_id_text), parse_plain_int(offset_text)
        if queue_id is not None and queue_offset is not None:
            return msg_id, queue_id, queue_offset, fields.get("transactionId")
    r = FieldReader(SendMessageResponseHeader.__name__, fields)
    return (
        r.req_str("msgId"),
        r.req_int("queueId"),
        r.req_int("queueOffset"),
        r.opt_str("transactionId"),
    )


def send_response_fields(
    msg_id: str, queue_id: int, queue_offset: int, transaction_id: str | None = None
) -> dict[str, str]:
    """`SendMessageResponseHeader(...).to_fields()` without the header object (one per send):
    the one spelling of the send answer's fields, Java's two extra ones included."""
    fields = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if transaction_id is not None:
        fields["transactionId"] = transaction_id
    fields["MSG_REGION"] = MSG_REGION_DEFAULT
    fields["TRACE_ON"] = TRACE_ON_DEFAULT
    return fields


# ---------------------------------------------------------------------------------------------
# PULL_MESSAGE (11): §4.2


class PullSysFlag(IntFlag):
    """Bits of PullMessageRequestHeader.sys_flag."""

    COMMIT_OFFSET = 0x1  # store commit_offset for (group, topic, queue) as a side effect
    SUSPEND = 0x2  # the broker may hold the request (long polling)
    SUBSCRIPTION = 0x4  # build the filter from `subscription`, not the heartbeat's
    CLASS_FILTER = 0x8  # legacy class filter; ignored
    LITE_PULL = 0x10  # 4.x lite pull consumer; informational


@dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    sys_flag: int = 0
    commit_offset: int = 0
    suspend_timeout_millis: int = PULL_SUSPEND_MS_DEFAULT
    subscription: str | None = None
    sub_version: int = 0
    expression_type: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "consumerGroup": self.consumer_group,
                "topic": self.topic,
                "queueId": self.queue_id,
                "queueOffset": self.queue_offset,
                "maxMsgNums": self.max_msg_nums,
                "sysFlag": self.sys_flag,
                "commitOffset": self.commit_offset,
                "suspendTimeoutMillis": self.suspend_timeout_millis,
                "subscription": self.subscription,
                "subVersion": self.sub_version,
                "expressionType": self.expression_type,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            consumer_group=r.req_str("consumerGroup"),
            topic=r.req_str("topic"),
            queue_id=r.req_int("queueId"),
            queue_offset=r.req_int("queueOffset"),
            max_msg_nums=r.req_int("maxMsgNums"),
            sys_flag=r.req_int("sysFlag"),
            commit_offset=r.req_int("commitOffset"),
            suspend_timeout_millis=r.req_int("suspendTimeoutMillis"),
            subscription=r.opt_str("subscription"),
            sub_version=r.req_int("subVersion"),
            expression_type=r.opt_str_nonempty("expressionType"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageResponseHeader:
    """Sent with every pull response, errors included (clients read all four)."""

    suggest_which_broker_id: int = 0
    next_begin_offset: int
    min_offset: int
    max_offset: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "suggestWhichBrokerId": self.suggest_which_broker_id,
                "nextBeginOffset": self.next_begin_offset,
                "minOffset": self.min_offset,
                "maxOffset": self.max_offset,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            suggest_which_broker_id=r.req_int("suggestWhichBrokerId"),
            next_begin_offset=r.req_int("nextBeginOffset"),
            min_offset=r.req_int("minOffset"),
            max_offset=r.req_int("maxOffset"),
        )


# ---------------------------------------------------------------------------------------------
# Transactions (37, 39): §4.11
