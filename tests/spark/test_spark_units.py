"""Pieces of the connector that need neither Spark nor a broker: the stream reader's admission
decisions on a fake clock, and the prefetching of pulls."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

from tidemq.clock import FakeClock
from tidemq.spark.broker_access import prefetched
from tidemq.spark.options import parse_source_options
from tidemq.spark.source import TideMQStreamReader

A, B = ("T", "b", 0), ("T", "b", 1)


def reader(clock: FakeClock, **options: str) -> TideMQStreamReader:
    parsed = parse_source_options({"nameServer": "h:1", "topic": "T", **options}, streaming=True)
    return TideMQStreamReader(parsed, clock=clock)


def test_min_offsets_wait_until_max_trigger_delay() -> None:
    clock = FakeClock()
    stream = reader(clock, minOffsetsPerTrigger="10", maxTriggerDelay="2s")
    limit = stream.getDefaultReadLimit()
    assert isinstance(limit, ReadMinRows)
    assert stream._admit({A: 0}, {A: 5}, limit) == {A: 0}
    clock.advance(1999)
    assert stream._admit({A: 0}, {A: 5}, limit) == {A: 0}
    clock.advance(1)
    assert stream._admit({A: 0}, {A: 5}, limit) == {A: 5}


def test_min_offsets_admits_once_enough_and_new_queues_enter() -> None:
    stream = reader(FakeClock(), minOffsetsPerTrigger="10")
    limit = stream.getDefaultReadLimit()
    # Not enough yet, but a new queue still joins (at the offset it entered with).
    assert stream._admit({A: 0}, {A: 5, B: 3}, limit) == {A: 0, B: 3}
    assert stream._admit({A: 0}, {A: 12}, limit) == {A: 12}


def test_max_offsets_per_trigger_uses_the_engine_limit() -> None:
    stream = reader(FakeClock(), maxOffsetsPerTrigger="4")
    limit = stream.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows)
    assert limit.max_rows == 4
    end = stream._admit({A: 0, B: 0}, {A: 100, B: 1}, limit)
    assert end == {A: 3, B: 1}


def test_prefetched_keeps_order_and_raises_in_place() -> None:
    def source() -> Iterator[int]:
        yield from range(10)
        raise ValueError("broker said no")

    items = prefetched(source(), depth=2)
    assert [next(items) for _ in range(10)] == list(range(10))
    with pytest.raises(ValueError, match="broker said no"):
        next(items)


def test_prefetched_stops_its_helper_when_closed() -> None:
    produced: list[int] = []

    def endless() -> Iterator[int]:
        n = 0
        while True:
            produced.append(n)
            yield n
            n += 1

    before = threading.active_count()
    items = prefetched(endless(), depth=2)
    assert next(items) == 0
    items.close()
    assert threading.active_count() == before
    assert len(produced) <= 4  # bounded read-ahead: depth + the one in hand + one blocked
