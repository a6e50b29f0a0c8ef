"""Half, real, op, check-copy and discard messages: how a transaction is spelled in the store.

Pure functions from messages to messages (no store, no clock). The transaction feature lives in
three system topics of the ordinary store (remoting.md §8), each used as queue 0:

    RMQ_SYS_TRANS_HALF_TOPIC      half messages, as NOT-type records so they get consume-queue
                                  entries; properties add REAL_TOPIC, REAL_QID, PGROUP
    RMQ_SYS_TRANS_OP_HALF_TOPIC   op messages, tag "d", body = half-queue offsets "17" or
                                  "17,18,19," (the 5.x batch form, read too); TideMQ adds the
                                  property __TXOUTCOME# = COMMIT | ROLLBACK | DISCARD, so the
                                  ledger can be rebuilt with outcomes, not only "resolved"
    TRANS_CHECK_MAX_TIME_TOPIC    half messages given up on (checked too often, no producer
                                  reachable too often, or too old)

The offsets in an op body are *origins*: the half-queue offset of the transaction's first half
message. A check copy (put back with TRANSACTION_CHECK_TIMES + 1) or an immunity rewrite keeps
the origin in TRAN_PREPARED_QUEUE_OFFSET and the first store time as its own store timestamp, so
ages and answers about any copy refer to one transaction.

Committing rebuilds the real message from the half record. Kept: body, flag, born timestamp and
host, store host, reconsume times, the MULTI_TAGS and COMPRESSED bits, every user property,
KEYS, TAGS, UNIQ_KEY, CLUSTER and PGROUP (as upstream keeps it). Set: transaction type COMMIT,
preparedTransactionOffset = the half record's commit-log offset. Removed (half-only):
TRAN_MSG (a committed message re-sent, e.g. to a retry topic, must not become a half message
again), REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES, TRAN_PREPARED_QUEUE_OFFSET,
CHECK_IMMUNITY_TIME_IN_SECONDS, TideMQ's __TXUNREACHED#, and the store's own __CRC32# and
__TAGSCODE#. The tags code is recomputed by the store from TAGS. The store time is the
commit's, not the half's: store times must rise along a consume queue for
SEARCH_OFFSET_BY_TIMESTAMP.

Each transaction passes here twice (prepare, commit), so the functions that read a half record's
properties also come in a `_from` form over an already decoded map: the END path decodes a half's
properties once and hands the map on, and the messages built here carry their map as
`MessageToStore.parsed`, so the store does not decode it again.
"""

from __future__ import annotations

import enum
from typing import Final

from tidemq.broker.restore import message_from_stored
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    CRC32_PROPERTY,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TAGS,
    TRAN_MSG,
    TRAN_PREPARED_QUEUE_OFFSET,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANSACTION_CHECK_TIMES,
    SysFlag,
    add_properties,
    decode_properties,
    encode_properties,
)
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.types import MessageToStore, PutResult

HALF_TOPIC: Final = RMQ_SYS_TRANS_HALF_TOPIC
OP_TOPIC: Final = RMQ_SYS_TRANS_OP_HALF_TOPIC
DISCARD_TOPIC: Final = TRANS_CHECK_MAX_TIME_TOPIC
HALF_QUEUE_ID: Final = 0
# The tag of op messages (upstream TransactionalMessageUtil.REMOVETAG).
OP_TAG: Final = "d"
# TideMQ's op-message property naming the outcome (private: "__" prefix as the store's own).
OUTCOME_PROPERTY: Final = "__TXOUTCOME#"
# TideMQ's property on a check copy: how many due checks found no live producer of the group.
# Those are not TRANSACTION_CHECK_TIMES (a producer unknown to a restarted broker until its next
# heartbeat must not lose its transaction); transactionUnreachedCheckMax caps them instead.
UNREACHED_PROPERTY: Final = "__TXUNREACHED#"
# An op body lists at most this many offsets (a batch op message; larger bodies are refused).
OP_BODY_OFFSETS_MAX: Final = 4_096

# Properties of the half message that must not survive into the committed real message.
HALF_ONLY_PROPERTIES: Final = frozenset(
    {
        TRAN_MSG,
        REAL_TOPIC,
        REAL_QID,
        TRANSACTION_CHECK_TIMES,
        TRAN_PREPARED_QUEUE_OFFSET,
        CHECK_IMMUNITY_TIME_IN_SECONDS,
        UNREACHED_PROPERTY,
        CRC32_PROPERTY,
        TAGS_CODE_PROPERTY,
    }
)


class Outcome(enum.Enum):
    """What an op message records about its origins."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"


def to_half_message(msg: MessageToStore, producer_group: str) -> MessageToStore:
    """The half message for a send of `msg` (already validated for its real topic and queue).

    PGROUP is set from the send header when the client did not set it (the C++ client sets only
    TRAN_MSG); the transaction bits of sysFlag are cleared, so the half record is a NOT-type
    record with a consume-queue entry in the half topic. The result's `parsed` holds its
    properties' map (what `prepare` reads the pending transaction from).
    """
    text = msg.properties
    parsed = msg.parsed
    props = dict(parsed[1]) if parsed is not None and parsed[0] is text else decode_properties(text)
    extra = {REAL_TOPIC: msg.topic, REAL_QID: str(msg.queue_id)}
    if PGROUP not in props:
        extra[PGROUP] = producer_group
    text = add_properties(text, props, extra)
    return MessageToStore(
        topic=HALF_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=msg.body,
        flag=msg.flag,
        properties=text,
        sys_flag=SysFlag.with_transaction_type(msg.sys_flag, SysFlag.TRANSACTION_NOT),
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        store_host=msg.store_host,
        reconsume_times=msg.reconsume_times,
        parsed=(text, props),
    )


def origin_from(props: dict[str, str], queue_offset: int) -> int:
    """`origin_of` over the half record's decoded properties and its queue offset."""
    text = props.get(TRAN_PREPARED_QUEUE_OFFSET)
    if text is not None and text.strip().isdigit():
        return int(text)
    return queue_offset


def origin_of(half: rec.StoredMessage) -> int:
    """The transaction's origin: TRAN_PREPARED_QUEUE_OFFSET of a copy, else the own offset."""
    return origin_from(half.property_map(), half.queue_offset)


def check_times_from(props: dict[str, str]) -> int:
    text = props.get(TRANSACTION_CHECK_TIMES, "0").strip()
    return int(text) if text.isdigit() else 0


def check_times_of(half: rec.StoredMessage) -> int:
    return check_times_from(half.property_map())


def unreached_checks_of(half: rec.StoredMessage) -> int:
    """Due checks of this transaction that found no live producer (UNREACHED_PROPERTY)."""
    text = half.property_map().get(UNREACHED_PROPERTY, "0").strip()
    return int(text) if text.isdigit() else 0


def immunity_ms_of(half: rec.StoredMessage) -> int | None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS in ms; None when absent, negative (-1) or malformed."""
    text = half.property_map().get(CHECK_IMMUNITY_TIME_IN_SECONDS, "").strip()
    if not text.isdigit():
        return None
    return int(text) * 1000


def real_destination_from(props: dict[str, str], queue_offset: int) -> tuple[str, int]:
    """`real_destination` over decoded properties (`queue_offset` names the record in errors)."""
    topic = props.get(REAL_TOPIC)
    qid = props.get(REAL_QID, "").strip()
    if not topic or not qid.isdigit():
        raise ProtocolError(f"half message at offset {queue_offset} lacks {REAL_TOPIC}/{REAL_QID}")
    return topic, int(qid)


def real_destination(half: rec.StoredMessage) -> tuple[str, int]:
    """(REAL_TOPIC, REAL_QID) of a half record. Raises ProtocolError when they are missing."""
    return real_destination_from(half.property_map(), half.queue_offset)


def to_real_message(half: rec.StoredMessage, props: dict[str, str] | None = None) -> MessageToStore:
    """The committed real message rebuilt from a half record (see the module docstring).

    `props` is `half.property_map()` when the caller has it already (it is not modified).
    """
    if props is None:
        props = half.property_map()
    topic, queue_id = real_destination_from(props, half.queue_offset)
    kept = {k: v for k, v in props.items() if k not in HALF_ONLY_PROPERTIES}
    real = message_from_stored(
        half,
        topic=topic,
        queue_id=queue_id,
        properties=kept,
        sys_flag=SysFlag.with_transaction_type(half.sys_flag, SysFlag.COMMIT),
        prepared_transaction_offset=half.physical_offset,
    )
    # message_from_stored encodes `kept` less the store's own properties, which are half-only.
    real.parsed = (real.properties, kept)
    return real


def to_real_message_of_put(half: MessageToStore, put: PutResult) -> MessageToStore:
    """`to_real_message` of a half message as this broker put it (`half`, from
    to_half_message, stored as `put`), without reading the record back: the record the store
    makes of the result is the same, byte for byte (tests compare them).

    The properties are `half.parsed`'s map (not modified). Hosts stay as put: the store packs
    them the same way either time.
    """
    assert half.parsed is not None
    props = half.parsed[1]
    topic, queue_id = real_destination_from(props, put.queue_offset)
    kept = {k: v for k, v in props.items() if k not in HALF_ONLY_PROPERTIES}
    text = encode_properties(kept)
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=half.body,
        flag=half.flag,
        properties=text,
        sys_flag=SysFlag.with_transaction_type(half.sys_flag, SysFlag.COMMIT),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_host=half.store_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=put.physical_offset,
        parsed=(text, kept),
    )


def _half_copy(half: rec.StoredMessage, props: dict[str, str], topic: str) -> MessageToStore:
    return message_from_stored(
        half,
        topic=topic,
        queue_id=HALF_QUEUE_ID,
        properties=props,
        # The first store time travels with every copy: ages count from the prepare.
        store_timestamp=half.store_timestamp,
    )


def check_copy(
    half: rec.StoredMessage, check_times: int, unreached_checks: int | None = None
) -> MessageToStore:
    """The copy put back at the half queue's end before a check (or immunity rewrite, or a due
    check that found no producer: `unreached_checks` then sets UNREACHED_PROPERTY)."""
    props = half.property_map()
    props[TRANSACTION_CHECK_TIMES] = str(check_times)
    if unreached_checks is not None:
        props[UNREACHED_PROPERTY] = str(unreached_checks)
    props[TRAN_PREPARED_QUEUE_OFFSET] = str(origin_of(half))
    return _half_copy(half, props, HALF_TOPIC)


def discard_message(half: rec.StoredMessage) -> MessageToStore:
    """The half message as parked in TRANS_CHECK_MAX_TIME_TOPIC queue 0 (for operators)."""
    props = half.property_map()
    props[TRAN_PREPARED_QUEUE_OFFSET] = str(origin_of(half))
    return _half_copy(half, props, DISCARD_TOPIC)


def encode_op_body(origins: list[int]) -> bytes:
    """ "17" for one offset (the 4.x form), "17,18,19," for several (the 5.x batch form)."""
    assert origins, origins
    assert all(o >= 0 for o in origins), origins
    if len(origins) == 1:
        return str(origins[0]).encode()
    return "".join(f"{o}," for o in origins).encode()


def parse_op_body(body: bytes) -> list[int]:
    """The offsets of an op body in either form. Raises ProtocolError on anything else."""
    try:
        text = body.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ProtocolError(f"op body is not ASCII: {body[:32]!r}") from None
    parts = text.split(",")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not parts or len(parts) > OP_BODY_OFFSETS_MAX or not all(p.isdigit() for p in parts):
        raise ProtocolError(f"op body is not a list of offsets: {text[:64]!r}")
    return [int(p) for p in parts]


def _op_properties(outcome: Outcome) -> str:
    return encode_properties({TAGS: OP_TAG, OUTCOME_PROPERTY: outcome.value})


# One op message is stored per commit round: its properties are the same every time.
_OP_PROPERTIES: Final = {outcome: _op_properties(outcome) for outcome in Outcome}


def op_message(
    origins: list[int],
    outcome: Outcome,
    *,
    store_host: tuple[str, int],
    now_ms: int,
) -> MessageToStore:
    """The op message marking `origins` resolved with `outcome`."""
    text = _OP_PROPERTIES[outcome]
    return MessageToStore(
        topic=OP_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=encode_op_body(origins),
        flag=0,
        properties=text,
        sys_flag=0,
        born_timestamp=now_ms,
        born_host=store_host,
        store_host=store_host,
        parsed=(text, {TAGS: OP_TAG, OUTCOME_PROPERTY: outcome.value}),
    )


def outcome_of_op(op: rec.StoredMessage) -> Outcome:
    """The outcome an op record states; upstream op messages (no property) read as ROLLBACK,
    the safe reading: "resolved, never deliver again"."""
    text = op.property_map().get(OUTCOME_PROPERTY, Outcome.ROLLBACK.value)
    try:
        return Outcome(text)
    except ValueError:
        raise ProtocolError(f"op message has unknown outcome {text!r}") from None


def check_body(copy: rec.StoredMessage) -> bytes:
    """The CHECK_TRANSACTION_STATE body: the copy's record with the real topic and queue id
    (remoting.md §4.11), so the producer sees the message it sent."""
    topic, queue_id = real_destination(copy)
    return rec.encode_record(
        topic=topic,
        queue_id=queue_id,
        body=copy.body,
        flag=copy.flag,
        properties=copy.properties,
        sys_flag=copy.sys_flag,
        born_timestamp=copy.born_timestamp,
        born_host=copy.born_host,
        store_timestamp=copy.store_timestamp,
        store_host=copy.store_host,
        reconsume_times=copy.reconsume_times,
        prepared_transaction_offset=copy.prepared_transaction_offset,
        queue_offset=copy.queue_offset,
        physical_offset=copy.physical_offset,
    )
