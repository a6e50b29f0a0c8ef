"""Readmission of a broker skipped after a failed send (client/fault.py, client/fault_probe.py)."""

from __future__ import annotations

import pytest

from tidemq.client.fault import PROBE_INTERVAL_MS, FaultTracker
from tidemq.client.fault_probe import BrokerProber
from tidemq.clock import FakeClock, SystemClock
from tidemq.errors import ConnectionClosedError
from tidemq.testing import eventually


def test_a_failed_broker_is_due_a_probe_and_a_fast_answer_readmits_it():
    failed: list[str] = []
    faults = FaultTracker(on_failure=failed.append)
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    assert failed == ["a"]
    assert faults.next_probe_in_ms(0.0) == PROBE_INTERVAL_MS
    assert faults.probes_due(PROBE_INTERVAL_MS - 1) == []
    assert faults.probes_due(PROBE_INTERVAL_MS) == ["a"]
    assert faults.probes_due(PROBE_INTERVAL_MS) == []  # due again one interval later
    assert faults.next_probe_in_ms(PROBE_INTERVAL_MS) == PROBE_INTERVAL_MS
    faults.record("a", 5.0, now_ms=PROBE_INTERVAL_MS, failed=False)  # the probe's answer
    assert faults.is_available("a", PROBE_INTERVAL_MS)
    assert faults.next_probe_in_ms(PROBE_INTERVAL_MS) is None


def test_a_slow_probe_answer_skips_per_the_table():
    faults = FaultTracker()
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    faults.record("a", 1_000.0, now_ms=1_000.0, failed=False)
    assert not faults.is_available("a", 1_000.0 + 59_999)
    assert faults.next_probe_in_ms(1_000.0) is None  # skipped for slowness: not probed


def test_a_slow_broker_is_not_probed_and_more_failures_do_not_postpone_the_probe():
    faults = FaultTracker()
    faults.record("slow", 3_000.0, now_ms=0.0, failed=False)
    assert faults.next_probe_in_ms(0.0) is None
    faults.record("a", 0.0, now_ms=0.0, failed=True)
    faults.record("a", 0.0, now_ms=900.0, failed=True)  # a send that was in flight
    assert faults.probes_due(PROBE_INTERVAL_MS) == ["a"]


async def test_prober_readmits_once_the_broker_answers_and_then_stops():
    answers = {"a": False}
    probed: list[str] = []

    async def probe(broker_name: str, timeout_ms: float) -> None:
        probed.append(broker_name)
        if not answers[broker_name]:
            raise ConnectionClosedError("connect refused")

    faults = FaultTracker(on_failure=lambda name: prober.wake(name))  # as the producer does
    prober = BrokerProber(faults, probe, SystemClock())
    faults.record("a", 0.0, SystemClock().monotonic_ms(), failed=True)
    await eventually(lambda: len(probed) >= 1, 5.0)
    assert not faults.is_available("a", SystemClock().monotonic_ms())
    answers["a"] = True
    await eventually(lambda: faults.is_available("a", SystemClock().monotonic_ms()), 5.0)
    assert prober.readmitted == 1
    await prober.stop()


@pytest.mark.parametrize(("charge_latency", "readmitted"), [(True, False), (False, True)])
async def test_a_slow_probe_answer_is_charged_only_where_latency_counts(
    charge_latency: bool, readmitted: bool
) -> None:
    """The send path charges a probe's 700 ms (skipped 30 s); the read path does not."""
    clock = FakeClock()

    async def probe(broker_name: str, timeout_ms: float) -> None:
        clock.advance(700)

    faults = FaultTracker(on_failure=lambda name: prober.wake(name))
    prober = BrokerProber(faults, probe, clock, charge_latency=charge_latency)
    faults.record("a", 0.0, clock.monotonic_ms(), failed=True)
    clock.advance(PROBE_INTERVAL_MS)
    try:
        await eventually(lambda: faults.next_probe_in_ms(clock.monotonic_ms()) is None, 2.0)
    finally:
        await prober.stop()
    assert faults.is_available("a", clock.monotonic_ms()) is readmitted
