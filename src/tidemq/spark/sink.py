"""The sink: `df.write.format("tidemq")` and `df.writeStream.format("tidemq")`.

Input columns: `body` (binary or string, required), and optionally `topic`, `tags`, `keys`
(string, space-separated), `properties` (map<string,string>) and `shardingKey` (string: rows
with the same key go to the same queue, in order). A `topic` option overrides the column.
Overwrite (batch) and complete mode (streaming) are refused: a topic is a log, not a table.

Delivery modes:

- `exactlyOnce=false`: at least once. Executors send as rows arrive (batches of
  `sendBatchSize` per SEND_BATCH_MESSAGE; rows with a sharding key one by one to their queue).
  A task retried after a failure, or a batch replayed after a driver crash, sends its rows
  again.
- `exactlyOnce=true` (the default): rows go out as half messages tagged with the batch, and the
  driver ends each batch on every broker holding its halves, decide then publish. Nothing is
  visible before every holder recorded the decision; the publishes then go broker by broker, so
  a commit that fails between them leaves the batch visible on some brokers until the replay
  (which finds the recorded decision) publishes it on the rest. Every row lands exactly once
  (exactly_once.py, eos_driver.py; ARCHITECTURE.md, "Batch ends").
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from tidemq.client.blocking import BlockingProducer
from tidemq.client.message import Message

from .broker_access import CLIENTS
from .exactly_once import TideMQEosStreamWriter, TideMQEosWriter
from .options import SinkOptions, parse_sink_options

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STRING_COLUMNS = ("topic", "tags", "keys", "shardingKey")
# Batch sends one write task keeps in flight: enough to hide the broker's round trip, few enough
# that a failing broker stops a task quickly.
SEND_BATCHES_IN_FLIGHT_MAX: Final = 4


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What one successful write task reports to the driver."""

    partition_id: int
    attempt: int
    rows: int


def check_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Raises ValueError naming the offending column when the input cannot be written."""
    fields = {field.name: field.dataType for field in schema.fields}
    body = fields.get("body")
    if body is None:
        raise ValueError("the tidemq sink needs a body column (binary or string)")
    if not isinstance(body, BinaryType | StringType):
        raise ValueError(f"column body must be binary or string, not {body.simpleString()}")
    for name in _STRING_COLUMNS:
        if name in fields and not isinstance(fields[name], StringType):
            raise ValueError(f"column {name} must be a string, not {fields[name].simpleString()}")
    properties = fields.get("properties")
    if properties is not None and not (
        isinstance(properties, MapType)
        and isinstance(properties.keyType, StringType)
        and isinstance(properties.valueType, StringType)
    ):
        raise ValueError("column properties must be a map<string,string>")
    if options.topic is None and "topic" not in fields:
        raise ValueError("give the sink a topic option or a topic column")


def _checked_options(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> SinkOptions:
    if overwrite:
        raise ValueError(
            "the tidemq sink only appends: overwrite (batch) and complete output mode "
            "(streaming) are not supported; use append or update"
        )
    parsed = parse_sink_options(options)
    check_input_schema(schema, parsed)
    return parsed


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceArrowWriter:
    parsed = _checked_options(options, schema, overwrite)
    if parsed.exactly_once:
        return TideMQEosWriter(parsed)
    return TideMQWriter(parsed)


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamArrowWriter:
    parsed = _checked_options(options, schema, overwrite)
    if parsed.exactly_once:
        return TideMQEosStreamWriter(parsed)
    return TideMQStreamWriter(parsed)


# -- executors ------------------------------------------------------------------------------


def batch_to_messages(
    batch: pa.RecordBatch, topic_option: str | None
) -> Iterator[tuple[Message, str | None]]:
    """(message, sharding key) per row of an input Arrow batch."""
    columns: dict[str, list[Any]] = {
        name: batch.column(name).to_pylist() for name in batch.schema.names
    }
    bodies = columns["body"]
    rows = len(bodies)
    nothing: list[Any] = [None] * rows
    topics = [topic_option] * rows if topic_option else columns.get("topic", nothing)
    tags = columns.get("tags", nothing)
    keys = columns.get("keys", nothing)
    properties = columns.get("properties", nothing)
    sharding = columns.get("shardingKey", nothing)
    for index in range(rows):
        body = bodies[index]
        if body is None:
            raise ValueError("a row has a null body; the tidemq sink cannot send it")
        if isinstance(body, str):
            body = body.encode()
        topic = topics[index]
        if not topic:
            raise ValueError("a row has no topic (null topic column and no topic option)")
        props = properties[index]
        yield (
            Message(
                topic,
                body,
                tags=tags[index] or None,
                keys=keys[index] or (),
                properties=dict(props) if props else {},
            ),
            sharding[index] or None,
        )


class SendWindow(Generic[T]):
    """Up to `window` calls of `send` in flight from one task (the blocking producer is
    thread-safe and pipelines concurrent sends on one connection). `wait_all` waits for all and
    re-raises the first failure, which fails the task so Spark retries it; `close` cancels what
    has not started."""

    def __init__(self, send: Callable[[T], object], window: int, thread_name_prefix: str) -> None:
        self._send = send
        self._window = window
        self._pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix=thread_name_prefix)
        self._in_flight: deque[Future[object]] = deque()

    def submit(self, item: T) -> None:
        while len(self._in_flight) >= self._window:
            self._in_flight.popleft().result()
        self._in_flight.append(self._pool.submit(self._send, item))

    def wait_all(self) -> None:
        while self._in_flight:
            self._in_flight.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def drain(self) -> None:
        try:
            self.wait_all()
        finally:
            self.close()


def send_all(
    producer: BlockingProducer, batches: Iterator[pa.RecordBatch], options: SinkOptions
) -> int:
    """Send every row; returns how many. Batches per topic, one by one with a sharding key
    (in row order: a key's rows keep their order in its queue)."""
    sent = 0
    pending: dict[str, list[Message]] = {}
    window = SendWindow(producer.send_batch, SEND_BATCHES_IN_FLIGHT_MAX, "tidemq-sink")
    try:
        for batch in batches:
            for message, sharding_key in batch_to_messages(batch, options.topic):
                if sharding_key is not None:
                    producer.send(message, sharding_key=sharding_key)
                    sent += 1
                    continue
                group = pending.setdefault(message.topic, [])
                group.append(message)
                if len(group) >= options.send_batch_size:
                    window.submit(group)
                    sent += len(group)
                    pending[message.topic] = []
        for group in pending.values():
            if group:
                window.submit(group)
                sent += len(group)
    finally:
        window.drain()
    return sent


def _write(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
    producer = CLIENTS.producer(
        options.name_server,
        options.producer_group,
        credentials=options.credentials,
        tls=options.tls,
    )
    rows = send_all(producer, batches, options)
    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    return SinkCommitMessage(partition_id=partition, attempt=attempt, rows=rows)


def _log_outcome(
    what: str, messages: Sequence[WriterCommitMessage | None], batch_id: int | None
) -> None:
    rows = sum(m.rows for m in messages if isinstance(m, SinkCommitMessage))
    logger.info(
        "tidemq sink %s batch %s: %d rows from %d tasks", what, batch_id, rows, len(messages)
    )


class TideMQWriter(DataSourceArrowWriter):
    """Batch writer (at least once)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_outcome("committed", messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # At least once: what the tasks sent stays sent.
        logger.warning("tidemq sink aborted; rows already sent stay in their topics")


class TideMQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (at least once)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_outcome("committed", messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning(
            "tidemq sink aborted batch %d; rows already sent stay in their topics", batchId
        )
