"""Broker fault avoidance for the producer: which brokers to skip for a while, and queue choice.

The rule (RocketMQ's latency fault tolerance, with its default tables):

    send latency (or failure)   broker skipped for
    < 550 ms                    0 (always eligible)
    ≥ 550 ms                    30 s
    ≥ 1 000 ms                  60 s
    ≥ 2 000 ms                  120 s
    ≥ 3 000 ms                  180 s
    ≥ 15 000 ms, or a failure   600 s  (a failed send counts as 30 000 ms)

A skipped broker is still used when every broker is skipped: fault avoidance may reduce choice,
never availability. Queue selection is round-robin over the topic's publish queues; after a failure
the retry prefers a queue on another broker than the one that just failed.

Readmission (TideMQ's addition; upstream 5.x has a similar optional "detector"). A failure's 600 s
would keep a broker that restarted in seconds out of the rotation for ten minutes. So a broker
skipped because a send to it *failed* is probed every PROBE_INTERVAL_MS (a HEART_BEAT with a
PROBE_TIMEOUT_MS deadline, client/fault_probe.py, which also makes the restarted broker know the
producer again); a probe that succeeds is charged like a send of its latency, so a fast answer
readmits the broker at once and a slow one skips it per the table. A broker skipped for being
slow is not probed: its skip is the table's, as upstream. Probes never carry messages, so a
broker that is still down costs no send an attempt.

    failed send ─▶ skipped, probe due in PROBE_INTERVAL_MS ──probe fails──▶ probe again later
                                        └─ probe answers in L ms ─▶ record(L): < 550 ms readmitted

Pure: the caller passes the monotonic time in, so tests drive it without sleeping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

# (latency threshold ms, skip duration ms), highest threshold first.
_SKIP_TABLE: Final[tuple[tuple[float, float], ...]] = (
    (15_000.0, 600_000.0),
    (3_000.0, 180_000.0),
    (2_000.0, 120_000.0),
    (1_000.0, 60_000.0),
    (550.0, 30_000.0),
)
# A failed send is charged as this latency (RocketMQ charges 30 s), so it lands in the top row.
FAILURE_LATENCY_MS: Final = 30_000.0
# Below the lowest threshold a broker is not skipped at all.
_NO_SKIP_BELOW_MS: Final = _SKIP_TABLE[-1][0]
# How often a broker skipped after a failed send is asked whether it answers again: the most a
# restarted broker waits for this producer's sends once it accepts (upstream's detector: 2 s).
PROBE_INTERVAL_MS: Final = 1_000.0
# A probe answered later than this counts as failed (the broker stays skipped); also bounds how
# long a probe of a hung broker occupies the prober.
PROBE_TIMEOUT_MS: Final = 1_000.0


def skip_duration_ms(latency_ms: float) -> float:
    """How long a broker is skipped after a send that took `latency_ms` (see the module table)."""
    for threshold_ms, skip_ms in _SKIP_TABLE:
        if latency_ms >= threshold_ms:
            return skip_ms
    return 0.0


class _HasBroker(Protocol):
    @property
    def broker_name(self) -> str: ...


Q = TypeVar("Q", bound=_HasBroker)


@dataclass(frozen=True, slots=True)
class _Fault:
    latency_ms: float
    eligible_at_ms: float
    # When its next probe is due if skipped for a failure (probed); None if skipped for being
    # slow (not probed).
    probe_at_ms: float | None = None


class FaultTracker:
    """Per-broker latency record and the time from which the broker is eligible again.

    `on_failure(broker_name)` is called after each failed send is recorded (the producer wakes
    its prober there)."""

    def __init__(self, on_failure: Callable[[str], None] | None = None) -> None:
        self._faults: dict[str, _Fault] = {}
        self._on_failure = on_failure

    def record(self, broker_name: str, latency_ms: float, now_ms: float, *, failed: bool) -> None:
        """Charge one send. A send faster than the lowest threshold clears the broker's record
        (it would make the broker eligible from now on, which an absent record says too): the
        common case then costs one dict check."""
        if not failed and latency_ms < _NO_SKIP_BELOW_MS:
            if self._faults:
                self._faults.pop(broker_name, None)
            return
        charged_ms = FAILURE_LATENCY_MS if failed else latency_ms
        eligible_at_ms = now_ms + skip_duration_ms(charged_ms)
        if not failed:
            self._faults[broker_name] = _Fault(charged_ms, eligible_at_ms)
            return
        # More failures while skipped (sends that were in flight) do not postpone the probe.
        previous = self._faults.get(broker_name)
        probe_at_ms = now_ms + PROBE_INTERVAL_MS
        if previous is not None and previous.probe_at_ms is not None:
            probe_at_ms = min(previous.probe_at_ms, probe_at_ms)
        self._faults[broker_name] = _Fault(charged_ms, eligible_at_ms, probe_at_ms)
        if self._on_failure is not None:
            self._on_failure(broker_name)

    def next_probe_in_ms(self, now_ms: float) -> float | None:
        """How long until a broker skipped for a failure is due a probe (<= 0: now), or None
        when no broker is skipped for a failure."""
        due = [
            f.probe_at_ms
            for f in self._faults.values()
            if f.probe_at_ms is not None and f.eligible_at_ms > now_ms
        ]
        return min(due) - now_ms if due else None

    def probes_due(self, now_ms: float) -> list[str]:
        """The brokers skipped for a failure whose probe is due; each is due again in
        PROBE_INTERVAL_MS unless a probe's answer is recorded meanwhile."""
        names = [
            name
            for name, f in self._faults.items()
            if f.probe_at_ms is not None and f.probe_at_ms <= now_ms < f.eligible_at_ms
        ]
        for name in names:
            self._faults[name] = dataclasses.replace(
                self._faults[name], probe_at_ms=now_ms + PROBE_INTERVAL_MS
            )
        return sorted(names)

    def is_available(self, broker_name: str, now_ms: float) -> bool:
        fault = self._faults.get(broker_name)
        return fault is None or now_ms >= fault.eligible_at_ms

    def remove(self, broker_name: str) -> None:
        self._faults.pop(broker_name, None)

    def least_bad(self, now_ms: float) -> str | None:
        """The recorded broker that becomes eligible first (None if nothing is recorded)."""
        if not self._faults:
            return None
        return min(self._faults, key=lambda name: self._faults[name].eligible_at_ms)


def select_queue(
    queues: Sequence[Q],
    start: int,
    faults: FaultTracker,
    now_ms: float,
    *,
    last_failed_broker: str | None = None,
) -> Q:
    """Round-robin from `start`, skipping unavailable brokers and then the last failed one.

    Preference order: (1) available broker other than `last_failed_broker`; (2) any other broker
    than `last_failed_broker`; (3) the queue at `start`.
    """
    assert queues, "select_queue needs at least one queue"
    count = len(queues)
    first = queues[start % count]
    if first.broker_name != last_failed_broker and faults.is_available(first.broker_name, now_ms):
        return first  # the common case, without building the whole order
    ordered = [queues[(start + step) % count] for step in range(count)]
    for queue in ordered:
        if queue.broker_name != last_failed_broker and faults.is_available(
            queue.broker_name, now_ms
        ):
            return queue
    for queue in ordered:
        if queue.broker_name != last_failed_broker:
            return queue
    return ordered[0]
