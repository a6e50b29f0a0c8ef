"""What HAMaster reports of its slaves (SlaveInfo), and LagSamples: how long the first byte a
slave lacks has been in the master's log (lag_ms).

    append pass ──▶ (log end, monotonic ms), at most one per LAG_SAMPLE_INTERVAL_MS
                    deque [(end₁, t₁) (end₂, t₂) …]   end₁ < end₂ < …,  at most LAG_SAMPLES_MAX
    lag_ms(acked) = now - t of the first sample whose end > acked
    trim(slowest) ──▶ popleft while the next sample's end <= every slave's acked

A slave's lag in bytes is a subtraction; its lag in time needs when each offset was appended,
and one sample per interval is enough for a figure an operator reads (it errs at most one
interval high). Samples every slave has passed are dropped, and the count is bounded, so a
stalled slave costs a fixed amount of memory (its lag is then counted from the oldest kept).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Protocol

# Lag samples: (log end, time) at most one per interval, the oldest dropped past the count.
LAG_SAMPLE_INTERVAL_MS: Final = 10
LAG_SAMPLES_MAX: Final = 4096


@dataclass(frozen=True, slots=True)
class SlaveInfo:
    addr: str
    broker_id: int
    acked_offset: int
    lag_bytes: int
    lag_ms: int
    connected_since_ms: int  # wall clock


class SlaveLink(Protocol):
    """What a slave's info needs of HAMaster's link."""

    addr: str
    broker_id: int
    connected_since_ms: int  # wall clock
    streaming_since_ms: float  # monotonic


class LagSamples:
    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=LAG_SAMPLES_MAX)

    def appended(self, end: int, now_ms: float) -> None:
        """The log grew to `end` at `now_ms`."""
        samples = self._samples
        if samples and now_ms - samples[-1][1] < LAG_SAMPLE_INTERVAL_MS:
            samples[-1] = (end, samples[-1][1])  # lag_ms errs at most one interval high
        else:
            samples.append((end, now_ms))

    def trim(self, slowest: int) -> None:
        """Every slave acknowledged `slowest`: samples before it answer nobody's lag."""
        samples = self._samples
        while len(samples) > 1 and samples[0][0] <= slowest:
            samples.popleft()

    def lag_ms(self, acked: int, end: int, now_ms: float, streaming_since_ms: float) -> float:
        """How long the first byte past `acked` has been in the log (0: the slave lacks none;
        appended before any sample: counted from when the slave started streaming)."""
        if acked >= end:
            return 0.0
        for sample_end, sample_ms in self._samples:
            if sample_end > acked:
                return max(0.0, now_ms - sample_ms)
        return now_ms - streaming_since_ms  # appended before this master started

    def slave_info(self, link: SlaveLink, acked: int, end: int, now_ms: float) -> SlaveInfo:
        """The slave of `link`, which acknowledged `acked`, as the log ends at `end`."""
        return SlaveInfo(
            addr=link.addr,
            broker_id=link.broker_id,
            acked_offset=acked,
            lag_bytes=max(0, end - acked),
            lag_ms=int(self.lag_ms(acked, end, now_ms, link.streaming_since_ms)),
            connected_since_ms=link.connected_since_ms,
        )
