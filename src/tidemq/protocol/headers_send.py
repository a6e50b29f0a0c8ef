"""Typed headers of sending, pulling and transactions (remoting.md §4.1, §4.2, §4.11).

Conventions for every header module (`headers` re-exports them all): a frozen dataclass per header
with snake_case fields; `to_fields()` renders the wire's extFields map (every value a string, None
fields omitted) and `from_fields()` parses it, raising ProtocolError naming the missing or invalid
wire field. Wire names are spelled out in each pair of methods (no reflection), so a grep for a
wire name finds its one definition. Inbound parsing is lenient as §1.4 requires (see `_fields`):
"0"/"1" booleans, numbers as text, "" for optional numbers. Fields Java marks required are
required inbound; the rest default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntFlag
from typing import Final, Self

from tidemq.limits import PULL_SUSPEND_MS_DEFAULT
from tidemq.protocol._fields import PLAIN_BOOLS, FieldReader, parse_plain_int, render
from tidemq.protocol.names import TBW102

DEFAULT_TOPIC: Final = TBW102
# What every target client sends as defaultTopicQueueNums (§4.1).
DEFAULT_TOPIC_QUEUE_NUMS: Final = 4
# Extra response fields Java adds to every send response; clients ignore them but expect them.
MSG_REGION_DEFAULT: Final = "DefaultRegion"
TRACE_ON_DEFAULT: Final = "true"

# ---------------------------------------------------------------------------------------------
# SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320): §4.1

# (V1 long name, V2 letter) in the order of the V2 alphabet.
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
# The wire names in the header's field order, per spelling (also the broker's send_header.py).
SEND_V1_KEYS: Final = tuple(v1 for v1, _ in _SEND_NAMES)
SEND_V2_KEYS: Final = tuple(v2 for _, v2 in _SEND_NAMES)


def is_v2_send(fields: Mapping[str, str]) -> bool:
    """Whether a send header is spelled in V2 letters: "producerGroup" absent, "a" present."""
    return "a" in fields and "producerGroup" not in fields


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageRequestHeader:
    """The send header; one class for the long V1 names and the V2 single letters."""

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
        # Built directly (one send per message): the same map `render` would make.
        names = SEND_V2_KEYS if v2 else SEND_V1_KEYS
        fields = {
            names[0]: self.producer_group,
            names[1]: self.topic,
            names[2]: self.default_topic,
            names[3]: str(self.default_topic_queue_nums),
            names[4]: str(self.queue_id),
            names[5]: str(self.sys_flag),
            names[6]: str(self.born_timestamp),
            names[7]: str(self.flag),
        }
        if self.properties is not None:
            fields[names[8]] = self.properties
        fields[names[9]] = str(self.reconsume_times)
        fields[names[10]] = "true" if self.unit_mode else "false"
        if self.max_reconsume_times is not None:
            fields[names[11]] = str(self.max_reconsume_times)
        fields[names[12]] = "true" if self.batch else "false"
        if self.broker_name is not None:
            fields[names[13]] = self.broker_name
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        """Parse either spelling: V2 when "producerGroup" is absent and the letter "a" present.

        The request code does not decide it: C++ sends long names with code 10, Java and ali-ons
        letters with 310/320, and a client could mix them up without harm.
        """
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
    0, unitMode false, no maxReconsumeTimes), built without the header object: one per send."""
    if properties is not None and broker_name is not None:  # a single send: one dict display
        return {
            "a": producer_group,
            "b": topic,
            "c": default_topic,
            "d": str(default_topic_queue_nums),
            "e": str(queue_id),
            "f": str(sys_flag),
            "g": str(born_timestamp),
            "h": str(flag),
            "i": properties,
            "j": "0",
            "k": "false",
            "m": "true" if batch else "false",
            "n": broker_name,
        }
    fields = {
        "a": producer_group,
        "b": topic,
        "c": default_topic,
        "d": str(default_topic_queue_nums),
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(born_timestamp),
        "h": str(flag),
    }
    if properties is not None:
        fields["i"] = properties
    fields["j"] = "0"
    fields["k"] = "false"
    fields["m"] = "true" if batch else "false"
    if broker_name is not None:
        fields["n"] = broker_name
    return fields


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageResponseHeader:
    """msg_id is the offsetMsgId (comma-joined for a batch); queue_offset the first one."""

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        # Built directly (one answer per send): the same map `render` would make.
        fields = {
            "msgId": self.msg_id,
            "queueId": str(self.queue_id),
            "queueOffset": str(self.queue_offset),
        }
        if self.transaction_id is not None:
            fields["transactionId"] = self.transaction_id
        fields["MSG_REGION"] = MSG_REGION_DEFAULT
        fields["TRACE_ON"] = TRACE_ON_DEFAULT
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        msg_id, queue_id_text, offset_text = (
            fields.get("msgId"),
            fields.get("queueId"),
            fields.get("queueOffset"),
        )
        if msg_id is not None and queue_id_text is not None and offset_text is not None:
            queue_id, queue_offset = parse_plain_int(queue_id_text), parse_plain_int(offset_text)
            if queue_id is not None and queue_offset is not None:  # the hot path: one per send
                return cls(
                    msg_id=msg_id,
                    queue_id=queue_id,
                    queue_offset=queue_offset,
                    transaction_id=fields.get("transactionId"),
                )
        r = FieldReader(cls.__name__, fields)
        return cls(
            msg_id=r.req_str("msgId"),
            queue_id=r.req_int("queueId"),
            queue_offset=r.req_int("queueOffset"),
            transaction_id=r.opt_str("transactionId"),
        )


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


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionRequestHeader:
    """commit_or_rollback holds the sysFlag transaction value: 0 NOT, 8 COMMIT, 12 ROLLBACK."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "producerGroup": self.producer_group,
                "tranStateTableOffset": self.tran_state_table_offset,
                "commitLogOffset": self.commit_log_offset,
                "commitOrRollback": self.commit_or_rollback,
                "fromTransactionCheck": self.from_transaction_check,
                "msgId": self.msg_id,
                "transactionId": self.transaction_id,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        get = fields.get
        group, msg_id = get("producerGroup"), get("msgId")
        table, offset, action = (
            get("tranStateTableOffset"),
            get("commitLogOffset"),
            get("commitOrRollback"),
        )
        from_check = PLAIN_BOOLS.get(get("fromTransactionCheck") or "false")
        if (  # the hot path (one per transaction): what every client sends
            group is not None
            and msg_id is not None
            and from_check is not None
            and table is not None
            and offset is not None
            and action is not None
            and (table_offset := parse_plain_int(table)) is not None
            and (log_offset := parse_plain_int(offset)) is not None
            and (outcome := parse_plain_int(action)) is not None
        ):
            return cls(
                producer_group=group,
                tran_state_table_offset=table_offset,
                commit_log_offset=log_offset,
                commit_or_rollback=outcome,
                from_transaction_check=from_check,
                msg_id=msg_id,
                transaction_id=get("transactionId") or None,
            )
        return cls._from_fields_careful(fields)

    @classmethod
    def _from_fields_careful(cls, fields: Mapping[str, str]) -> Self:
        """Any spelling FieldReader accepts; names the field that is wrong."""
        r = FieldReader(cls.__name__, fields)
        return cls(
            producer_group=r.req_str("producerGroup"),
            tran_state_table_offset=r.req_int("tranStateTableOffset"),
            commit_log_offset=r.req_int("commitLogOffset"),
            commit_or_rollback=r.req_int("commitOrRollback"),
            from_transaction_check=r.bool_or("fromTransactionCheck", False),
            msg_id=r.req_str("msgId"),
            transaction_id=r.opt_str_nonempty("transactionId"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EndBatchRequestHeader:
    """TIDEMQ_END_BATCH (TideMQ-private): end every half message of one sink batch.

    commit_or_rollback holds the sysFlag transaction value as END_TRANSACTION's does: 8 COMMIT,
    12 ROLLBACK. The body is JSON `{"txns": ["<partition>/<attempt>", ...]}`.
    """

    sink_id: str
    batch_id: int
    commit_or_rollback: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "sinkId": self.sink_id,
                "batchId": self.batch_id,
                "commitOrRollback": self.commit_or_rollback,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            sink_id=r.req_str("sinkId"),
            batch_id=r.req_int("batchId"),
            commit_or_rollback=r.req_int("commitOrRollback"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckTransactionStateRequestHeader:
    """Broker → producer (oneway); the offsets are those of the half message's check copy."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "tranStateTableOffset": self.tran_state_table_offset,
                "commitLogOffset": self.commit_log_offset,
                "msgId": self.msg_id,
                "transactionId": self.transaction_id,
                "offsetMsgId": self.offset_msg_id,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            tran_state_table_offset=r.req_int("tranStateTableOffset"),
            commit_log_offset=r.req_int("commitLogOffset"),
            msg_id=r.opt_str("msgId"),
            transaction_id=r.opt_str("transactionId"),
            offset_msg_id=r.opt_str("offsetMsgId"),
        )
