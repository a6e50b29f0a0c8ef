"""The store's write path after the checks: records appended to the commit log, then dispatched.

    checked messages (put.check_message), in arrival order, of any topics and queues
      ──▶ per commit-log segment, the run of records that fits it: encoded (put.record_parts)
          and joined, one copy into the mapping (records of 64 KiB or more on average: each body
          written as it is through the descriptor, one copy and no page faults)
      ──▶ that run's consume-queue entries, one write per queue; its index entries, one
          index-header update; its dispatch events, in order

Both of the store's put calls come here. `put_messages` checks a batch as a whole (one topic and
queue, refused whole: a batch request); `put_each` checks every message on its own (any topics
and queues, a refusal answers that message only: the single sends of one event-loop turn,
broker/handlers/send_coalesce.py, and END_TRANSACTION's commits,
broker/transaction/resolution.py). A record is the same bytes whichever call wrote it, and with
whatever neighbours (tests/store/test_put_each.py).

A run is dispatched as soon as it is written, so an OSError in a later segment leaves the earlier
runs written, dispatched and answered.

Records read back from the log get the same entries from `Appender.dispatch_scanned` (recovery,
the re-dispatch after a failed dispatch) and `dispatch_placed_run` (a slave's append of its
master's records, store/replica.py): the entries derive from the record alone (store/dispatch.py).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from tidemq.clock import Clock
from tidemq.protocol import message as props
from tidemq.protocol import record as rec
from tidemq.store import dispatch as dsp
from tidemq.store import put
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import StoreConfig
from tidemq.store.consume_queue import ConsumeQueue, PutAt
from tidemq.store.dispatch import TX_MASK, TX_PREPARED, TX_ROLLBACK
from tidemq.store.index import IndexService
from tidemq.store.mapped_file import MappedFile
from tidemq.store.types import DispatchEvent, MessageToStore, PutResult, PutStatus

logger = logging.getLogger(__name__)

_PUT_OK: Final = PutStatus.PUT_OK
# PutResult(status, physical_offset, queue_offset, size, store_timestamp, error) at C speed:
# the NamedTuple's own constructor runs Python code (keywords, defaults) and costs ~1,000 more
# machine instructions per stored message (callgrind, put_each of 256 and put_messages of 64).
_new_result: Final = tuple.__new__

QueueKey = tuple[str, int]
DispatchListener = Callable[[DispatchEvent], None]
# Which topics a listener wants events of (None: all). Asked once per topic per put pass, so a
# record no listener wants costs no event and no call (store.add_dispatch_listener).
TopicFilter = Callable[[str], bool]
Listeners = list[tuple[DispatchListener, TopicFilter | None]]
# A consume-queue entry as ConsumeQueue.put_run takes it: physical offset, size, tags code.
CqEntry = tuple[int, int, int]


# A run whose records average this size or more is written part by part through the file
# descriptor (MappedFile.append_parts_written), not joined and copied into the mapping: for a 1 MiB
# body that is one copy instead of two, and no page fault per fresh page of the mapping.
LARGE_RECORD_BYTES: Final = 64 * 1024


def _write_large(mf: MappedFile, parts: list[bytes]) -> None:
    """Append `parts` in order: each large one (a body) as it is, the small ones between joined,
    all with one `MappedFile.append_parts_written`, so the segment's `wrote` (read by the
    flush thread) moves once, past whole records only, and not at all if a write fails."""
    writes: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) < LARGE_RECORD_BYTES:
            small.append(part)
            continue
        if small:
            writes.append(b"".join(small))
            small.clear()
        writes.append(part)
    if small:
        writes.append(b"".join(small))
    mf.append_parts_written(writes)


class _Run:
    """What encoding one segment's run of records made, for `Appender._dispatch_run`."""

    __slots__ = (
        "end",
        "end_offset",
        "events",
        "first_offsets",
        "index_entries",
        "parts",
        "queue_entries",
        "results",
    )

    def __init__(self) -> None:
        self.end = 0  # the index in `prepared` after the run's last record
        self.end_offset = 0  # the physical offset after it
        self.parts: list[bytes] = []
        self.results: list[PutResult] = []
        # Per queue written to: its entries in this run, and the queue offset of the first.
        self.queue_entries: dict[QueueKey, list[CqEntry]] = {}
        self.first_offsets: dict[QueueKey, int] = {}
        self.index_entries: list[tuple[str, int, int]] = []
        self.events: list[tuple[DispatchEvent, list[DispatchListener]]] = []


def check_batch(
    msgs: Sequence[MessageToStore], config: StoreConfig
) -> list[put.Prepared] | PutResult:
    """Every message of a one-queue batch prepared, or the one refusal that answers them all."""
    first = msgs[0]
    topic = put.check_topic(first.topic)
    if isinstance(topic, PutResult):
        return topic
    prepared: list[put.Prepared] = []
    for msg in msgs:
        if msg.queue_id != first.queue_id or msg.topic != first.topic:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, error="batch mixes queues")
        checked = put.check_message(msg, topic, config)
        if isinstance(checked, PutResult):
            return checked
        prepared.append(checked)
    return prepared


def check_each(
    msgs: Sequence[MessageToStore], config: StoreConfig
) -> tuple[list[PutResult | None], list[put.Prepared]]:
    """Each message checked alone: per message its refusal (None where it passed), and the
    messages that passed, prepared, in order."""
    refusals: list[PutResult | None] = []
    prepared: list[put.Prepared] = []
    topics: dict[str, bytes | PutResult] = {}
    for msg in msgs:
        topic = topics.get(msg.topic)
        if topic is None:
            topic = topics[msg.topic] = put.check_topic(msg.topic)
        checked = topic if isinstance(topic, PutResult) else put.check_message(msg, topic, config)
        if isinstance(checked, PutResult):
            refusals.append(checked)
        else:
            refusals.append(None)
            prepared.append(checked)
    return refusals, prepared


class Appender:
    """Appends prepared records and dispatches them: consume-queue entries, index entries and
    the listeners' events. The store's single writer (the event-loop thread) calls it."""

    __slots__ = (
        "_clock",
        "_index",
        "_listeners",
        "_log",
        "_queue_of",
        "_queues",
        "broken",
        "dispatched",
    )

    def __init__(
        self,
        log: CommitLog,
        queues: dict[QueueKey, ConsumeQueue],
        queue_of: Callable[[str, int], ConsumeQueue],
        index: IndexService,
        listeners: Listeners,
        clock: Clock,
    ) -> None:
        """`queues` is the store's table (read here); `queue_of` finds or creates a queue in it.
        `listeners` is the store's list of (listener, topic filter), shared: listeners added
        later are called too (from the next put on)."""
        self._log = log
        self._queues = queues
        self._queue_of = queue_of
        self._index = index
        self._listeners = listeners
        self._clock = clock
        # The physical offset up to which records are dispatched (the checkpoint's logic offset).
        self.dispatched = 0
        # Why appending stopped: a run was written to the log but its consume-queue or index
        # entries were not (e.g. ENOSPC creating a file). Queue offsets after it would collide
        # with the ones the written records carry, so the store takes no more writes until it
        # has dispatched those records (FileMessageStore.retry_dispatch, with backoff; or
        # recovery at the next start).
        self.broken: str | None = None

    def append(self, prepared: Sequence[put.Prepared], results: list[PutResult]) -> None:
        """Write and dispatch `prepared` in order, one run per segment; each record's PutResult
        is appended to `results` once its run is written and dispatched.

        Raises:
            OSError: a segment could not be created or written (earlier runs stay done).
        """
        now_ms = self._clock.now_ms()
        # The next queue offset of each queue written to, read once from its consume queue.
        next_offsets: dict[QueueKey, int] = {}
        # Per topic, the listeners that want its events (asked once per topic in this call).
        wanted: dict[str, list[DispatchListener]] = {}
        start = 0
        while start < len(prepared):
            mf = self._log.segment_for(prepared[start].size)
            run = self._encode_run(
                prepared,
                start,
                mf.start_offset + mf.wrote,
                mf.remaining,
                now_ms,
                next_offsets,
                wanted,
            )
            written = run.end_offset - mf.start_offset - mf.wrote
            if written >= LARGE_RECORD_BYTES * (run.end - start):
                _write_large(mf, run.parts)
            else:
                mf.append(b"".join(run.parts))
            self._dispatch_run(run, next_offsets, results)
            start = run.end

    def _encode_run(
        self,
        prepared: Sequence[put.Prepared],
        start: int,
        physical_offset: int,
        remaining: int,
        now_ms: int,
        next_offsets: dict[QueueKey, int],
        wanted: dict[str, list[DispatchListener]],
    ) -> _Run:
        """The records from `start` on that fit a segment with `remaining` bytes, encoded at
        `physical_offset` on, with their consume-queue and index entries, events and results."""
        run = _Run()
        parts, results, index_entries = run.parts, run.results, run.index_entries
        queue_entries, first_offsets = run.queue_entries, run.first_offsets
        room = remaining - rec.BLANK_MARKER_SIZE
        index_keys = dsp.index_keys
        # The queue of the previous record (a batch has one; a group of sends few runs).
        topic, queue_id, first, targets = "", -1, 0, []
        entries: list[CqEntry] | None = None
        i, count = start, len(prepared)
        while i < count and prepared[i].size <= room:
            item = prepared[i]
            msg, size = item.fields, item.size
            store_ts = msg.store_timestamp if msg.store_timestamp is not None else now_ms
            tx = msg.sys_flag & TX_MASK
            if tx != TX_PREPARED and tx != TX_ROLLBACK:
                if entries is None or msg.queue_id != queue_id or msg.topic != topic:
                    topic, queue_id = msg.topic, msg.queue_id
                    key = (topic, queue_id)
                    entries = queue_entries.get(key)
                    if entries is None:
                        entries = queue_entries[key] = []
                        first_offsets[key] = self._next_queue_offset(key, next_offsets)
                    first = first_offsets[key]
                    found = wanted.get(topic)
                    if found is None:
                        found = wanted[topic] = wanting(self._listeners, topic)
                    targets = found
                queue_offset = first + len(entries)
                entries.append((physical_offset, size, item.tags_code))
                if targets:
                    event = DispatchEvent(
                        topic,
                        queue_id,
                        queue_offset,
                        physical_offset,
                        size,
                        item.tags_code,
                        store_ts,
                        item.properties,
                    )
                    run.events.append((event, targets))
            else:
                queue_offset = 0
            parts += item.encode(queue_offset, physical_offset, store_ts)
            if tx != TX_ROLLBACK:
                for index_key in index_keys(item.properties):
                    index_entries.append((f"{msg.topic}#{index_key}", physical_offset, store_ts))
            results.append(
                _new_result(PutResult, (_PUT_OK, physical_offset, queue_offset, size, store_ts, ""))
            )
            physical_offset += size
            room -= size
            i += 1
        run.end, run.end_offset = i, physical_offset
        return run

    def _next_queue_offset(self, key: QueueKey, next_offsets: dict[QueueKey, int]) -> int:
        """The queue offset the next record of queue `key` gets: after this append's earlier
        runs, else read from its consume queue."""
        first = next_offsets.get(key, -1)
        if first < 0:
            cq = self._queues.get(key)
            first = cq.max_offset if cq is not None else 0
        return first

    def _dispatch_run(
        self, run: _Run, next_offsets: dict[QueueKey, int], results: list[PutResult]
    ) -> None:
        """After `run` is in the log: its consume-queue and index entries, then its results and
        the listeners' events. Raises DispatchFailed when an entry could not be written."""
        try:
            for key, entries in run.queue_entries.items():
                first = run.first_offsets[key]
                next_offsets[key] = first + len(entries)
                self._queue_of(*key).put_run(first, entries)
            if run.index_entries:
                self._index.put_many(run.index_entries)
        except OSError as exc:
            # The run is in the log (recovery will dispatch it): it is answered as stored,
            # and nothing more is written until then.
            self.broken = (
                f"dispatch failed after commit-log offset {self.dispatched} ({exc}); "
                "writes resume once it is re-dispatched"
            )
            results += run.results
            raise DispatchFailed(self.broken) from exc
        self.dispatched = run.end_offset
        results += run.results
        send_events(run.events)

    def dispatch_scanned(self, message: rec.StoredMessage, index_it: bool) -> PutAt | None:
        """Dispatch one record read back from the log (recovery's scan, the re-dispatch after a
        failed dispatch): its consume-queue entry at the queue offset it carries and
        (`index_it`) its index entries, as `append` gave them. No event: the caller sends those
        (dispatch_retry.notify_listeners) once the records are dispatched. Returns the consume
        queue's PutAt (None: the record gets no entry)."""
        index_entries: list[tuple[str, int, int]] = []
        outcome = self._scanned_entries(message, index_entries if index_it else None)
        if index_entries:
            self._index.put_many(index_entries)
        return outcome

    def dispatch_placed_run(self, records: Sequence[rec.PlacedRecord]) -> PlacedDispatch:
        """`dispatch_scanned` of consecutive records, all indexed (a slave's append of its
        master's records, store/replica.py), in fewer writes: each queue's entries with one
        write where they continue it (else entry by entry, as `dispatch_scanned`), the index
        entries with one index-header update. Returns the entries not simply appended, with
        their outcome, and the listeners' events, to send once the records count as dispatched.

        Raises:
            OSError: an entry could not be written (those written stay; re-dispatch is
                idempotent).
        """
        queue_runs: dict[QueueKey, _QueueRun] = {}
        index_entries: list[tuple[str, int, int]] = []
        events: list[tuple[DispatchEvent, list[DispatchListener]]] = []
        wanted: dict[str, list[DispatchListener]] = {}  # asked once per topic, as a put does
        decode, index_keys, tags_code_of = props.decode_properties, dsp.index_keys, dsp.tags_code_of
        # The queue of the previous record, its run's lists and the listeners of its topic.
        topic, queue_id, targets = "", -1, []
        queue_records: list[rec.PlacedRecord] = []
        queue_entries: list[CqEntry] = []
        for record in records:
            size, qid, queue_offset, physical_offset, sys_flag, store_ts, rtopic, text = record
            properties = decode(text)
            tx = sys_flag & TX_MASK
            if tx != TX_ROLLBACK:
                for key in index_keys(properties):
                    index_entries.append((f"{rtopic}#{key}", physical_offset, store_ts))
            if tx in (TX_PREPARED, TX_ROLLBACK):
                continue  # no consume-queue entry, no event
            if qid != queue_id or rtopic != topic:
                topic, queue_id = rtopic, qid
                queue_run = queue_runs.get((topic, queue_id))
                if queue_run is None:
                    queue_run = queue_runs[(topic, queue_id)] = _QueueRun()
                queue_records, queue_entries = queue_run.records, queue_run.entries
                found = wanted.get(topic)
                if found is None:
                    found = wanted[topic] = wanting(self._listeners, topic)
                targets = found
            tags_code = tags_code_of(properties)
            queue_records.append(record)
            queue_entries.append((physical_offset, size, tags_code))
            if targets:
                properties.pop(rec.CRC_PROPERTY, None)
                properties.pop(dsp.TAGS_CODE_PROPERTY, None)
                event = DispatchEvent(
                    topic, qid, queue_offset, physical_offset, size, tags_code, store_ts, properties
                )
                events.append((event, targets))
        unusual = self._write_queue_runs(queue_runs)
        if index_entries:
            self._index.put_many(index_entries)
        return PlacedDispatch(unusual, events)

    def _write_queue_runs(
        self, queue_runs: dict[QueueKey, _QueueRun]
    ) -> list[tuple[rec.PlacedRecord, PutAt]]:
        """Write each queue's entries (`dispatch_placed_run`): in one write when their queue
        offsets follow each other and the queue (`ConsumeQueue.append_run`), else each with
        `put_at`. Returns the entries whose outcome was not APPENDED."""
        unusual: list[tuple[rec.PlacedRecord, PutAt]] = []
        queue_offset_of = _QUEUE_OFFSET_OF
        for key, run in queue_runs.items():
            cq = self._queue_of(*key)
            first = run.records[0].queue_offset
            offsets = list(map(queue_offset_of, run.records))
            if offsets == list(range(first, first + len(offsets))) and cq.append_run(
                first, run.entries
            ):
                continue
            for record, (physical_offset, size, tags_code) in zip(
                run.records, run.entries, strict=True
            ):
                outcome = cq.put_at(record.queue_offset, physical_offset, size, tags_code)
                if outcome is not PutAt.APPENDED:
                    unusual.append((record, outcome))
        return unusual

    def _scanned_entries(
        self, message: rec.StoredMessage, index_entries: list[tuple[str, int, int]] | None
    ) -> PutAt | None:
        """Write the consume-queue entry of `message`; add its index entries to
        `index_entries` (None: not indexed)."""
        properties = props.decode_properties(message.properties)
        tx = message.sys_flag & TX_MASK
        outcome = None
        if tx != TX_PREPARED and tx != TX_ROLLBACK:
            outcome = self._queue_of(message.topic, message.queue_id).put_at(
                message.queue_offset,
                message.physical_offset,
                message.total_size,
                dsp.tags_code_of(properties),
            )
        if index_entries is not None and tx != TX_ROLLBACK:
            for key in dsp.index_keys(properties):
                index_entries.append(
                    (f"{message.topic}#{key}", message.physical_offset, message.store_timestamp)
                )
        return outcome


class _QueueRun:
    """One queue's records in a run of placed records, and their consume-queue entries
    (`Appender.dispatch_placed_run`)."""

    __slots__ = ("entries", "records")

    def __init__(self) -> None:
        self.records: list[rec.PlacedRecord] = []
        self.entries: list[CqEntry] = []


# A placed record's queue offset, at C speed.
_QUEUE_OFFSET_OF: Final = operator.itemgetter(rec.PlacedRecord._fields.index("queue_offset"))


class PlacedDispatch(NamedTuple):
    """What `Appender.dispatch_placed_run` leaves to its caller."""

    # The records whose consume-queue entry was not simply appended, and what put_at found
    # (recovery.recover_check_outcome logs a hole or a rewritten entry).
    unusual: list[tuple[rec.PlacedRecord, PutAt]]
    # The listeners' events, to send once the records count as dispatched (`send_events`).
    events: list[tuple[DispatchEvent, list[DispatchListener]]]


def send_events(events: Sequence[tuple[DispatchEvent, Sequence[DispatchListener]]]) -> None:
    """Call each event's listeners, in order; a listener that raises is logged and skipped."""
    for event, targets in events:
        for listener in targets:
            try:
                listener(event)
            except Exception:
                logger.exception("dispatch listener %r failed", listener)


class DispatchFailed(OSError):
    """A run was written to the commit log but not dispatched; see `Appender.broken`."""


def wanting(listeners: Listeners, topic: str) -> list[DispatchListener]:
    """The listeners whose filter wants `topic` (a failing filter counts as wanting it)."""
    found: list[DispatchListener] = []
    for listener, wants in listeners:
        if wants is None:
            found.append(listener)
            continue
        try:
            if wants(topic):
                found.append(listener)
        except Exception:
            logger.exception("dispatch topic filter %r failed", wants)
            found.append(listener)
    return found
