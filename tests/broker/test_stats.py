"""BrokerStats: counters per topic and group, and RocketMQ's minute/hour/day windows."""

from __future__ import annotations

import pytest

from tidemq.broker.stats import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SAMPLE_INTERVAL_MS,
    SIZE_BUCKETS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    BrokerStats,
)


class FakeNow:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def test_counters_by_topic_and_group() -> None:
    stats = BrokerStats("C", FakeNow())
    stats.put("T", 1, 100)
    stats.put("T", 3, 300)  # a batch of three
    stats.got("G", "T", 2, 200)
    stats.to_dlq("G", "T")
    stats.to_dlq("G", "T")
    assert stats.put_nums == {"T": 4}
    assert stats.put_bytes == {"T": 400}
    assert stats.get_nums == {("G", "T"): 2}
    assert stats.get_bytes == {("G", "T"): 200}
    assert stats.dlq_nums == {("G", "T"): 2}
    assert stats.broker_put_nums == 4
    assert stats.broker_get_nums == 2
    assert stats.size_buckets[0] == 4  # 100 bytes each: the 1 KiB bucket
    assert stats.size_sum == 400


def test_size_histogram_buckets() -> None:
    stats = BrokerStats("C", FakeNow())
    stats.put("T", 1, SIZE_BUCKETS[0] + 1)
    stats.put("T", 1, SIZE_BUCKETS[-1] + 1)
    assert stats.size_buckets[1] == 1
    assert stats.size_buckets[-1] == 1


def test_minute_window_from_samples() -> None:
    now = FakeNow()
    stats = BrokerStats("C", now)
    stats.put("T", 10, 1000)  # one batch of ten
    stats.sample()
    for _ in range(6):
        now.ms += SAMPLE_INTERVAL_MS
        stats.put("T", 10, 1000)
        stats.got("G", "T", 5, 50)
        stats.sample()
    minute = stats.window(TOPIC_PUT_NUMS, "T").minute
    # 7 samples kept: the oldest is the first tick (value 10), the newest 70: 60 in 60 s.
    assert minute.sum == 60
    assert minute.tps == pytest.approx(1.0)
    assert minute.avgpt == pytest.approx(10.0)
    assert stats.window(TOPIC_PUT_SIZE, "T").minute.sum == 6000
    assert stats.tps(TOPIC_PUT_NUMS, "T") == pytest.approx(1.0)
    got = stats.window(GROUP_GET_NUMS, "T@G").minute
    assert got.sum == 30  # first seen one tick after start: counted from zero
    assert stats.window(GROUP_GET_SIZE, "T@G").minute.sum == 300
    assert stats.window(BROKER_PUT_NUMS, "C").minute.sum == 60
    assert stats.window(BROKER_GET_NUMS, "C").minute.sum == 30
    assert stats.window(TOPIC_PUT_NUMS, "T").hour.sum == 10  # the first tick only
    assert stats.has(TOPIC_PUT_NUMS, "T")
    assert not stats.has(TOPIC_PUT_NUMS, "nope")
    assert stats.window(TOPIC_PUT_NUMS, "nope").minute.sum == 0
    with pytest.raises(KeyError):
        stats.window("NO_SUCH_STATS", "T")


def test_last_interval_rate() -> None:
    now = FakeNow()
    stats = BrokerStats("C", now)
    assert stats.last_interval_tps(TOPIC_PUT_NUMS, "T") == 0.0  # never sampled
    stats.put("T", 10, 1000)
    stats.sample()
    now.ms += SAMPLE_INTERVAL_MS
    stats.put("T", 30, 3000)
    stats.sample()
    # 30 between the two latest samples, 10 s apart (the first tick's 10 is older)
    assert stats.last_interval_tps(TOPIC_PUT_NUMS, "T") == pytest.approx(3.0)
