"""BrokerStats: what the broker stored and served, per topic and per group, in plain ints.

Handlers count on the event-loop thread (one dict update per stored put or served pull, never
per message object, no lock); readers (the metrics scrape, VIEW_BROKER_STATS_DATA, runtime info,
the console) read on the same thread, so they always see whole updates.

Windows follow RocketMQ's StatsItem: a sampler calls `sample()` every 10 s; each counter keeps
the last 7 samples at 10 s (a minute), at 10 min (an hour) and 25 at 1 h (a day). A window's
figures come from its oldest and newest samples:

    sum   = newest.value - oldest.value
    tps   = sum * 1000 / (newest.ms - oldest.ms)            (per second)
    avgpt = sum / (newest.calls - oldest.calls)            (per put or pull call)

Names and keys are upstream's statsName/statsKey: TOPIC_PUT_NUMS/TOPIC_PUT_SIZE by topic,
GROUP_GET_NUMS/GROUP_GET_SIZE by "topic@group", BROKER_PUT_NUMS/BROKER_GET_NUMS by the cluster
name. Counted since the broker started (not persisted), as upstream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    BROKER_PUT_NUMS,
    BROKER_GET_NUMS,
)

# The sampler's period and how many samples each window keeps (RocketMQ's StatsItem).
SAMPLE_INTERVAL_MS = 10_000
MINUTE_SAMPLES = 7  # every 10 s
HOUR_EVERY = 60  # ticks: every 10 min
HOUR_SAMPLES = 7
DAY_EVERY = 360  # ticks: every hour
DAY_SAMPLES = 25

# upstream's message_size histogram bounds (bytes): 1 KiB, 4 KiB, 512 KiB, 1 MiB, 2 MiB, 4 MiB
SIZE_BUCKETS = (1024, 4096, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, 4 * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class StatsWindow:
    sum: int
    tps: float
    avgpt: float


ZERO_WINDOW = StatsWindow(0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class StatsWindows:
    minute: StatsWindow
    hour: StatsWindow
    day: StatsWindow


# A sample: (wall ms, counter value, call count)
Sample = tuple[int, int, int]


def _window(ring: deque[Sample]) -> StatsWindow:
    return _between(ring[0], ring[-1]) if len(ring) >= 2 else ZERO_WINDOW


def _between(first: Sample, last: Sample) -> StatsWindow:
    first_ms, first_value, first_calls = first
    last_ms, last_value, last_calls = last
    total = last_value - first_value
    span = last_ms - first_ms
    tps = total * 1000 / span if span > 0 else 0.0
    calls = last_calls - first_calls
    return StatsWindow(total, tps, total / calls if calls > 0 else 0.0)


class _Rings:
    """The minute, hour and day samples of one counter."""

    __slots__ = ("day", "hour", "minute")

    def __init__(self) -> None:
        self.minute: deque[Sample] = deque(maxlen=MINUTE_SAMPLES)
        self.hour: deque[Sample] = deque(maxlen=HOUR_SAMPLES)
        self.day: deque[Sample] = deque(maxlen=DAY_SAMPLES)


class BrokerStats:
    """Counters of one broker; `now_ms` stamps samples (the broker's clock)."""

    def __init__(self, cluster: str, now_ms: Callable[[], int]) -> None:
        self.cluster = cluster
        self._now_ms = now_ms
        self.put_nums: dict[str, int] = {}
        self.put_bytes: dict[str, int] = {}
        self.put_calls: dict[str, int] = {}
        self.get_nums: dict[tuple[str, str], int] = {}
        self.get_bytes: dict[tuple[str, str], int] = {}
        self.get_calls: dict[tuple[str, str], int] = {}
        self.dlq_nums: dict[tuple[str, str], int] = {}
        # (group, topic, queue id) → the offset after the last message a pull returned there:
        # with the committed offset, what is in flight (rocketmq_consumer_inflight_messages).
        self.pull_offsets: dict[tuple[str, str, int], int] = {}
        self.broker_put_nums = 0
        self.broker_put_calls = 0
        self.broker_get_nums = 0
        self.broker_get_calls = 0
        # message_size histogram: counts per bucket of SIZE_BUCKETS, the last one is +Inf
        self.size_buckets = [0] * (len(SIZE_BUCKETS) + 1)
        self.size_sum = 0
        self._rings: dict[str, dict[str, _Rings]] = {name: {} for name in STATS_NAMES}
        self._ticks = 0

    # -- counting (the handlers) -------------------------------------------------------------

    def put(self, topic: str, count: int, nbytes: int) -> None:
        """`count` messages of `nbytes` in all stored by one send (a batch is one put)."""
        self.put_nums[topic] = self.put_nums.get(topic, 0) + count
        self.put_bytes[topic] = self.put_bytes.get(topic, 0) + nbytes
        self.put_calls[topic] = self.put_calls.get(topic, 0) + 1
        self.broker_put_nums += count
        self.broker_put_calls += 1
        # A batch's messages are bucketed at their mean size: the handler sees one total.
        size = nbytes // count if count > 0 else 0
        for index, bound in enumerate(SIZE_BUCKETS):
            if size <= bound:
                self.size_buckets[index] += count
                break
        else:
            self.size_buckets[-1] += count
        self.size_sum += nbytes

    def got(self, group: str, topic: str, count: int, nbytes: int) -> None:
        """`count` messages of `nbytes` returned by one pull of `group`."""
        key = (group, topic)
        self.get_nums[key] = self.get_nums.get(key, 0) + count
        self.get_bytes[key] = self.get_bytes.get(key, 0) + nbytes
        self.get_calls[key] = self.get_calls.get(key, 0) + 1
        self.broker_get_nums += count
        self.broker_get_calls += 1

    def pulled(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """A pull of `group` returned messages of the queue up to `next_offset`."""
        self.pull_offsets[(group, topic, queue_id)] = next_offset

    def to_dlq(self, group: str, topic: str) -> None:
        """One message of `topic` moved to %DLQ%`group`."""
        key = (group, topic)
        self.dlq_nums[key] = self.dlq_nums.get(key, 0) + 1

    # -- windows -----------------------------------------------------------------------------

    def _current(self, name: str) -> dict[str, tuple[int, int]]:
        """Every key of `name` with its (value, calls) now."""
        if name == TOPIC_PUT_NUMS:
            calls = self.put_calls
            return {t: (v, calls[t]) for t, v in self.put_nums.items()}
        if name == TOPIC_PUT_SIZE:
            calls = self.put_calls
            return {t: (v, calls[t]) for t, v in self.put_bytes.items()}
        if name == GROUP_GET_NUMS:
            gcalls = self.get_calls
            return {f"{t}@{g}": (v, gcalls[(g, t)]) for (g, t), v in self.get_nums.items()}
        if name == GROUP_GET_SIZE:
            gcalls = self.get_calls
            return {f"{t}@{g}": (v, gcalls[(g, t)]) for (g, t), v in self.get_bytes.items()}
        if name == BROKER_PUT_NUMS:
            return {self.cluster: (self.broker_put_nums, self.broker_put_calls)}
        if name == BROKER_GET_NUMS:
            return {self.cluster: (self.broker_get_nums, self.broker_get_calls)}
        raise KeyError(name)

    def sample(self) -> None:
        """One 10 s tick of the sampler (a PeriodicService of the broker)."""
        now = self._now_ms()
        tick = self._ticks
        self._ticks += 1
        hour = tick % HOUR_EVERY == 0
        day = tick % DAY_EVERY == 0
        for name, rings in self._rings.items():
            for key, (value, calls) in self._current(name).items():
                ring = rings.get(key)
                if ring is None:
                    ring = rings[key] = _Rings()
                    # A counter first seen now started from zero one sample earlier: without
                    # this, a minute-old topic's first minute would read as nothing.
                    start = (now - SAMPLE_INTERVAL_MS, 0, 0)
                    ring.minute.append(start)
                    ring.hour.append(start)
                    ring.day.append(start)
                sample = (now, value, calls)
                ring.minute.append(sample)
                if hour:
                    ring.hour.append(sample)
                if day:
                    ring.day.append(sample)

    def has(self, name: str, key: str) -> bool:
        """Whether `name` has figures for `key` (VIEW_BROKER_STATS_DATA refuses one without)."""
        if name not in self._rings:
            return False
        return key in self._rings[name] or key in self._current(name)

    def window(self, name: str, key: str) -> StatsWindows:
        """The minute, hour and day figures of `name` for `key` (zeros for one never counted).

        Raises:
            KeyError: `name` is not one of STATS_NAMES.
        """
        ring = self._rings[name].get(key)
        if ring is None:
            return StatsWindows(ZERO_WINDOW, ZERO_WINDOW, ZERO_WINDOW)
        return StatsWindows(_window(ring.minute), _window(ring.hour), _window(ring.day))

    def tps(self, name: str, key: str) -> float:
        """The last minute's rate of `name` for `key`, per second."""
        ring = self._rings[name].get(key)
        return _window(ring.minute).tps if ring is not None else 0.0

    def last_interval_tps(self, name: str, key: str) -> float:
        """The rate of `name` for `key` between the two latest samples (SAMPLE_INTERVAL_MS
        apart: upstream's 10 s figure), per second; 0.0 before two samples."""
        ring = self._rings[name].get(key)
        if ring is None or len(ring.minute) < 2:
            return 0.0
        return _between(ring.minute[-2], ring.minute[-1]).tps
