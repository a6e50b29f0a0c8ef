"""The source: `spark.read.format("tidemq")` (batch) and `spark.readStream.format("tidemq")`.

Where each part runs (spec §3.1): planning (`partitions`, and for streams `initialOffset`,
`latestOffset`, `commit`) runs in a driver-side Python process — for a stream, one long-lived
process per query, so the stream reader may keep the admission-control rotation, the
AvailableNow target and the last trigger time. `read` runs in executor workers and is stateless:
everything it needs travels in the pickled reader and partition.

Offsets are the next queue offset per queue (offsets.py). Queues that appear mid-query enter
with an end offset equal to their minimum offset (nothing read in that batch), so the next
batch starts them at earliest; replays stay deterministic because `partitions` never asks a
broker where a queue begins. Only the data topics are read: the half, op, schedule, retry and
DLQ topics never match (options.is_hidden_topic), and committed transactional messages are
appended to their real queue by the broker, so a reader sees only committed messages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemq.client.blocking import BlockingPullConsumer
from tidemq.client.message import MessageExt
from tidemq.clock import Clock, SystemClock
from tidemq.protocol.bodies import MessageQueue

from .broker_access import (
    CLIENTS,
    READER_GROUP_DEFAULT,
    QueueBounds,
    data_loss,
    fetch_bounds,
    first_offset_at,
    prefetched,
    read_range,
)
from .offsets import (
    Offsets,
    QueueKey,
    QueueRange,
    backlog,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    split_limit,
)
from .options import (
    EARLIEST,
    LATEST,
    OffsetChoice,
    SourceOptions,
    parse_bool,
    parse_source_options,
)
from .schema import messages_to_batch, source_arrow_schema, source_ddl

logger = logging.getLogger(__name__)


class TideMQDataSource(DataSource):
    """The `tidemq` format. Register once per session:
    `spark.dataSource.register(TideMQDataSource)`."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def _include_properties(self) -> bool:
        value = {key.lower(): value for key, value in self.options.items()}.get("includeproperties")
        return parse_bool("includeProperties", value, default=False)

    def schema(self) -> str:
        return source_ddl(self._include_properties())

    def reader(self, schema: StructType) -> DataSourceReader:
        return TideMQBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TideMQStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import stream_writer

        return stream_writer(self.options, schema, overwrite)


# -- planning (driver) ----------------------------------------------------------------------


def _consumer(options: SourceOptions) -> BlockingPullConsumer:
    group = options.consumer_group or READER_GROUP_DEFAULT
    return CLIENTS.get(
        options.name_server, group, credentials=options.credentials, tls=options.tls
    ).consumer


def _bounds(options: SourceOptions) -> QueueBounds:
    group = options.consumer_group or READER_GROUP_DEFAULT
    clients = CLIENTS.get(
        options.name_server, group, credentials=options.credentials, tls=options.tls
    )
    return fetch_bounds(options, clients.admin)


def _from_spec(
    what: str, spec: Mapping[str, Mapping[str, Mapping[int, int]]], keys: Sequence[QueueKey]
) -> dict[QueueKey, int]:
    values: dict[QueueKey, int] = {}
    missing: list[str] = []
    for key in keys:
        value = spec.get(key[0], {}).get(key[1], {}).get(key[2])
        if value is None:
            missing.append(f"{key[0]}/{key[1]}/{key[2]}")
        else:
            values[key] = value
    if missing:
        raise ValueError(f"option {what} gives no value for the queues {', '.join(missing)}")
    return values


def resolve_offsets(
    options: SourceOptions, choice: OffsetChoice, bounds: QueueBounds, *, starting: bool
) -> Offsets:
    """Where each queue of `bounds` starts (or ends) under `choice`.

    Raises:
        ValueError: a per-queue option misses a queue, or a timestamp matches nothing and
            startingOffsetsByTimestampStrategy is error.
    """
    keys = sorted(bounds.max_offsets)
    prefix = "starting" if starting else "ending"
    if choice.kind == "earliest":
        return {key: bounds.min_offsets[key] for key in keys}
    if choice.kind == "latest":
        return {key: bounds.max_offsets[key] for key in keys}
    if choice.kind == "offsets":
        assert choice.spec is not None
        given = _from_spec(f"{prefix}Offsets", choice.spec, keys)
        special = {EARLIEST: bounds.min_offsets, LATEST: bounds.max_offsets}
        return {
            key: special[value][key] if value in special else value for key, value in given.items()
        }
    if choice.kind == "timestamp":
        assert choice.timestamp_ms is not None
        stamps = dict.fromkeys(keys, choice.timestamp_ms)
    else:
        assert choice.spec is not None
        stamps = _from_spec(f"{prefix}OffsetsByTimestamp", choice.spec, keys)
    consumer = _consumer(options)
    resolved: Offsets = {}
    for key, stamp in stamps.items():
        offset = first_offset_at(consumer, key, stamp)
        no_match = offset >= bounds.max_offsets[key] > bounds.min_offsets[key]
        if starting and no_match and not options.timestamp_no_match_latest:
            raise ValueError(
                f"no message of {key[0]}/{key[1]}/{key[2]} was stored at or after {stamp}; "
                "set startingOffsetsByTimestampStrategy=latest to start at the end instead"
            )
        resolved[key] = min(offset, bounds.max_offsets[key])
    return resolved


def _arrow_batches(
    options: SourceOptions, partition: InputPartition, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    item: QueueRange | None = partition.value
    if item is None:
        # Spark plans one partition of value None when `partitions()` returned none.
        return
    pending: list[MessageExt] = []
    for messages in prefetched(read_range(_consumer(options), item, options)):
        pending.extend(messages)
        if len(pending) >= options.arrow_batch_rows:
            yield messages_to_batch(pending, schema, options.include_properties)
            pending = []
    if pending:
        yield messages_to_batch(pending, schema, options.include_properties)


def _partitions(options: SourceOptions, start: Offsets, end: Offsets) -> list[InputPartition]:
    ranges = plan_ranges(
        start,
        end,
        min_partitions=options.min_partitions,
        max_records_per_partition=options.max_records_per_partition,
    )
    return [InputPartition(item) for item in ranges]


# -- batch ----------------------------------------------------------------------------------


class TideMQBatchReader(DataSourceReader):
    """Reads [startingOffsets, endingOffsets) of every queue, one partition per queue (split)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.arrow_schema = source_arrow_schema(options.include_properties)

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        bounds = _bounds(options)
        start = resolve_offsets(options, options.starting, bounds, starting=True)
        end = resolve_offsets(options, options.ending, bounds, starting=False)
        for key in sorted(end):
            if start[key] > end[key]:
                raise ValueError(
                    f"{key[0]}/{key[1]}/{key[2]}: the starting offset {start[key]} is after "
                    f"the ending offset {end[key]}"
                )
            if start[key] < bounds.min_offsets[key]:
                data_loss(
                    options,
                    f"startingOffsets {start[key]} of {key[0]}/{key[1]}/{key[2]} is below its "
                    f"minimum offset {bounds.min_offsets[key]}",
                )
                start[key] = min(bounds.min_offsets[key], end[key])
        return _partitions(options, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _arrow_batches(self.options, partition, self.arrow_schema)


# -- streaming ------------------------------------------------------------------------------


class TideMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with admission control and AvailableNow (see the module docstring)."""

    def __init__(self, options: SourceOptions, clock: Clock | None = None) -> None:
        self.options = options
        self.arrow_schema = source_arrow_schema(options.include_properties)
        self._clock: Clock = clock or SystemClock()
        self._target: Offsets | None = None  # AvailableNow: never read past these
        self._latest: Offsets | None = None
        self._rotation = 0
        self._last_trigger_ms: float | None = None

    def initialOffset(self) -> dict[str, Any]:
        bounds = _bounds(self.options)
        start = resolve_offsets(self.options, self.options.starting, bounds, starting=True)
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = dict(_bounds(self.options).max_offsets)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def _available(self, start: Offsets) -> Offsets:
        """Per queue, how far this batch may go before limits: the brokers' max offsets (capped
        by the AvailableNow target); new queues at their minimum; vanished queues at start."""
        bounds = _bounds(self.options)
        latest: Offsets = {}
        for key, offset in bounds.max_offsets.items():
            if key not in start:
                logger.info("queue %s/%s/%d joins the query at earliest", *key)
                latest[key] = bounds.min_offsets[key]
                continue
            if self._target is not None:
                offset = min(offset, self._target.get(key, start[key]))
            latest[key] = max(offset, start[key])
        for key in sorted(set(start) - set(bounds.max_offsets)):
            data_loss(self.options, f"queue {key[0]}/{key[1]}/{key[2]} is gone")
            latest[key] = start[key]
        self._latest = dict(bounds.max_offsets)
        return latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start_offsets = offsets_from_json(start)
        latest = self._available(start_offsets)
        end = latest
        if not isinstance(limit, ReadAllAvailable):
            end = self._admit(start_offsets, latest, limit)
        if end == start_offsets:
            return start
        self._last_trigger_ms = self._clock.monotonic_ms()
        return offsets_to_json(end)

    def _admit(self, start: Offsets, latest: Offsets, limit: ReadLimit) -> Offsets:
        options = self.options
        pending = sum(backlog(start, latest).values())
        min_rows = options.min_offsets_per_trigger
        if isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        if min_rows is not None and pending < min_rows and self._target is None:
            now = self._clock.monotonic_ms()
            if self._last_trigger_ms is None:
                self._last_trigger_ms = now
            if now - self._last_trigger_ms < options.max_trigger_delay_ms:
                # Only new queues may enter (at their minimum, reading nothing).
                return {key: start.get(key, offset) for key, offset in latest.items()}
        max_rows = options.max_offsets_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        if max_rows is None:
            return latest
        self._rotation += 1
        return split_limit(start, latest, max_rows, rotation=self._rotation)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        end_offsets = offsets_from_json(end)
        start_offsets = offsets_from_json(start)
        # A queue new in `end` entered at its minimum: nothing of it is read in this batch.
        filled = {key: start_offsets.get(key, offset) for key, offset in end_offsets.items()}
        return _partitions(self.options, filled, end_offsets)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _arrow_batches(self.options, partition, self.arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Store `end` as the consumerGroup's offsets (advisory: lag tools read them)."""
        group = self.options.consumer_group
        if group is None:
            return
        consumer = _consumer(self.options)
        for (topic, broker, queue_id), offset in offsets_from_json(end).items():
            mq = MessageQueue(topic=topic, broker_name=broker, queue_id=queue_id)
            try:
                consumer.update_consumer_offset(mq, offset)
            except Exception:
                # Advisory only: a lag display that is one commit behind harms nothing.
                logger.warning("could not store %s's offset for %s", group, mq, exc_info=True)

    def stop(self) -> None:
        CLIENTS.close()
