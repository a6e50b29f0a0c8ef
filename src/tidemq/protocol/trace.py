"""Message trace records: RocketMQ's trace data format (operations.md §3), sans-I/O.

A trace message's body is a run of records, each ended by FIELD_SEPARATOR (0x02), its fields
split by CONTENT_SEPARATOR (0x01), in the order upstream's TraceDataEncoder writes them:

    Pub             type time region group topic msgId tags keys storeHost bodyLength costTime
                    msgType offsetMsgId success [clientHost]
    SubBefore       type time region group requestId msgId retryTimes keys
    SubAfter        type requestId msgId costTime success keys [contextCode [time [group]]]
    EndTransaction  type time region group topic msgId tags keys storeHost msgType
                    transactionId transactionState fromTransactionCheck

Java writes an absent string as "null" and reads the fields with String.split, which drops
trailing empty fields (a record ending in an empty field would be cut short): so absent strings
are written as "null" here too, and read back as "". Booleans are "true"/"false", msgType is the
ordinal of upstream's MessageType (below), transactionState a LocalTransactionState name.

The trace message itself is keyed (KEYS property) by every traced msgId and key it holds
(`trace_keys`), so QUERY_MESSAGE by a message's id finds its trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from tidemq.errors import ProtocolError

CONTENT_SEPARATOR: Final = "\x01"
FIELD_SEPARATOR: Final = "\x02"
KEY_SEPARATOR: Final = " "
NULL_TEXT: Final = "null"

PUB: Final = "Pub"
SUB_BEFORE: Final = "SubBefore"
SUB_AFTER: Final = "SubAfter"
END_TRANSACTION: Final = "EndTransaction"
TRACE_TYPES: Final = (PUB, SUB_BEFORE, SUB_AFTER, END_TRANSACTION)

# Upstream's MessageType ordinals.
MSG_TYPE_NORMAL: Final = 0
MSG_TYPE_TRANS_HALF: Final = 1
MSG_TYPE_TRANS_COMMIT: Final = 2
MSG_TYPE_DELAY: Final = 3
MSG_TYPE_ORDER: Final = 4
MSG_TYPE_NAMES: Final = (
    "Normal_Msg",
    "Trans_Msg_Half",
    "Trans_msg_Commit",
    "Delay_Msg",
    "Order_Msg",
)

# Upstream's LocalTransactionState names.
COMMIT_MESSAGE: Final = "COMMIT_MESSAGE"
ROLLBACK_MESSAGE: Final = "ROLLBACK_MESSAGE"
UNKNOWN_STATE: Final = "UNKNOW"

# SubAfter contextCode: upstream's ConsumeReturnType ordinals (SUCCESS 0, TIME_OUT 1,
# EXCEPTION 2, RETURNNULL 3, FAILED 4), plus TideMQ's broker-side DLQ move (no upstream type).
CONTEXT_SUCCESS: Final = 0
CONTEXT_FAILED: Final = 4
CONTEXT_DLQ: Final = 100

REGION_DEFAULT: Final = "DefaultRegion"

_PUB_FIELDS_MIN: Final = 13
_SUB_BEFORE_FIELDS: Final = 8
_SUB_AFTER_FIELDS_MIN: Final = 6
_END_TX_FIELDS: Final = 13


@dataclass(slots=True)
class TraceRecord:
    """One trace record, whichever type: the fields its type does not carry keep their
    defaults. `timestamp` is ms since the epoch (0 when an old SubAfter carried none).
    Not frozen: a frozen dataclass of 21 fields takes ~8x longer to build, and the broker
    builds one per traced event."""

    trace_type: str
    timestamp: int = 0
    region_id: str = REGION_DEFAULT
    group: str = ""
    topic: str = ""
    msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_time: int = 0
    msg_type: int = MSG_TYPE_NORMAL
    offset_msg_id: str = ""
    success: bool = True
    client_host: str = ""
    request_id: str = ""
    retry_times: int = 0
    context_code: int = 0
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False

    def to_dict(self) -> dict[str, object]:
        """The record as JSON-ready fields (the CLI's --json, the console)."""
        return dataclasses.asdict(self)


def _text(value: str) -> str:
    return value if value else NULL_TEXT


def _bool(value: bool) -> str:
    return "true" if value else "false"


def encode_record(record: TraceRecord) -> str:
    """One record in upstream's layout for its type, FIELD_SEPARATOR included.

    Raises:
        ValueError: an unknown trace type, or a field holding a separator.
    """
    r = record
    if r.trace_type == PUB:
        fields = [PUB, str(r.timestamp), _text(r.region_id), _text(r.group), _text(r.topic)]
        fields += [_text(r.msg_id), _text(r.tags), _text(r.keys), _text(r.store_host)]
        fields += [str(r.body_length), str(r.cost_time), str(r.msg_type)]
        fields += [_text(r.offset_msg_id), _bool(r.success)]
    elif r.trace_type == SUB_BEFORE:
        fields = [SUB_BEFORE, str(r.timestamp), _text(r.region_id), _text(r.group)]
        fields += [_text(r.request_id), _text(r.msg_id), str(r.retry_times), _text(r.keys)]
    elif r.trace_type == SUB_AFTER:
        fields = [SUB_AFTER, _text(r.request_id), _text(r.msg_id), str(r.cost_time)]
        fields += [_bool(r.success), _text(r.keys), str(r.context_code), str(r.timestamp)]
        fields += [_text(r.group)]
    elif r.trace_type == END_TRANSACTION:
        fields = [END_TRANSACTION, str(r.timestamp), _text(r.region_id), _text(r.group)]
        fields += [_text(r.topic), _text(r.msg_id), _text(r.tags), _text(r.keys)]
        fields += [_text(r.store_host), str(r.msg_type), _text(r.transaction_id)]
        fields += [_text(r.transaction_state), _bool(r.from_transaction_check)]
    else:
        raise ValueError(f"unknown trace type {r.trace_type!r}")
    for field in fields:
        if CONTENT_SEPARATOR in field or FIELD_SEPARATOR in field:
            raise ValueError(f"trace field {field!r} holds a separator")
    return CONTENT_SEPARATOR.join(fields) + FIELD_SEPARATOR


def encode_records(records: Iterable[TraceRecord]) -> str:
    """A trace message body: the records one after another."""
    return "".join(encode_record(r) for r in records)


def trace_keys(records: Iterable[TraceRecord]) -> list[str]:
    """The KEYS of the trace message holding `records`: each msgId and each key, once, in order
    (upstream's TraceTransferBean.transKey)."""
    keys: dict[str, None] = {}
    for record in records:
        if record.msg_id:
            keys[record.msg_id] = None
        for key in record.keys.split(KEY_SEPARATOR):
            if key:
                keys[key] = None
    return list(keys)


def _read_text(value: str) -> str:
    return "" if value == NULL_TEXT else value


def _read_int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"trace field {name} is not a number: {value!r}") from None


def _read_bool(value: str) -> bool:
    # Java's Boolean.parseBoolean: "true" in any case, anything else is false.
    return value.lower() == "true"


def _need(line: list[str], count: int) -> None:
    if len(line) < count:
        raise ProtocolError(f"{line[0]} trace record has {len(line)} fields, needs {count}")


def _decode_pub(line: list[str]) -> TraceRecord:
    _need(line, _PUB_FIELDS_MIN)
    offset_msg_id, success, client_host = "", _read_bool(line[12]), ""
    if len(line) >= 14:  # 14: with offsetMsgId; 15 and more: with the client host too
        offset_msg_id, success = _read_text(line[12]), _read_bool(line[13])
    if len(line) >= 15:
        client_host = _read_text(line[14])
    return TraceRecord(
        PUB,
        timestamp=_read_int(line[1], "timestamp"),
        region_id=_read_text(line[2]),
        group=_read_text(line[3]),
        topic=_read_text(line[4]),
        msg_id=_read_text(line[5]),
        tags=_read_text(line[6]),
        keys=_read_text(line[7]),
        store_host=_read_text(line[8]),
        body_length=_read_int(line[9], "bodyLength"),
        cost_time=_read_int(line[10], "costTime"),
        msg_type=_read_int(line[11], "msgType"),
        offset_msg_id=offset_msg_id,
        success=success,
        client_host=client_host,
    )


def _decode_sub_before(line: list[str]) -> TraceRecord:
    _need(line, _SUB_BEFORE_FIELDS)
    return TraceRecord(
        SUB_BEFORE,
        timestamp=_read_int(line[1], "timestamp"),
        region_id=_read_text(line[2]),
        group=_read_text(line[3]),
        request_id=_read_text(line[4]),
        msg_id=_read_text(line[5]),
        retry_times=_read_int(line[6], "retryTimes"),
        keys=_read_text(line[7]),
    )


def _decode_sub_after(line: list[str]) -> TraceRecord:
    _need(line, _SUB_AFTER_FIELDS_MIN)
    # 7 fields: with contextCode; 8 (Java 4.9.x / 5.0): with the time too; 9: and the group.
    return TraceRecord(
        SUB_AFTER,
        request_id=_read_text(line[1]),
        msg_id=_read_text(line[2]),
        cost_time=_read_int(line[3], "costTime"),
        success=_read_bool(line[4]),
        keys=_read_text(line[5]),
        context_code=_read_int(line[6], "contextCode") if len(line) >= 7 else 0,
        timestamp=_read_int(line[7], "timestamp") if len(line) >= 8 else 0,
        group=_read_text(line[8]) if len(line) >= 9 else "",
    )


def _decode_end_transaction(line: list[str]) -> TraceRecord:
    _need(line, _END_TX_FIELDS)
    return TraceRecord(
        END_TRANSACTION,
        timestamp=_read_int(line[1], "timestamp"),
        region_id=_read_text(line[2]),
        group=_read_text(line[3]),
        topic=_read_text(line[4]),
        msg_id=_read_text(line[5]),
        tags=_read_text(line[6]),
        keys=_read_text(line[7]),
        store_host=_read_text(line[8]),
        msg_type=_read_int(line[9], "msgType"),
        transaction_id=_read_text(line[10]),
        transaction_state=_read_text(line[11]),
        from_transaction_check=_read_bool(line[12]),
    )


_DECODERS: Final = {
    PUB: _decode_pub,
    SUB_BEFORE: _decode_sub_before,
    SUB_AFTER: _decode_sub_after,
    END_TRANSACTION: _decode_end_transaction,
}


def decode_records(data: str) -> list[TraceRecord]:
    """The records of a trace message body, in order. A record of a type upstream does not
    define is skipped (as upstream's decoder does); an empty body has none.

    Raises:
        ProtocolError: a record of a known type with too few fields or a bad number.
    """
    records: list[TraceRecord] = []
    for text in data.split(FIELD_SEPARATOR):
        if not text:
            continue
        line = text.split(CONTENT_SEPARATOR)
        decoder = _DECODERS.get(line[0])
        if decoder is not None:
            records.append(decoder(line))
    return records
