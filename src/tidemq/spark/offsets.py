"""Offsets as Spark sees them, admission control and partition planning: pure functions.

Spark keeps a streaming source's progress as JSON in the checkpoint and decides "is there new
data" by comparing JSON strings, so the same offsets must always serialise the same way. Our
offset is the next queue offset to read, per queue, nested as

    {"TopicA": {"broker-a": {"0": 17, "1": 4}, "broker-b": {"0": 9}}}

with topics, broker names and queue ids (numerically) sorted at every level.

Admission control (`split_limit`) shares a row budget over queues in proportion to their
backlog, giving every queue with a backlog at least one offset while the budget allows, so a
small queue is never starved by a big one. When the budget is smaller than the number of
backlogged queues, a rotating start decides which queues go first, so each gets its turn.

Planning (`plan_ranges`) turns (start, end) into read ranges: one per queue, split into pieces
of at most `max_records_per_partition` offsets and into at least `min_partitions` pieces overall.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId)
Offsets = dict[QueueKey, int]


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, Any]:
    """The deterministic nested dict Spark stores (see the module docstring)."""
    nested: dict[str, Any] = {}
    for topic, broker, queue_id in sorted(offsets):
        nested.setdefault(topic, {}).setdefault(broker, {})[str(queue_id)] = offsets[
            (topic, broker, queue_id)
        ]
    return nested


def offsets_from_json(nested: Mapping[str, Any]) -> Offsets:
    """Inverse of `offsets_to_json`.

    Raises:
        ValueError: the value is not of that shape (a checkpoint from another source).
    """
    offsets: Offsets = {}
    try:
        for topic, brokers in nested.items():
            for broker, queues in brokers.items():
                for queue_id, offset in queues.items():
                    offsets[(str(topic), str(broker), int(queue_id))] = int(offset)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a TideMQ offset: {nested!r}") from exc
    return offsets


def backlog(start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int]) -> dict[QueueKey, int]:
    """Offsets not yet read per queue of `latest` (a queue missing from `start` has all)."""
    return {key: max(0, end - start.get(key, end)) for key, end in latest.items()}


def split_limit(
    start: Mapping[QueueKey, int],
    latest: Mapping[QueueKey, int],
    limit: int,
    *,
    rotation: int = 0,
) -> Offsets:
    """End offsets that admit at most `limit` offsets past `start`, none beyond `latest`.

    Every queue of `latest` appears in the result. A queue's share is proportional to its
    backlog (largest remainder), with at least one offset for each backlogged queue while the
    budget lasts; `rotation` picks which queues go first when it does not.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    pending = {key: count for key, count in backlog(start, latest).items() if count > 0}
    end: Offsets = {key: start.get(key, latest[key]) for key in latest}
    total = sum(pending.values())
    if total <= limit:
        return dict(latest)
    keys = sorted(pending)
    if len(keys) > limit:
        # Not even one offset per queue: a rotating window of queues gets one each.
        for index in range(limit):
            key = keys[(rotation + index) % len(keys)]
            end[key] += 1
        return end
    share = dict.fromkeys(keys, 1)
    rest = limit - len(keys)
    weights = {key: pending[key] - 1 for key in keys}
    weight_total = sum(weights.values())
    if rest > 0 and weight_total > 0:
        exact = {key: rest * weights[key] / weight_total for key in keys}
        floors = {key: min(weights[key], math.floor(exact[key])) for key in keys}
        left = rest - sum(floors.values())
        by_remainder = sorted(keys, key=lambda key: (floors[key] - exact[key], key))
        for key in by_remainder:
            if left == 0:
                break
            if floors[key] < weights[key]:
                floors[key] += 1
                left -= 1
        for key in keys:
            share[key] += floors[key]
    for key in keys:
        end[key] += share[key]
        assert end[key] <= latest[key]
    return end


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Offsets [start_offset, end_offset) of one queue: what one input partition reads."""

    topic: str
    broker_name: str
    queue_id: int
    start_offset: int
    end_offset: int

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.broker_name, self.queue_id)

    @property
    def size(self) -> int:
        return self.end_offset - self.start_offset


def plan_ranges(
    start: Mapping[QueueKey, int],
    end: Mapping[QueueKey, int],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[QueueRange]:
    """Non-empty read ranges covering [start, end) of every queue of `end`, in queue order.

    A queue missing from `start` is read from 0: the caller fills in where new queues begin.
    """
    whole = [
        QueueRange(key[0], key[1], key[2], start.get(key, 0), end[key])
        for key in sorted(end)
        if end[key] > start.get(key, 0)
    ]
    piece_max = max_records_per_partition or 0
    total = sum(item.size for item in whole)
    if min_partitions and len(whole) < min_partitions and total > 0:
        by_count = math.ceil(total / min_partitions)
        piece_max = min(piece_max, by_count) if piece_max else by_count
    if not piece_max:
        return whole
    return list(_split(whole, piece_max))


def _split(ranges: Iterable[QueueRange], piece_max: int) -> Iterable[QueueRange]:
    for item in ranges:
        pieces = math.ceil(item.size / piece_max)
        step = math.ceil(item.size / pieces)  # even pieces rather than one short tail
        for first in range(item.start_offset, item.end_offset, step):
            yield QueueRange(
                item.topic,
                item.broker_name,
                item.queue_id,
                first,
                min(first + step, item.end_offset),
            )
