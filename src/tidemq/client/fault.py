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

Pure: the caller passes the monotonic time in, so tests drive it without sleeping.
"""

from __future__ import annotations

from collections.abc import Sequence
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


class FaultTracker:
    """Per-broker latency record and the time from which the broker is eligible again."""

    def __init__(self) -> None:
        self._faults: dict[str, _Fault] = {}

    def record(self, broker_name: str, latency_ms: float, now_ms: float, *, failed: bool) -> None:
        """Charge one send. A send faster than the lowest threshold clears the broker's record
        (it would make the broker eligible from now on, which an absent record says too): the
        common case then costs one dict check."""
        if not failed and latency_ms < _NO_SKIP_BELOW_MS:
            if self._faults:
                self._faults.pop(broker_name, None)
            return
        charged_ms = FAILURE_LATENCY_MS if failed else latency_ms
        self._faults[broker_name] = _Fault(charged_ms, now_ms + skip_duration_ms(charged_ms))

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
