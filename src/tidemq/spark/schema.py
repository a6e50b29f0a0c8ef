"""The row schema of the source, its Arrow twin, and messages → Arrow record batches.

Spark checks that a reader's Arrow batches have exactly the Arrow schema it derives from the
declared Spark schema (else DATA_SOURCE_RETURN_SCHEMA_MISMATCH), so both are built here from one
column table and a test compares them with Spark's own conversion.

    column          Spark                 Arrow
    topic           string                string
    brokerName      string                string
    queueId         int                   int32
    queueOffset     bigint                int64
    msgId           string                string
    body            binary                binary
    tags            string                string
    keys            string                string (space-joined, as stored)
    properties      map<string,string>    map<string,string>   (only with includeProperties)
    bornTimestamp   timestamp             timestamp[us, UTC]
    storeTimestamp  timestamp             timestamp[us, UTC]

`properties` holds the user's properties. Left out: the ones with their own column (UNIQ_KEY, TAGS,
KEYS) and bookkeeping the producer, broker or store adds (WAIT, CLUSTER, __CRC32#, MIN_OFFSET,
MAX_OFFSET). Transaction markers (TRAN_MSG, PGROUP, REAL_TOPIC) stay: they say how it arrived.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa

from tidemq.client.message import MessageExt
from tidemq.protocol import message as pm

_COLUMNS_BEFORE_PROPERTIES: Final = (
    ("topic", "string", pa.string()),
    ("brokerName", "string", pa.string()),
    ("queueId", "int", pa.int32()),
    ("queueOffset", "bigint", pa.int64()),
    ("msgId", "string", pa.string()),
    ("body", "binary", pa.binary()),
    ("tags", "string", pa.string()),
    ("keys", "string", pa.string()),
)
_PROPERTIES_COLUMN: Final = (
    "properties",
    "map<string,string>",
    pa.map_(pa.string(), pa.string()),
)
_TIMESTAMP_COLUMNS: Final = (
    ("bornTimestamp", "timestamp", pa.timestamp("us", tz="UTC")),
    ("storeTimestamp", "timestamp", pa.timestamp("us", tz="UTC")),
)
# Left out of the properties column (see the module docstring).
HIDDEN_PROPERTIES: Final = frozenset(
    {
        pm.UNIQ_KEY,
        pm.TAGS,
        pm.KEYS,
        pm.WAIT,
        pm.CLUSTER,
        pm.CRC32_PROPERTY,
        pm.MIN_OFFSET,
        pm.MAX_OFFSET,
    }
)


def _columns(include_properties: bool) -> tuple[tuple[str, str, pa.DataType], ...]:
    middle = (_PROPERTIES_COLUMN,) if include_properties else ()
    return _COLUMNS_BEFORE_PROPERTIES + middle + _TIMESTAMP_COLUMNS


def source_ddl(include_properties: bool) -> str:
    """The Spark schema as a DDL string."""
    return ", ".join(f"{name} {ddl}" for name, ddl, _ in _columns(include_properties))


def source_arrow_schema(include_properties: bool) -> pa.Schema:
    return pa.schema(
        [pa.field(name, arrow_type) for name, _, arrow_type in _columns(include_properties)]
    )


def messages_to_batch(
    messages: Sequence[MessageExt], schema: pa.Schema, include_properties: bool
) -> pa.RecordBatch:
    """One Arrow record batch of `messages`, in `schema` (from `source_arrow_schema`).

    One comprehension per column: a tight loop each is faster in CPython than one loop that
    appends to eleven lists, and this runs for every row the connector reads.
    """
    tags, keys = pm.TAGS, pm.KEYS
    props = [m.properties for m in messages]
    arrays: list[pa.Array] = [
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([m.broker_name for m in messages], pa.string()),
        pa.array([m.queue_id for m in messages], pa.int32()),
        pa.array([m.queue_offset for m in messages], pa.int64()),
        pa.array([m.msg_id for m in messages], pa.string()),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([p.get(tags) for p in props], pa.string()),
        pa.array([p.get(keys) for p in props], pa.string()),
    ]
    if include_properties:
        hidden = HIDDEN_PROPERTIES
        pairs = [[(k, v) for k, v in p.items() if k not in hidden] for p in props]
        arrays.append(pa.array(pairs, pa.map_(pa.string(), pa.string())))
    for name in ("born_timestamp", "store_timestamp"):
        millis = pa.array([getattr(m, name) for m in messages], pa.int64())
        arrays.append(millis.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
