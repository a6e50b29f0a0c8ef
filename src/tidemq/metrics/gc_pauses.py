"""Garbage-collector pauses: how long CPython's cyclic collector stops the process, and the
tuning that makes it stop less often (issue 18).

A collection runs on whatever thread allocated past the threshold, so on a server it runs on the
event loop, and a full collection walks every tracked object: the broker's tables, its clients,
its transaction ledger. During the exactly-once Spark sink that was 32 collections over 20 ms in
one run, the longest 143-325 ms, each one a stall of every request.

Two things help. What start-up allocated (modules, the route and topic tables, the store's
indexes) lives as long as the process; `gc.freeze()` moves it to the permanent generation, which
no collection walks again. And higher thresholds (GEN0_THRESHOLD net allocations instead of 700
before a young collection, 20 and 100 instead of 10 and 10 for the older ones) make collections
rarer: the objects a request allocates are freed by reference counting, not by the collector,
so a young collection mostly walks objects that are still alive. Measured on the Spark sink
benchmark (CPython 3.11, 50,000 rows): the broker went from ~1,000 collections (5 full, the
longest 100-318 ms) to ~135, none full after start. The
EOS-sink measurement that prompted this found 10,000 worse than 50,000. `TIDEMQ_GC_TUNING=off`
in the environment leaves the collector as CPython sets it (for A/B runs, or a workload that
builds cycles faster).

`GcPauses` times each collection through `gc.callbacks` (two perf_counter calls and a bucket
increment per collection) for `tidemq_gc_pause_seconds{generation}`; one instance per process,
since the collector is per process (`tidemq dev` runs several servers in one).
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any, Final

log = logging.getLogger(__name__)

# Histogram upper bounds in seconds: a young collection takes well under a millisecond, a full
# one over a large heap hundreds of them.
GC_PAUSE_BOUNDS_S: Final = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS: Final = 3
GEN0_THRESHOLD: Final = 50_000
GEN1_THRESHOLD: Final = 20
GEN2_THRESHOLD: Final = 100
TUNING_ENV: Final = "TIDEMQ_GC_TUNING"
_TUNING_VALUES: Final = {"on": True, "off": False}


class GcPauses:
    """Per-generation pause histogram, fed by `gc.callbacks` between `install` and `uninstall`.

    `counts[g]` has one slot per bound plus +Inf (not cumulative); `total_s` is every
    generation's pauses summed, which the loop-lag monitor reads around each probe to say how
    much of a late wake-up was the collector's.
    """

    def __init__(self) -> None:
        self.counts = [[0] * (len(GC_PAUSE_BOUNDS_S) + 1) for _ in range(GENERATIONS)]
        self.sums = [0.0] * GENERATIONS
        self.max_s = [0.0] * GENERATIONS
        self.total_s = 0.0
        self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.record(info["generation"], time.perf_counter() - self._started)

    def record(self, generation: int, pause_s: float) -> None:
        """One collection's pause (also the tests' way in)."""
        self.counts[generation][bisect_left(GC_PAUSE_BOUNDS_S, pause_s)] += 1
        self.sums[generation] += pause_s
        self.total_s += pause_s
        if pause_s > self.max_s[generation]:
            self.max_s[generation] = pause_s


_process: GcPauses | None = None


def process_gc_pauses() -> GcPauses:
    """The process's one GcPauses, installed on first use and kept for the process's life."""
    global _process  # the collector is one per process, so is its timing
    if _process is None:
        _process = GcPauses()
        _process.install()
    return _process


def gc_tuning_wanted(env: Mapping[str, str]) -> bool:
    """TIDEMQ_GC_TUNING: on (the default) or off; anything else is refused at start."""
    value = env.get(TUNING_ENV, "on").strip().lower()
    if value not in _TUNING_VALUES:
        raise ValueError(f"{TUNING_ENV}={value!r}: expected on or off")
    return _TUNING_VALUES[value]


def tune_after_start() -> None:
    """Once the servers have started and loaded their tables: collect start-up's garbage (a
    frozen cycle is never freed), freeze the survivors, raise the thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    log.info(
        "gc: %d start-up objects frozen, thresholds %s (%s=off to keep CPython's)",
        gc.get_freeze_count(),
        gc.get_threshold(),
        TUNING_ENV,
    )
