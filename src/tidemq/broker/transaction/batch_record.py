"""The exactly-once sink's batch records and half tags (batch.py uses them; the docstring there
says what the records mean). Pure data and codecs: no store, no state."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import orjson

from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import KEYS, SPARK_TXN, encode_properties
from tidemq.protocol.names import RMQ_SYS_TRANS_BATCH_TOPIC
from tidemq.store.types import MessageToStore

BATCH_TOPIC: Final = RMQ_SYS_TRANS_BATCH_TOPIC
BATCH_QUEUE_ID: Final = 0
# Txn ids per END_BATCH (one per partition that succeeded): keeps one record well under the
# 4 MiB message size limit (ids are ~20 bytes).
BATCH_TXNS_MAX: Final = 65_536


class BatchOutcome(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


class BatchPhase(enum.Enum):
    """Which step of the two-phase COMMIT an END_BATCH is (the module docstring)."""

    LOOKUP = "lookup"  # read the batch's decision; stores nothing
    DECIDE = "decide"  # record the decision, resolve nothing
    PUBLISH = "commit"  # record it as published and resolve the halves (the one-phase COMMIT)


# name -> address of the brokers holding halves of a decision, sorted by name.
Holders = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SparkTxn:
    """What a tagged half message belongs to: `txn` is "<partition>/<attempt>"."""

    sink_id: str
    batch_id: int
    txn: str


def parse_spark_txn(text: str) -> SparkTxn:
    """Parse an __SPARKTXN# value. Raises ProtocolError when it is not sink/batch/part/attempt."""
    parts = text.split("/")
    if len(parts) != 4 or not all(parts) or not parts[1].isdigit():
        raise ProtocolError(f"{SPARK_TXN} is not sinkId/batchId/partition/attempt: {text[:80]!r}")
    return SparkTxn(parts[0], int(parts[1]), f"{parts[2]}/{parts[3]}")


def spark_txn_of(half: rec.StoredMessage) -> SparkTxn | None:
    """The tag of a half message; None for an ordinary transaction. Raises ProtocolError."""
    text = half.property_map().get(SPARK_TXN)
    return None if text is None else parse_spark_txn(text)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    sink_id: str
    batch_id: int
    outcome: BatchOutcome
    txns: frozenset[str]
    final: bool = False  # a ROLLBACK closing the batch for good (module docstring)
    holders: Holders = ()  # COMMIT: the brokers holding halves of the decision
    published: bool = True  # COMMIT: False for a DECIDE record (nothing resolved yet)


def encode_batch_record(record: BatchRecord) -> bytes:
    data: dict[str, object] = {
        "sinkId": record.sink_id,
        "batchId": record.batch_id,
        "outcome": record.outcome.value,
        "txns": sorted(record.txns),
    }
    if record.final:
        data["final"] = True
    if record.outcome is BatchOutcome.COMMIT:
        data["brokers"] = dict(record.holders)
        data["published"] = record.published
    return orjson.dumps(data)


def parse_holders(value: object) -> Holders:
    """A {"name": "address"} object as sorted pairs. Raises ValueError when it is not one."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in value.items()
    ):
        raise ValueError("brokers must map broker names to addresses")
    return tuple(sorted(value.items()))


def decode_batch_record(body: bytes) -> BatchRecord:
    """Raises ProtocolError for anything but a record as `encode_batch_record` writes it."""
    try:
        data = orjson.loads(body)
        record = BatchRecord(
            sink_id=data["sinkId"],
            batch_id=data["batchId"],
            outcome=BatchOutcome(data["outcome"]),
            txns=frozenset(data["txns"]),
            final=data.get("final", False),
            holders=parse_holders(data.get("brokers", {})),
            published=data.get("published", True),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed batch record: {exc}") from None
    if not isinstance(record.final, bool) or (
        record.final and record.outcome is not BatchOutcome.ROLLBACK
    ):
        raise ProtocolError("malformed batch record: final")
    if not isinstance(record.published, bool):
        raise ProtocolError("malformed batch record: published")
    if not isinstance(record.sink_id, str) or not isinstance(record.batch_id, int):
        raise ProtocolError("malformed batch record: sinkId or batchId")
    if not all(isinstance(txn, str) for txn in record.txns):
        raise ProtocolError("malformed batch record: txns")
    return record


def batch_record_message(
    record: BatchRecord, *, store_host: tuple[str, int], now_ms: int
) -> MessageToStore:
    return MessageToStore(
        topic=BATCH_TOPIC,
        queue_id=BATCH_QUEUE_ID,
        body=encode_batch_record(record),
        flag=0,
        properties=encode_properties({KEYS: record.sink_id}),
        sys_flag=0,
        born_timestamp=now_ms,
        born_host=store_host,
        store_host=store_host,
    )
