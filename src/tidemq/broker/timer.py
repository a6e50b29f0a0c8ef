"""Arbitrary delivery times (RocketMQ 5's TIMER_DELIVER_MS): time-bucketed system topics, read
lazily, so millions of pending timers cost disk, not memory.

    send TIMER_DELIVER_MS=T ─▶ DelayRouter ─▶ TimerWheel.park ─▶ topic rmq_sys_timer_<B>, queue 0
        B = T rounded down to the bucket width (TIMER_BUCKET_MS, 10 min); CQ tags code = T
    a bucket opens one width before B: its consume queue is read into a heap of
        (T, queue offset) — one small tuple per timer of the next two widths, never more
    due heap entries are re-stored to REAL_TOPIC / REAL_QID (schedule.restore_real)
    a bucket whose end has passed, fully delivered, is deleted (its consume queue; the records
    age out of the commit log with retention)
    timerProgress.json {"bucketMs":600000,"logOffset":L,"watermarks":{"<B>":W}}

Memory: one int per bucket that holds messages (at most horizon / width: 1,008 for 7 days) plus
the heaps of the open buckets. Timing: the service sleeps until the earliest heap head or the next
bucket opening, whichever is first; a park into an open bucket wakes it (no fixed poll).

Restart safety. Heap order is delivery order, so "every timer of bucket B due before W has been
delivered" is one number per open bucket, the watermark W: after a pass that read the whole
queue it is min(heap head, now + 1) — a timer that arrives later is due after now. It is
persisted every few seconds and at stop; on restart a bucket's entries before W are skipped.
A crash re-delivers at most the timers delivered since the last persist (at least once), and
never early: T is in the record.
A closed bucket keeps a tombstone watermark (its end) for an hour, so a crash that re-dispatches
its records into a fresh consume queue does not deliver them twice.
The file also keeps L, the log end when it was written: every delivery its watermarks cover is
below L. A log that ends before L at load (truncated to follow a new master, issue 14, or its
unflushed tail lost in a crash) has lost some of those deliveries; skipping their timers would
lose them, so the watermarks are dropped and the open buckets deliver again (at least once).

Slaves copy the watermarks (broker/slave_sync.py), so a slave promoted to master (issue 14) does
not deliver again what the old master delivered before the last copy:

    master: progress_doc() ─▶ GET_ALL_DELAY_OFFSET (45) key "tidemqTimerProgress"
            {"bucketMs":600000,"logOffset":L,"watermarks":{"<B>":W}}
    slave:  copy_progress(doc) ─▶ held until its own log reaches L ─▶ max per bucket ─▶ persisted

L is the master's log end when the watermarks were read: every delivery they cover (a
synchronous put before the watermark moves) is below it. A slave whose log has not reached L
yet does not have those deliveries, and skipping their timers after a promotion would lose them;
so it keeps such a copy aside (the oldest: the first its log reaches) and applies it once its log
gets there. A copy only moves watermarks forward (max per bucket): a late or stale answer never
moves one back (only a load onto a shorter log does, above). What the copy misses (deliveries of
the last interval) is delivered again after a promotion: at least once. A held copy is dropped
when the slave follows another master or epoch (`drop_held_copy`): its L is an offset of the
old master's log.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from tidemq.broker.persist import ConfigWriter, read_optional
from tidemq.broker.schedule import deliver_time_of, park, restore
from tidemq.broker.service import cancel_and_wait, run_due_loop
from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import decode_properties
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import DispatchEvent, GetStatus, MessageToStore

log = logging.getLogger(__name__)

TIMER_TOPIC_PREFIX: Final = "rmq_sys_timer_"
# Width of one bucket topic. Wider: fewer topics (each costs a consume-queue file, created and
# flushed), bigger heaps. 10 min: at most 1,008 topics for 7 days, heaps of ~20 minutes of timers.
TIMER_BUCKET_MS: Final = 600_000
TIMER_PROGRESS_FILE: Final = "timerProgress.json"
# GET_ALL_DELAY_OFFSET's (45) TideMQ key: `progress_doc` for the slaves (module doc).
TIMER_PROGRESS_KEY: Final = "tidemqTimerProgress"
# Store reads and deliveries per pass before yielding the event loop.
TIMER_WORK_PER_PASS_MAX: Final = 1_024
_READ_BATCH: Final = 64
# How long a closed bucket's tombstone watermark is kept (covers crash re-dispatch).
TOMBSTONE_KEEP_MS: Final = 3_600_000
RETRY_AFTER_FAILURE_MS: Final = 1_000
IDLE_WAIT_MS: Final = 60_000


@dataclass(slots=True)
class _OpenBucket:
    start_ms: int
    heap: list[tuple[int, int]] = field(default_factory=list)  # (deliver ms, queue offset)
    loaded_to: int = 0


class TimerWheel:
    """Parks TIMER_* messages in bucket topics and re-stores them when due."""

    def __init__(
        self,
        store: FileMessageStore,
        clock: Clock,
        config_dir: Path,
        *,
        bucket_ms: int = TIMER_BUCKET_MS,
    ) -> None:
        self._store = store
        self._clock = clock
        self._path = config_dir / TIMER_PROGRESS_FILE
        self._writer = ConfigWriter(self._path)
        self._bucket_ms = bucket_ms
        self._waiting: set[int] = set()  # bucket starts not opened yet
        self._open: dict[int, _OpenBucket] = {}
        self._watermarks: dict[int, int] = {}
        # A slave: the master's watermarks its log has not reached yet (log offset, marks).
        self._held_copy: tuple[int, dict[int, int]] | None = None
        self._dirty = False
        self._next_wake_ms: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0

    # -- naming ------------------------------------------------------------------------------

    def topic_of(self, bucket_start_ms: int) -> str:
        return f"{TIMER_TOPIC_PREFIX}{bucket_start_ms}"

    def bucket_of(self, deliver_ms: int) -> int:
        return deliver_ms - deliver_ms % self._bucket_ms

    @property
    def pending_buckets(self) -> int:
        return len(self._waiting) + len(self._open)

    def held_in_memory(self) -> int:
        """Timers held in heaps now (the memory bound's witness in tests)."""
        return sum(len(b.heap) for b in self._open.values())

    # -- parking -----------------------------------------------------------------------------

    def park(self, message: MessageToStore, deliver_ms: int) -> MessageToStore:
        start = self.bucket_of(deliver_ms)
        if start not in self._open:
            self._waiting.add(start)
        props = decode_properties(message.properties)
        return park(message, props, self.topic_of(start), 0, deliver_ms)

    def wants_topic(self, topic: str) -> bool:
        """The store's topic filter for `on_dispatch`: only the timer buckets' records."""
        return topic.startswith(TIMER_TOPIC_PREFIX)

    def on_dispatch(self, event: DispatchEvent) -> None:
        if not event.topic.startswith(TIMER_TOPIC_PREFIX):
            return
        start = self.bucket_of(event.tags_code)
        if start in self._open or (
            self._next_wake_ms is None or start - self._bucket_ms < self._next_wake_ms
        ):
            self._wake.set()

    # -- progress ----------------------------------------------------------------------------

    def load(self) -> None:
        data = read_optional(self._path)
        if data is not None:
            table = orjson.loads(data)
            marks = {int(k): int(v) for k, v in table.get("watermarks", {}).items()}
            covered, end = int(table.get("logOffset", 0)), self._store.max_physical_offset
            if covered > end:
                log.warning(
                    "%s covers the log up to %d but the log ends at %d (truncated, or its tail "
                    "lost in a crash): its watermarks are dropped; timers of open buckets may "
                    "be delivered again",
                    self._path.name,
                    covered,
                    end,
                )
                marks = {}
            self._watermarks = marks
        for topic in self._store.topics_and_queues():
            if topic.startswith(TIMER_TOPIC_PREFIX):
                suffix = topic[len(TIMER_TOPIC_PREFIX) :]
                if suffix.isdigit():
                    self._waiting.add(int(suffix))

    def persist(self) -> None:
        self._writer.write(self._snapshot())

    def progress_doc(self) -> dict[str, Any]:
        """The watermarks as a master sends them to its slaves (module doc): read with the log
        end at the same moment, so every delivery they cover lies below `logOffset`."""
        return {
            "bucketMs": self._bucket_ms,
            "logOffset": self._store.max_physical_offset,
            "watermarks": {str(k): v for k, v in sorted(self._watermarks.items())},
        }

    def copy_progress(self, doc: object) -> bool:
        """A slave: merge its master's `progress_doc` once its log holds what the watermarks
        cover (module doc); until then the copy is held. Returns whether a watermark moved.

        Raises:
            ProtocolError: `doc` is not timer progress of this bucket width (nothing changes).
        """
        log_offset, marks = self._parse_copy(doc)
        reached = self._store.max_physical_offset
        held = self._held_copy
        changed = False
        if held is not None and held[0] <= reached:
            changed = self._merge(held[1])
            held = None
        if log_offset <= reached:
            changed = self._merge(marks) or changed
            held = None  # the master's watermarks only grow: this copy covers any held one
        elif held is None:
            # Out of reach: kept aside. A held older copy stays instead (it is reached first;
            # replacing it would keep the copy out of reach while the slave lags).
            held = (log_offset, marks)
        self._held_copy = held
        return changed

    def drop_held_copy(self) -> None:
        """Forget a copy held for a log offset not reached yet: the master changed (slave_sync's
        `reset_held`), and an offset of the old master's log means other records in the new
        one's; merged once this log passes it, it would skip timers whose deliveries only the
        old master's tail held."""
        self._held_copy = None

    def _parse_copy(self, doc: object) -> tuple[int, dict[int, int]]:
        if not isinstance(doc, dict):
            raise ProtocolError(f"not timer progress: {type(doc).__name__}")
        try:
            width = int(doc["bucketMs"])
            log_offset = int(doc["logOffset"])
            marks = {int(k): int(v) for k, v in doc["watermarks"].items()}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"not timer progress: {exc!r}") from exc
        if width != self._bucket_ms:
            raise ProtocolError(f"timer buckets of {width} ms, this broker's are {self._bucket_ms}")
        return log_offset, marks

    def _merge(self, marks: dict[int, int]) -> bool:
        """Max per bucket. An open bucket of the master's is kept like a local waiting one (its
        watermark survives the tombstone horizon); a closed one ages out as a tombstone."""
        changed = False
        for start, mark in marks.items():
            if mark > self._watermarks.get(start, mark - 1):
                self._watermarks[start] = mark
                changed = True
            if start not in self._open:
                if self._watermarks[start] < start + self._bucket_ms:
                    self._waiting.add(start)
                else:
                    self._waiting.discard(start)
        self._dirty = self._dirty or changed
        return changed

    def persist_if_dirty(self) -> None:
        """Periodic: the write (fsync) runs in a thread when called on the event loop."""
        if self._dirty:
            self._writer.submit(self._snapshot())

    def _snapshot(self) -> bytes:
        horizon = self._clock.now_ms() - TOMBSTONE_KEEP_MS
        self._watermarks = {
            start: mark
            for start, mark in self._watermarks.items()
            if start + self._bucket_ms > horizon or start in self._open or start in self._waiting
        }
        table = {str(k): v for k, v in sorted(self._watermarks.items())}
        self._dirty = False
        return orjson.dumps(
            {
                "bucketMs": self._bucket_ms,
                "logOffset": self._store.max_physical_offset,
                "watermarks": table,
            }
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timer-wheel")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.persist()

    async def _run(self) -> None:
        await run_due_loop(self._wake, self.deliver_due)

    # -- delivery ----------------------------------------------------------------------------

    def deliver_due(self) -> int:
        """Open, load and deliver what is due (within a pass's budget); ms until next work."""
        now = self._clock.now_ms()
        for start in [s for s in self._waiting if s - self._bucket_ms <= now]:
            self._waiting.discard(start)
            self._open[start] = _OpenBucket(start)
        budget = TIMER_WORK_PER_PASS_MAX
        busy = False
        for bucket in sorted(self._open.values(), key=lambda b: b.start_ms):
            budget, loaded = self._load(bucket, budget)
            budget, failed = self._deliver(bucket, now, budget)
            if failed:
                self._next_wake_ms = now + RETRY_AFTER_FAILURE_MS
                return RETRY_AFTER_FAILURE_MS
            busy = busy or not loaded or budget <= 0
            if loaded:
                self._settle(bucket, now)
        if busy:
            self._next_wake_ms = now
            return 0
        wake = [b.heap[0][0] for b in self._open.values() if b.heap]
        wake += [min(self._waiting) - self._bucket_ms] if self._waiting else []
        self._next_wake_ms = min(wake) if wake else None
        if self._next_wake_ms is None:
            return IDLE_WAIT_MS
        return max(1, self._next_wake_ms - self._clock.now_ms())

    def _load(self, bucket: _OpenBucket, budget: int) -> tuple[int, bool]:
        """Read new consume-queue entries into the heap; (budget left, fully loaded?)."""
        topic = self.topic_of(bucket.start_ms)
        skip_before = self._watermarks.get(bucket.start_ms, 0)
        while budget > 0:
            if bucket.loaded_to >= self._store.max_offset(topic, 0):
                return budget, True
            result = self._store.get_messages(topic, 0, bucket.loaded_to, _READ_BATCH)
            budget -= 1
            if result.status is not GetStatus.FOUND:
                if result.next_begin_offset <= bucket.loaded_to:
                    return budget, True
                bucket.loaded_to = result.next_begin_offset
                continue
            for data in result.records:
                stored = rec.decode_record(data)
                deliver_ms = deliver_time_of(stored)
                if deliver_ms is None:
                    log.error("timer record at %d has no deliver time", stored.physical_offset)
                elif deliver_ms >= skip_before:
                    heapq.heappush(bucket.heap, (deliver_ms, stored.queue_offset))
            bucket.loaded_to = max(bucket.loaded_to, result.next_begin_offset)
        return budget, False

    def _deliver(self, bucket: _OpenBucket, now: int, budget: int) -> tuple[int, bool]:
        topic = self.topic_of(bucket.start_ms)
        while bucket.heap and bucket.heap[0][0] <= now and budget > 0:
            offset = bucket.heap[0][1]
            result = self._store.get_messages(topic, 0, offset, 1)
            budget -= 1
            if result.status is GetStatus.FOUND:
                if not restore(self._store, rec.decode_record(result.records[0])):
                    return budget, True
                self.delivered += 1
            else:
                log.error("timer %s offset %d unreadable: %s", topic, offset, result.status.value)
            heapq.heappop(bucket.heap)
        return budget, False

    def _settle(self, bucket: _OpenBucket, now: int) -> None:
        """Advance the watermark of a fully read bucket; close it once its time is over."""
        # Arrivals are due after `now` (the router delivers the others at once), so every
        # timer before min(head, now + 1) has been delivered, whatever arrives next.
        mark = min(bucket.heap[0][0], now + 1) if bucket.heap else now + 1
        end = bucket.start_ms + self._bucket_ms
        if not bucket.heap and end <= now:
            mark = end
            del self._open[bucket.start_ms]
            self._store.delete_topic(self.topic_of(bucket.start_ms))
        if self._watermarks.get(bucket.start_ms) != mark:
            self._watermarks[bucket.start_ms] = mark
            self._dirty = True
