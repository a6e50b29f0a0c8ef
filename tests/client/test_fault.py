from __future__ import annotations

import pytest

from tidemq.client.fault import FaultTracker, select_queue, skip_duration_ms
from tidemq.protocol.bodies import MessageQueue


@pytest.mark.parametrize(
    ("latency_ms", "skip_ms"),
    [
        (0, 0),
        (549, 0),
        (550, 30_000),
        (999, 30_000),
        (1_000, 60_000),
        (2_000, 120_000),
        (3_000, 180_000),
        (14_999, 180_000),
        (15_000, 600_000),
        (30_000, 600_000),
    ],
)
def test_skip_table(latency_ms, skip_ms):
    assert skip_duration_ms(latency_ms) == skip_ms


def test_failed_broker_is_skipped_until_its_time():
    faults = FaultTracker()
    faults.record("a", 10.0, now_ms=1_000.0, failed=False)
    assert faults.is_available("a", 1_000.0)
    faults.record("a", 10.0, now_ms=1_000.0, failed=True)
    assert not faults.is_available("a", 1_000.0 + 599_999)
    assert faults.is_available("a", 1_000.0 + 600_000)
    faults.record("b", 700.0, now_ms=0.0, failed=False)
    assert faults.least_bad(0.0) == "b"
    faults.remove("a")
    assert faults.is_available("a", 0.0)


QUEUES = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]


def test_round_robin_without_faults():
    faults = FaultTracker()
    picks = [select_queue(QUEUES, i, faults, 0.0) for i in range(5)]
    assert picks == [*QUEUES, QUEUES[0]]


def test_skips_unavailable_broker_and_last_failed_broker():
    faults = FaultTracker()
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    assert select_queue(QUEUES, 0, faults, 1.0).broker_name == "b"
    clean = FaultTracker()
    assert select_queue(QUEUES, 0, clean, 0.0, last_failed_broker="a").broker_name == "b"


def test_falls_back_when_everything_is_skipped():
    faults = FaultTracker()
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    faults.record("b", 0.0, now_ms=0.0, failed=True)
    # Not the last failed broker, even though unavailable.
    assert select_queue(QUEUES, 0, faults, 1.0, last_failed_broker="a").broker_name == "b"
    only_a = [q for q in QUEUES if q.broker_name == "a"]
    assert select_queue(only_a, 1, faults, 1.0, last_failed_broker="a") == only_a[1]


def test_fast_send_clears_the_record_and_slow_send_sets_one():
    faults = FaultTracker()
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    assert not faults.is_available("a", 1.0)
    faults.record("a", 549.0, now_ms=1.0, failed=False)  # a later send, picked anyway, was fast
    assert faults.is_available("a", 1.0)
    assert faults.least_bad(1.0) is None
    faults.record("a", 550.0, now_ms=2.0, failed=False)
    assert not faults.is_available("a", 2.0 + 29_999)
    assert faults.is_available("a", 2.0 + 30_000)
