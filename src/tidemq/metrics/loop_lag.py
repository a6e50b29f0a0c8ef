"""LoopLagMonitor: how late the event loop runs what is due (issue 18).

Every server is one event loop: a handler that computes for 200 ms delays every other request
by as much. The monitor sleeps PROBE_INTERVAL_S and measures how much later than asked it woke;
the excess is the time the loop spent on something else that could not yield. The last minute
of probes gives the p50, p99 and max that `tidemq_event_loop_lag_seconds` exports; one probe
over LAG_WARN_S is logged (WARNING, at most once per LAG_WARN_EVERY_S) with the loop's task
count and how much of the delay was garbage collection (the process's GcPauses, read around
each probe). Which callback ran long is asyncio's debug mode's to say (PYTHONASYNCIODEBUG=1 logs
every callback over loop.slow_callback_duration); it costs too much to keep on.

Cost: one timer per PROBE_INTERVAL_S (20 wake-ups a second) and a 1,200-entry ring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Final

from tidemq.metrics.gc_pauses import process_gc_pauses

log = logging.getLogger(__name__)

PROBE_INTERVAL_S: Final = 0.05
WINDOW_S: Final = 60.0
LAG_WARN_S: Final = 0.1
LAG_WARN_EVERY_S: Final = 10.0
QUANTILES: Final = (0.5, 0.99, 1.0)


class LoopLagMonitor:
    """Measures the running loop's scheduling delay; `start`/`stop` on that loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._samples: deque[float] = deque(maxlen=int(WINDOW_S / PROBE_INTERVAL_S))
        self._task: asyncio.Task[None] | None = None
        self._warned_at = -LAG_WARN_EVERY_S
        self.over_warn = 0  # probes over LAG_WARN_S since start

    def start(self) -> None:
        assert self._task is None, "loop-lag monitor started twice"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        clock = time.monotonic
        pauses = process_gc_pauses()
        while True:
            asked, gc_before = clock(), pauses.total_s
            await asyncio.sleep(PROBE_INTERVAL_S)
            self.record(clock() - asked - PROBE_INTERVAL_S, pauses.total_s - gc_before)

    def record(self, lag_s: float, gc_s: float = 0.0) -> None:
        """One probe's delay and the GC pauses within it (also the tests' way in)."""
        lag_s = max(0.0, lag_s)
        self._samples.append(lag_s)
        if lag_s > LAG_WARN_S:
            self.over_warn += 1
            now = time.monotonic()
            if now - self._warned_at >= LAG_WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "%s: event loop ran %.0f ms late (garbage collection: %.0f ms meanwhile; %d"
                    " tasks; PYTHONASYNCIODEBUG=1 names slow callbacks); %d probes over %.0f ms"
                    " since start",
                    self.name,
                    lag_s * 1000,
                    gc_s * 1000,
                    len(asyncio.all_tasks()),
                    self.over_warn,
                    LAG_WARN_S * 1000,
                )

    def quantiles(self) -> dict[float, float]:
        """The last minute's p50, p99 and max (1.0), in seconds; zeros before any probe."""
        ordered = sorted(self._samples)
        if not ordered:
            return dict.fromkeys(QUANTILES, 0.0)
        last = len(ordered) - 1
        return {q: ordered[min(last, int(q * len(ordered)))] for q in QUANTILES}
