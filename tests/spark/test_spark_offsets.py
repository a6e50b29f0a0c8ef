"""Offsets JSON, admission control and partition planning (pure; no Spark needed)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.spark.offsets import (
    QueueRange,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    split_limit,
)


def test_offsets_json_is_sorted_and_round_trips() -> None:
    offsets = {("T", "broker-b", 10): 5, ("T", "broker-a", 2): 1, ("S", "broker-a", 0): 7}
    nested = offsets_to_json(offsets)
    assert json.dumps(nested) == (
        '{"S": {"broker-a": {"0": 7}}, "T": {"broker-a": {"2": 1}, "broker-b": {"10": 5}}}'
    )
    assert offsets_from_json(json.loads(json.dumps(nested))) == offsets
    # Same offsets inserted in another order serialise identically (Spark compares strings).
    assert json.dumps(offsets_to_json(dict(reversed(offsets.items())))) == json.dumps(nested)


def test_offsets_from_json_rejects_foreign_shape() -> None:
    with pytest.raises(ValueError, match="not a TideMQ offset"):
        offsets_from_json({"topic": 3})


A, B, C = ("T", "b", 0), ("T", "b", 1), ("T", "b", 2)


def test_split_limit_everything_fits() -> None:
    assert split_limit({A: 0, B: 0}, {A: 3, B: 4}, 10) == {A: 3, B: 4}


def test_split_limit_proportional_and_never_starves_small_queue() -> None:
    end = split_limit({A: 0, B: 0, C: 0}, {A: 1000, B: 10, C: 1}, 100)
    assert sum(end.values()) == 100
    assert end[C] == 1  # the tiny queue still advances
    assert end[B] >= 1
    assert end[A] > end[B]


def test_split_limit_smaller_than_queue_count_rotates() -> None:
    start = {A: 0, B: 0, C: 0}
    latest = {A: 5, B: 5, C: 5}
    chosen = set()
    for rotation in range(3):
        end = split_limit(start, latest, 1, rotation=rotation)
        assert sum(end.values()) == 1
        chosen |= {key for key in end if end[key] == 1}
    assert chosen == {A, B, C}


def test_split_limit_new_queue_is_kept_at_latest() -> None:
    end = split_limit({A: 0}, {A: 10, B: 3}, 4)
    assert end == {A: 4, B: 3}


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 500)), min_size=1, max_size=6),
    st.integers(0, 300),
    st.integers(0, 10),
)
def test_split_limit_properties(queues: list[tuple[int, int]], limit: int, rotation: int) -> None:
    start = {("T", "b", i): s for i, (s, _) in enumerate(queues)}
    latest = {("T", "b", i): s + n for i, (s, n) in enumerate(queues)}
    end = split_limit(start, latest, limit, rotation=rotation)
    assert set(end) == set(latest)
    admitted = sum(end[k] - start[k] for k in end)
    total = sum(latest[k] - start[k] for k in end)
    assert admitted == min(limit, total)
    for key in end:
        assert start[key] <= end[key] <= latest[key]
    backlogged = [k for k in end if latest[k] > start[k]]
    if limit >= len(backlogged):
        assert all(end[k] > start[k] for k in backlogged)


def test_plan_ranges_one_per_queue_skipping_empty() -> None:
    ranges = plan_ranges({A: 0, B: 5}, {A: 10, B: 5})
    assert ranges == [QueueRange("T", "b", 0, 0, 10)]


def test_plan_ranges_max_records_per_partition() -> None:
    ranges = plan_ranges({A: 0}, {A: 10}, max_records_per_partition=4)
    assert [(r.start_offset, r.end_offset) for r in ranges] == [(0, 4), (4, 8), (8, 10)]


def test_plan_ranges_min_partitions_splits_big_queues() -> None:
    ranges = plan_ranges({A: 0, B: 0}, {A: 90, B: 10}, min_partitions=5)
    assert len(ranges) >= 5
    assert sum(r.size for r in ranges) == 100
    covered_a = sorted((r.start_offset, r.end_offset) for r in ranges if r.queue_id == 0)
    assert covered_a[0][0] == 0
    assert covered_a[-1][1] == 90
    for left, right in itertools.pairwise(covered_a):
        assert left[1] == right[0]
