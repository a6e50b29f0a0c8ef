"""Time, injected: wall-clock milliseconds for stored timestamps, monotonic for timeouts.

Code under protocol/ and store/ never reads the time itself; it is handed a Clock, so tests and
simulations can drive time with a fake.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (stored in records)."""
        ...

    def monotonic_ms(self) -> float:
        """Milliseconds on a clock that never goes back (for intervals and timeouts)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000


class FakeClock:
    """A clock that moves only when told to. For tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._monotonic_ms = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> float:
        return self._monotonic_ms

    def advance(self, ms: float) -> None:
        assert ms >= 0
        self._now_ms += int(ms)
        self._monotonic_ms += ms
