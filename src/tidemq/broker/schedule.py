"""Delay levels: SCHEDULE_TOPIC_XXXX, the ScheduleService that re-stores due messages, and the
router that parks delayed sends (remoting.md §9).

    send DELAY=L ─▶ DelayRouter.route ─▶ SCHEDULE_TOPIC_XXXX queue L-1
                     REAL_TOPIC / REAL_QID = the destination, CQ tags code = deliver time (ms)
    ScheduleService: per level, read the queue from its progress offset; every entry whose
                     deliver time has come is re-stored to REAL_TOPIC / REAL_QID (DELAY dropped,
                     tags code = hash of TAGS again); progress advances past it
    delayOffset.json {"offsetTable":{"<level>":<next offset>},"logOffset":L}
                     (RocketMQ's shape; L is TideMQ's, RocketMQ reads past it)

Within one level every message waits the same time, so deliver times rise along the queue: only
the head of each level can be due next. The service therefore sleeps until the earliest head is
due (no fixed poll); a dispatch into the schedule topic that is due sooner wakes it early. Memory
is one offset per level, whatever the number of messages pending.

Restart: progress is persisted every few seconds and at stop. After a crash the messages since
the last persisted progress are re-delivered (at least once, never early): the deliver time is in
the record itself, not in memory.

A log shorter than the progress at load. L is the log end the progress covers: every re-stored
message it counts is below L (a master: its log end when the file was written; a slave: the
"tidemqLogOffset" of the master's copy it applied, slave_sync.py). A log that ends before L at
load (truncated to follow a new master, issue 14, or its unflushed tail lost in a crash) may
lack some of those re-stored messages, and skipping their parked records would lose them: the
progress is dropped, every level reads its queue again from its first entry (an offset below
the queue's start moves to it), and what was delivered is delivered again (at least once, never
lost). A file without L (older) loads as it is.

The router also sends TIMER_* messages (an arbitrary delivery time) to the timer wheel
(timer.py); both re-store through `restore_real`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Final, Protocol

import orjson

from tidemq.broker.delay_levels import PARKING_PROPERTIES, TIMER_PROPERTIES, requested_delivery_ms
from tidemq.broker.persist import ConfigWriter, quote_int_keys, read_optional
from tidemq.broker.restore import message_from_stored
from tidemq.broker.service import cancel_and_wait, run_due_loop
from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import (
    DELAY,
    REAL_QID,
    REAL_TOPIC,
    SCHEDULE_TOPIC_XXXX,
    SysFlag,
    decode_properties,
    encode_properties,
)
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import DispatchEvent, GetStatus, MessageToStore

log = logging.getLogger(__name__)

DELAY_OFFSET_FILE: Final = "delayOffset.json"
# delayOffset.json's TideMQ key: the log end its progress covers (module doc).
LOG_OFFSET_FIELD: Final = "logOffset"
# Entries read per store call while draining a level.
_READ_BATCH: Final = 32
# Deliveries per pass before yielding the event loop (sends and pulls keep flowing under load).
DELIVERIES_PER_PASS_MAX: Final = 512
# After a failed re-store (disk full, store stopped) the level is retried this much later.
RETRY_AFTER_FAILURE_MS: Final = 1_000
# Sleep bound when nothing is pending: a safety net only; arrivals wake the service.
IDLE_WAIT_MS: Final = 60_000
# Store answers that move the read offset without delivering (retention, an offset past the end).
_SKIP_STATUSES: Final = frozenset(
    {
        GetStatus.OFFSET_TOO_SMALL,
        GetStatus.OFFSET_OVERFLOW_BADLY,
        GetStatus.NO_MATCHED_MESSAGE,
        GetStatus.MESSAGE_WAS_REMOVING,
    }
)


class DelayRefused(ValueError):
    """A delayed send the broker will not take (bad TIMER_* value, beyond the horizon)."""


class TimerParking(Protocol):
    """Where TIMER_* messages go (timer.py)."""

    def park(self, message: MessageToStore, deliver_ms: int) -> MessageToStore: ...


def restore_real(stored: rec.StoredMessage) -> MessageToStore:
    """The message to store in REAL_TOPIC / REAL_QID once a parked message is due."""
    # The store's own properties (CRC, tags code) are dropped by message_from_stored.
    props = decode_properties(stored.properties)
    topic = props.get(REAL_TOPIC, "")
    qid = props.get(REAL_QID, "").strip()
    if not topic or not qid.isdigit():
        raise CorruptRecordError(
            f"parked message at {stored.physical_offset} lacks {REAL_TOPIC}/{REAL_QID}"
        )
    props.pop(DELAY, None)
    for name in TIMER_PROPERTIES:
        props.pop(name, None)
    return message_from_stored(
        stored,
        topic=topic,
        queue_id=int(qid),
        properties=props,
        # A committed transactional message keeps naming its half (the start-up repair).
        prepared_transaction_offset=stored.prepared_transaction_offset,
    )


def deliver_time_of(stored: rec.StoredMessage) -> int | None:
    """The deliver time a parked record carries in its tags-code property."""
    text = stored.property_map().get(TAGS_CODE_PROPERTY, "").strip()
    return int(text) if text.lstrip("-").isdigit() else None


def park(
    message: MessageToStore, props: dict[str, str], topic: str, queue_id: int, deliver_ms: int
) -> MessageToStore:
    """`message` re-addressed to a parking queue, its destination kept in REAL_TOPIC/REAL_QID."""
    props = dict(props)
    props[REAL_TOPIC] = message.topic
    props[REAL_QID] = str(message.queue_id)
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=message.body,
        flag=message.flag,
        properties=encode_properties(props),
        sys_flag=message.sys_flag,
        born_timestamp=message.born_timestamp,
        born_host=message.born_host,
        store_host=message.store_host,
        reconsume_times=message.reconsume_times,
        tags_code=deliver_ms,
        prepared_transaction_offset=message.prepared_transaction_offset,
    )


class DelayRouter:
    """Decides, at send and send-back, whether a message is parked and where."""

    def __init__(
        self,
        levels_ms: tuple[int, ...],
        clock: Clock,
        *,
        timer: TimerParking | None = None,
        timer_max_delay_ms: int = 0,
    ) -> None:
        self._levels_ms = levels_ms
        self._clock = clock
        self._timer = timer
        self._timer_max_delay_ms = timer_max_delay_ms

    def route(self, message: MessageToStore) -> MessageToStore:
        """`message` itself, or its parked form. Raises DelayRefused."""
        tx = message.sys_flag & SysFlag.TRANSACTION_MASK
        if tx not in (SysFlag.TRANSACTION_NOT, SysFlag.COMMIT):
            return message
        text = message.properties
        if not any(name in text for name in PARKING_PROPERTIES):
            return message
        props = decode_properties(text)
        now = self._clock.now_ms()
        try:
            deliver_ms = requested_delivery_ms(props, now)
        except ValueError as exc:
            raise DelayRefused(str(exc)) from None
        if deliver_ms is not None and self._timer is not None:
            if deliver_ms - now > self._timer_max_delay_ms:
                raise DelayRefused(
                    f"delivery time {deliver_ms} is more than timerMaxDelaySec "
                    f"({self._timer_max_delay_ms // 1000} s) ahead"
                )
            if deliver_ms > now:
                return self._timer.park(message, deliver_ms)
            return message
        level_text = props.get(DELAY, "").strip()
        if not level_text.lstrip("-").isdigit() or int(level_text) <= 0:
            return message
        level = min(int(level_text), len(self._levels_ms))
        props[DELAY] = str(level)
        return park(
            message, props, SCHEDULE_TOPIC_XXXX, level - 1, now + self._levels_ms[level - 1]
        )


class ScheduleService:
    """Re-stores SCHEDULE_TOPIC_XXXX messages to their real topic when due."""

    def __init__(
        self,
        store: FileMessageStore,
        levels_ms: tuple[int, ...],
        clock: Clock,
        config_dir: Path,
    ) -> None:
        self._store = store
        self._levels_ms = levels_ms
        self._clock = clock
        self._path = config_dir / DELAY_OFFSET_FILE
        self._writer = ConfigWriter(self._path)
        self._progress: dict[int, int] = {}  # level (1-based) -> next queue offset
        # The log end the progress covers when it came from a master's copy (or the file); None:
        # moved here, it covers the log end when written (module doc).
        self._covered: int | None = None
        self._dirty = False
        self._next_due_ms: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0

    # -- progress ----------------------------------------------------------------------------

    def load(self) -> None:
        data = read_optional(self._path)
        if data is None:
            return
        doc = orjson.loads(data)
        progress = {int(level): int(offset) for level, offset in doc.get("offsetTable", {}).items()}
        covered = doc.get(LOG_OFFSET_FIELD)
        end = self._store.max_physical_offset
        if covered is not None and int(covered) > end:
            log.warning(
                "%s covers the log up to %d but the log ends at %d (truncated, or its tail "
                "lost in a crash): its progress is dropped; delay levels deliver again from "
                "the start of their queues",
                self._path.name,
                covered,
                end,
            )
            progress, covered, self._dirty = {}, None, True
        self._progress = progress
        self._covered = None if covered is None else int(covered)

    def replace_progress(self, data: bytes, log_offset: int | None = None) -> bool:
        """A slave: take the master's progress (GET_ALL_DELAY_OFFSET's body, `{1:0,2:5}` keys
        quoted or not), which covers the master's log up to `log_offset` (None: unknown, then
        this log's end when written). Returns whether anything changed.

        Raises:
            ProtocolError: `data` is not a delay offset table (nothing changes).
        """
        progress = decode_progress(data)
        if progress == self._progress:
            return False
        self._progress = progress
        self._covered = log_offset
        self._dirty = True
        return True

    @property
    def store(self) -> FileMessageStore:
        """The store it reads and re-stores into (a slave's SlaveSync compares log ends)."""
        return self._store

    def to_json(self) -> bytes:
        """The progress as GET_ALL_DELAY_OFFSET (45) answers it (RocketMQ's delayOffset.json
        shape, with quoted keys)."""
        table = {str(level): offset for level, offset in sorted(self._progress.items())}
        return orjson.dumps({"offsetTable": table})

    def _snapshot(self) -> bytes:
        table = {str(level): offset for level, offset in sorted(self._progress.items())}
        covered = self._covered
        if covered is None:
            covered = self._store.max_physical_offset
        self._dirty = False
        doc = {"offsetTable": table, LOG_OFFSET_FIELD: covered}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    def persist(self) -> None:
        self._writer.write(self._snapshot())

    def persist_if_dirty(self) -> None:
        """Periodic: the write (fsync) runs in a thread when called on the event loop."""
        if self._dirty:
            self._writer.submit(self._snapshot())

    def progress(self, level: int) -> int:
        return self._progress.get(level, 0)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run(), name="schedule")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.persist()

    def wants_topic(self, topic: str) -> bool:
        """The store's topic filter for `on_dispatch`: only the schedule topic's records."""
        return topic == SCHEDULE_TOPIC_XXXX

    def on_dispatch(self, event: DispatchEvent) -> None:
        if event.topic != SCHEDULE_TOPIC_XXXX:
            return
        if self._next_due_ms is None or event.tags_code < self._next_due_ms:
            self._wake.set()

    async def _run(self) -> None:
        await run_due_loop(self._wake, self.deliver_due)

    # -- delivery ----------------------------------------------------------------------------

    def deliver_due(self) -> int:
        """Re-store every due message (up to a pass's budget); ms until the next is due."""
        now = self._clock.now_ms()
        budget = DELIVERIES_PER_PASS_MAX
        next_due: int | None = None
        for level in range(1, len(self._levels_ms) + 1):
            due, budget = self._drain_level(level, now, budget)
            if due is not None:
                next_due = due if next_due is None else min(next_due, due)
            if budget <= 0:
                self._next_due_ms = now
                return 0
        self._next_due_ms = next_due
        if next_due is None:
            return IDLE_WAIT_MS
        return max(1, next_due - self._clock.now_ms())

    def _drain_level(self, level: int, now: int, budget: int) -> tuple[int | None, int]:
        """Deliver the due head of one level; (deliver time of the new head or None, budget)."""
        queue_id = level - 1
        offset = self._progress.get(level, 0)
        while budget > 0:
            result = self._store.get_messages(SCHEDULE_TOPIC_XXXX, queue_id, offset, _READ_BATCH)
            if result.status in _SKIP_STATUSES:
                if result.next_begin_offset == offset:
                    return None, budget
                offset = self._advance(level, result.next_begin_offset)
                continue
            if result.status is not GetStatus.FOUND:
                return None, budget
            for data in result.records:
                stored = rec.decode_record(data)
                deliver_ms = deliver_time_of(stored)
                if deliver_ms is None:
                    deliver_ms = stored.store_timestamp + self._levels_ms[queue_id]
                if deliver_ms > now:
                    return deliver_ms, budget
                if not self._restore(stored):
                    return now + RETRY_AFTER_FAILURE_MS, budget
                budget -= 1
                offset = self._advance(level, stored.queue_offset + 1)
            offset = self._advance(level, max(offset, result.next_begin_offset))
        return now, budget

    def _advance(self, level: int, offset: int) -> int:
        if self._progress.get(level, 0) != offset:
            self._progress[level] = offset
            self._covered = None  # moved here: covers this log's end when written
            self._dirty = True
        return offset

    def _restore(self, stored: rec.StoredMessage) -> bool:
        done = restore(self._store, stored)
        self.delivered += done
        return done


def decode_progress(data: bytes) -> dict[int, int]:
    """The level -> next offset table of a delayOffset.json document (keys quoted or not).

    Raises:
        ProtocolError: `data` is not a delay offset table.
    """
    try:
        table = orjson.loads(quote_int_keys(data)).get("offsetTable") or {}
        return {int(level): int(offset) for level, offset in table.items()}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ProtocolError(f"not a delay offset table: {exc}") from exc


def restore(store: FileMessageStore, stored: rec.StoredMessage) -> bool:
    """Store the real message for `stored`; False when the store refused (try again later).

    A parked record without a destination is logged and skipped (True): retrying cannot help.
    """
    try:
        message = restore_real(stored)
    except CorruptRecordError as exc:
        log.error("dropping a parked message: %s", exc)
        return True
    result = store.put_message(message)
    if not result.ok:
        log.warning(
            "re-storing a due message to %s failed (%s %s); retrying later",
            message.topic,
            result.status.value,
            result.error,
        )
        return False
    return True
