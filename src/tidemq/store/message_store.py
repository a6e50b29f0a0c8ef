"""FileMessageStore: the commit log, consume queues, key index and checkpoint under one root.

    <root_dir>/
      commitlog/<20-digit start offset>            records (commit_log.py)
      consumequeue/<topic>/<queueId>/<20 digits>   20-byte entries (consume_queue.py)
      consumequeue/.queues                         the queues that exist (queue_manifest.py)
      index/<20 digits>                            key hash files (index.py)
      checkpoint                                   flushed offsets (checkpoint.py)
      lock                                         flock'd by the live store, holds its pid
                                                   (lock.py: one broker per store)
      abort                                        exists while running: its presence at start
                                                   means the last stop was not clean
      epochs, truncate                             controller mode: epoch history (epochs.py),
                                                   an unfinished cut, redone at start (truncate.py)

One thread (the broker's event loop) calls put/get; a flush thread calls `flush()`. A put
appends the record and dispatches it at once (consume-queue entry, index entries, listeners;
store/append.py), so a record is readable as soon as put returns. Durability is the flush's
business: the broker waits for `flushed_physical_offset` (SYNC_FLUSH) or flushes periodically
(ASYNC_FLUSH).

Replication (store/replica.py): a master's HA senders read the log with `read_replica`, woken
by the append listeners; a slave's store, in replica mode (puts refused), takes its master's
bytes with `append_replica`, which dispatches them as the put did on the master.
"""

from __future__ import annotations

import errno
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import StoreError
from tidemq.limits import PULL_BYTES_MAX
from tidemq.protocol import message as props
from tidemq.protocol import record as rec
from tidemq.store import append, get, put, queue_manifest, replica, truncate
from tidemq.store import dispatch as dsp
from tidemq.store.checkpoint import Checkpoint, CheckpointFile, read_checkpoint
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import StoreConfig
from tidemq.store.consume_queue import ConsumeQueue, flush_queues
from tidemq.store.dispatch_retry import DispatchRetry, notify_listeners, redispatch_from
from tidemq.store.index import IndexService
from tidemq.store.lazy_file import MappingCache
from tidemq.store.lock import StoreLock
from tidemq.store.recovery import NeedFullRebuild, RecoveryReport, recover
from tidemq.store.types import (
    DispatchEvent,
    GetResult,
    GetStatus,
    MessageToStore,
    PutResult,
    PutStatus,
)

logger = logging.getLogger(__name__)

# Disk usage is measured at most this often (a statvfs per put would be wasteful).
DISK_CHECK_INTERVAL_MS: Final = 1_000
# query_by_key reads this many extra candidates, for hash collisions and stale entries.
QUERY_CANDIDATES_EXTRA: Final = 64
# A slave's put answer (the broker refuses sends to a slave before, with SLAVE_NOT_AVAILABLE).
REPLICA_MODE_REFUSAL: Final = "store is a slave replica: writes come from its master"

DiskUsageProbe = Callable[[Path], float]


def _measure_disk_usage(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return 100.0 * usage.used / usage.total if usage.total else 0.0


class FileMessageStore:
    def __init__(
        self,
        config: StoreConfig,
        clock: Clock,
        *,
        disk_usage_probe: DiskUsageProbe | None = None,
    ):
        self.config = config
        self.clock = clock
        root = config.root_dir
        self._log = CommitLog(
            root / "commitlog",
            config.commit_log_file_size,
            resident_bytes=config.commit_log_resident_bytes,
        )
        self._cq_root = root / "consumequeue"
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._mappings = MappingCache()  # of every consume queue's files (lazy_file.py)
        self._queues_made = self._manifest_made = 0  # queues created / named by the manifest
        self._index = IndexService(
            root / "index", config.index_slot_count, config.index_entry_count
        )
        self._checkpoint: CheckpointFile | None = None
        self._listeners: append.Listeners = []
        # Told the new max physical offset after each put pass or replica append that wrote.
        self._append_listeners: list[Callable[[int], None]] = []
        self._replica_mode = False  # a slave's: its writes come from its master only
        self._probe = disk_usage_probe or _measure_disk_usage
        self._disk_ratio = 0.0
        self._disk_checked_ms: float | None = None
        self._appender = append.Appender(
            self._log, self._queues, self._queue, self._index, self._listeners, clock
        )
        self._running = False
        # Held by the commit log's flush and by anything that closes or deletes its files.
        self._flush_lock = threading.Lock()
        # The same for consume queues, index and checkpoint (taken after _flush_lock when both
        # are): a group-commit round syncing the log never waits behind their flush.
        self._derived_lock = threading.Lock()
        self._checkpointed = 0  # the log offset of the last checkpoint written
        # Guards the consume-queue table against the flush thread iterating it.
        self._table_lock = threading.Lock()
        self.last_recovery: RecoveryReport | None = None
        self._lock: StoreLock | None = None
        self._retry = DispatchRetry()  # after a failed dispatch (dispatch_retry.py)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def _abort_path(self) -> Path:
        return self.config.root_dir / "abort"

    def start(self) -> None:
        """Lock the store, recover it and open it for writing.

        Raises:
            StoreLockedError: another live store holds the directory; nothing was read or
                changed (the lock is the first thing taken).
            StoreError: recovery refused a corrupt log (see recovery.py).
        """
        assert not self._running
        root = self.config.root_dir
        root.mkdir(parents=True, exist_ok=True)
        self._lock = StoreLock(root)
        try:
            self._start_locked(root)
        except BaseException:
            self._lock.release()
            self._lock = None
            raise

    def _start_locked(self, root: Path) -> None:
        truncate.redo_pending(root, self.config)  # first: it also leaves `abort` (a crash start)
        clean_stop = not self._abort_path.exists()
        checkpoint = read_checkpoint(root / "checkpoint")
        self._log.load()
        cq_dir_lost = bool(self._log.files.files) and not self._cq_root.is_dir()
        self._load_queues()
        index_ok = self._index.load()
        full = checkpoint is None or cq_dir_lost or not index_ok
        exact = queue_manifest.complete(self._cq_root, self._queues.keys())
        if cq_dir_lost:
            logger.warning("consumequeue directory missing: rebuilding it from the commit log")
        while True:
            if full:
                self._index.destroy_all()
            try:
                self.last_recovery = recover(
                    log=self._log,
                    checkpoint=checkpoint,
                    clean_stop=clean_stop,
                    full=full,
                    dispatch=self._appender.dispatch_scanned,
                    queues=lambda: list(self._queues.values()),
                    corrupt_policy=self.config.corrupt_policy,
                    exact_start=exact,
                )
                break
            except NeedFullRebuild as exc:
                logger.warning("partial recovery not enough (%s): full rebuild", exc)
                full = True
                if exc.started_queue is not None:
                    self._queues.pop(exc.started_queue).destroy()
        self._appender.dispatched = self._log.max_offset
        queue_manifest.write(self._cq_root, self._queues.keys())
        self._checkpoint = CheckpointFile(root / "checkpoint")
        self._running = True
        self.flush()
        self._abort_path.touch()

    def shutdown(self) -> None:
        if not self._running:
            return
        self.flush()
        self._running = False
        with self._flush_lock, self._derived_lock:
            for cq in self._queues.values():
                cq.close()
            self._index.close()
            self._log.close()
            if self._checkpoint is not None:
                self._checkpoint.close()
            queue_manifest.write(self._cq_root, self._queues.keys())
        self._abort_path.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()  # last: the files are closed and the stop is recorded
            self._lock = None

    def _load_queues(self) -> None:
        for topic, queue_id in queue_manifest.queue_dirs(self._cq_root):
            cq = self._new_queue(topic, queue_id)
            cq.load()
            self._queues[(topic, queue_id)] = cq

    def _new_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        entries = self.config.consume_queue_file_entries
        return ConsumeQueue(self._cq_root, topic, queue_id, entries, mappings=self._mappings)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = self._new_queue(topic, queue_id)
            with self._table_lock:
                self._queues[(topic, queue_id)] = cq
                # Named by the next flush, before its checkpoint (not per queue: 10,000 new
                # queues would write it 10,000 times); recovery's, at the end of start.
                self._queues_made += 1
        return cq

    # --- dispatch -----------------------------------------------------------------------------

    def add_dispatch_listener(
        self, fn: Callable[[DispatchEvent], None], wants: Callable[[str], bool] | None = None
    ) -> None:
        """Call `fn` with the event of each record that gets a consume-queue entry, in order,
        after its run is written. With `wants`, only for the topics it accepts: it is asked once
        per topic in each put, so records nobody wants cost no event at all."""
        self._listeners.append((fn, wants))

    # --- put ----------------------------------------------------------------------------------

    def put_message(self, msg: MessageToStore) -> PutResult:
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: Sequence[MessageToStore]) -> list[PutResult]:
        """Append messages of one topic and queue with consecutive queue offsets.

        Every check that can refuse (state, disk, sizes, hosts) runs before the first append,
        so a batch is refused whole or appended whole (barring an I/O error mid-way). The records
        are encoded into one buffer per commit-log segment they land in (one copy into the
        mapping each), then dispatched together: their consume-queue entries in one write, their
        index entries with one index-header update.
        """
        if not msgs:
            return []
        checked = self._check_writable() or append.check_batch(msgs, self.config)
        if isinstance(checked, PutResult):
            return [checked] * len(msgs)
        return self._append(checked)

    def put_each(self, msgs: Sequence[MessageToStore]) -> list[PutResult]:
        """Append messages of any topics and queues, in order, each checked and answered on its
        own: one message's refusal (size, properties, hosts, topic) answers that message only.

        One pass as `put_messages` makes it (one buffer per segment, consume-queue entries in one
        write per queue, index entries together), so N single sends cost one put, and each
        record is the bytes `put_message` would have written for it.
        """
        refusal = self._check_writable() if msgs else None
        if refusal is not None:
            return [refusal] * len(msgs)
        refusals, prepared = append.check_each(msgs, self.config)
        appended = iter(self._append(prepared))
        return [next(appended) if r is None else r for r in refusals]

    def _check_writable(self) -> PutResult | None:
        if not self._running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error="store is not running")
        if self._replica_mode:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=REPLICA_MODE_REFUSAL)
        if self._appender.broken is not None and not self.retry_dispatch():
            wait_ms = max(0.0, self._retry.due_ms - self.clock.monotonic_ms())
            error = f"{self._appender.broken}; next try in {wait_ms:.0f} ms"
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=error)
        ratio = self.disk_usage_ratio_percent()
        limit = self.config.disk_max_used_space_ratio_percent
        if ratio > limit:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE,
                error=f"disk usage {ratio:.0f}% exceeds diskMaxUsedSpaceRatio {limit}%",
            )
        return None

    def _append(self, prepared: list[put.Prepared]) -> list[PutResult]:
        """The results of appending `prepared`; after an OSError, the failure for the rest."""
        results: list[PutResult] = []
        if not prepared:
            return results
        before = self._log.max_offset
        try:
            self._appender.append(prepared, results)
        except OSError as exc:
            self._append_failed(exc)
            status = (
                PutStatus.SERVICE_NOT_AVAILABLE
                if exc.errno == errno.ENOSPC
                else PutStatus.UNKNOWN_ERROR
            )
            failed = PutResult(status, error=f"append failed: {exc}")
            results.extend([failed] * (len(prepared) - len(results)))
        self._tell_appended(before)
        return results

    def _append_failed(self, exc: OSError) -> None:
        if isinstance(exc, append.DispatchFailed):
            logger.exception("commit-log append stopped: %s", exc)
            self._retry.start(self.clock.monotonic_ms())
        else:
            logger.exception("commit-log append failed")

    def _tell_appended(self, before: int) -> None:
        """Tell the append listeners the log's new end, if it moved past `before`."""
        end = self._log.max_offset
        if end == before:
            return
        for listener in self._append_listeners:
            try:
                listener(end)
            except Exception:
                logger.exception("append listener %r failed", listener)

    def retry_dispatch(self) -> bool:
        """Re-dispatch what a failed dispatch left undispatched, if a retry is due (backoff:
        store/dispatch_retry.py); True when nothing is left (writes are accepted again).

        Called by the single writer: each refused put, and the broker's periodic tick.
        """
        broken = self._appender.broken
        if broken is None:
            return True
        now = self.clock.monotonic_ms()
        if not self._running or not self._retry.is_due(now):
            return False
        start = self._appender.dispatched
        try:
            scanned = redispatch_from(
                self._log, start, lambda m: self._appender.dispatch_scanned(m, True)
            )
        except (OSError, StoreError) as exc:
            self._retry.failed(now)
            logger.warning(
                "re-dispatch from commit-log offset %d failed (%s); next try in %.0f ms",
                start,
                exc,
                self._retry.interval_ms,
            )
            return False
        self._appender.broken = None
        self._appender.dispatched = self._log.max_offset
        logger.warning(
            "re-dispatched %d records from commit-log offset %d after %d failed retries; "
            "writes resume",
            len(scanned),
            start,
            self._retry.attempts,
        )
        notify_listeners(self._listeners, scanned)
        return True

    # --- replication (store/replica.py) -------------------------------------------------------

    def set_replica_mode(self, on: bool) -> None:
        """While on, puts answer SERVICE_NOT_AVAILABLE: a slave's writes come from its master."""
        self._replica_mode = on

    @property
    def replica_mode(self) -> bool:
        return self._replica_mode

    def add_append_listener(self, fn: Callable[[int], None]) -> None:
        """Call `fn` on the writer's thread with the new `max_physical_offset` after each put
        pass or replica append that wrote something (an HA master wakes its senders)."""
        self._append_listeners.append(fn)

    def append_replica(self, offset: int, data: bytes | memoryview) -> int:
        """Append the whole units of `data`, the master's log bytes from `offset`, and dispatch
        their records; returns the bytes consumed (the caller keeps the rest for the next
        frame). After any error, `max_physical_offset` is where the next bytes must start.

        Raises:
            ReplicaOffsetError: `offset` is not `max_physical_offset` (an empty store: not a
                segment start).
            ReplicaCorruptError: a unit is not valid; the valid units before it are appended.
            StoreError: the store is not running, its dispatch is broken, or a write failed.
        """
        if not self._running:
            raise StoreError("store is not running")
        if self._appender.broken is not None and not self.retry_dispatch():
            raise StoreError(self._appender.broken)
        before = self._log.max_offset
        try:
            return replica.append_replica(self._log, self._appender, offset, data)
        except OSError as exc:
            self._append_failed(exc)
            raise StoreError(f"replica append failed: {exc}") from exc
        finally:
            self._tell_appended(before)

    def read_replica(self, offset: int, size_max: int) -> bytes:
        """The log bytes at `offset` to the end of its segment's data, at most `size_max` (b""
        at the end). Raises ReplicaOffsetError below the first or beyond the last byte."""
        return replica.read_replica(self._log, offset, size_max)

    def bytes_before(self, end: int, size_max: int) -> bytes:
        """Up to `size_max` log bytes ending at `end`, from the segment holding `end - 1`."""
        return replica.bytes_before(self._log, end, size_max)

    # --- get ----------------------------------------------------------------------------------

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        max_bytes: int = PULL_BYTES_MAX,
        tag_codes: frozenset[int] | None = None,
        message_filter: Callable[[rec.StoredMessage], bool] | None = None,
        phys_limit: int | None = None,
    ) -> GetResult:
        """Up to `max_count` records of the queue from `offset` (store/get.py); with
        `phys_limit`, none that ends past that log offset."""
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE)
        return get.get_messages(
            cq, self._log, offset, max_count, max_bytes, tag_codes, message_filter, phys_limit
        )

    def min_offset(self, topic: str, queue_id: int) -> int:
        return cq.min_offset if (cq := self._queues.get((topic, queue_id))) else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        return cq.max_offset if (cq := self._queues.get((topic, queue_id))) else 0

    def visible_max_offset(self, topic: str, queue_id: int, log_end: int) -> int:
        return cq.max_offset_within(log_end) if (cq := self._queues.get((topic, queue_id))) else 0

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        cq = self._queues.get((topic, queue_id))
        entry = cq.get(offset) if cq is not None else None
        if entry is None:
            return None
        # The record's head up to its STORETIMESTAMP (64 bytes), decoded by the record module.
        data = self._log.read(entry[0], rec.STORE_TIMESTAMP_POS + rec.STORE_TIMESTAMP_SIZE)
        if data is None:
            return None
        return rec.store_timestamp_at(data)

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        ts = self.store_time_at(topic, queue_id, self.min_offset(topic, queue_id))
        return -1 if ts is None else ts

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The offset whose store time equals `timestamp_ms` (the first such), else the nearer
        neighbour (the earlier on a tie); the first/last offset outside the range; 0 if the
        queue is unknown or empty."""
        cq = self._queues.get((topic, queue_id))
        if cq is None or cq.max_offset <= cq.min_offset:
            return 0

        def time_at(offset: int) -> int:
            ts = self.store_time_at(topic, queue_id, offset)
            return ts if ts is not None else -1

        return get.offset_by_time(cq.min_offset, cq.max_offset, timestamp_ms, time_at)

    # --- lookups ------------------------------------------------------------------------------

    def read_record(self, physical_offset: int, *, from_peer: bool = False) -> bytes | None:
        """CommitLog.read_record: `from_peer` when a request named the offset."""
        return self._log.read_record(physical_offset, from_peer=from_peer)

    def read_raw(self, physical_offset: int, size_max: int) -> bytes:
        return self._log.read_raw(physical_offset, size_max)

    def query_by_key(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[bytes]:
        """Records of `topic` whose KEYS words or UNIQ_KEY equal `key`, newest first."""
        candidates = self._index.query(
            f"{topic}#{key}", max_count + QUERY_CANDIDATES_EXTRA, begin_ms, end_ms
        )
        found: list[bytes] = []
        seen: set[int] = set()
        for phys in candidates:
            if len(found) >= max_count:
                break
            if phys in seen or phys < self._log.min_offset:
                continue
            seen.add(phys)
            data = self._log.read_record(phys)
            if data is None:
                continue
            message = rec.decode_record(data)
            if message.topic != topic or not begin_ms <= message.store_timestamp <= end_ms:
                continue
            if key in dsp.index_keys(props.decode_properties(message.properties)):
                found.append(data)
        return found

    def topics_and_queues(self) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self._queues):
            result.setdefault(topic, []).append(queue_id)
        return result

    def delete_topic(self, topic: str) -> None:
        with self._derived_lock, self._table_lock:
            for key in [k for k in self._queues if k[0] == topic]:
                self._queues.pop(key).destroy()
        shutil.rmtree(self._cq_root / topic, ignore_errors=True)
        queue_manifest.write(self._cq_root, self._queues.keys())

    # --- durability ---------------------------------------------------------------------------

    @property
    def min_physical_offset(self) -> int:
        return self._log.min_offset

    @property
    def max_physical_offset(self) -> int:
        return self._log.max_offset

    @property
    def flushed_physical_offset(self) -> int:
        return self._log.flushed_offset

    def flush(self, *, log_only: bool = False) -> int:
        """Sync the commit log, then (unless `log_only`) consume queues, index and checkpoint."""
        with self._flush_lock:
            if not self._running:
                return self._log.flushed_offset
            dispatched = self._appender.dispatched
            log_flushed = self._log.flush()
        if log_only:
            return log_flushed
        with self._derived_lock:
            if not self._running:
                return log_flushed
            with self._table_lock:
                queues = list(self._queues.values())
                made = self._queues_made
            flush_queues(queues)  # if it raises, the next flush writes the manifest
            if made != self._manifest_made:
                queue_manifest.write(self._cq_root, ((cq.topic, cq.queue_id) for cq in queues))
                self._manifest_made = made
            self._index.flush()
            # Two full flushes can overlap (a stop's last flush and a cancelled task's thread):
            # the checkpoint never moves back.
            if self._checkpoint is not None and log_flushed >= self._checkpointed:
                self._checkpointed = log_flushed
                self._checkpoint.write(
                    Checkpoint(log_flushed, min(dispatched, log_flushed), self.clock.now_ms())
                )
            return log_flushed

    # --- retention and disk guard -------------------------------------------------------------

    def disk_usage_ratio_percent(self) -> float:
        now = self.clock.monotonic_ms()
        if self._disk_checked_ms is None or now - self._disk_checked_ms >= DISK_CHECK_INTERVAL_MS:
            self._disk_ratio = self._probe(self.config.root_dir)
            self._disk_checked_ms = now
        return self._disk_ratio

    def clean_expired_files(self, now_ms: int, force: bool = False) -> int:
        """Delete expired commit-log segments, then what points below the new minimum."""
        over = self.disk_usage_ratio_percent() > self.config.disk_max_used_space_ratio_percent
        hour = time.localtime(now_ms / 1000).tm_hour
        if not (force or over or hour == self.config.delete_when_hour):
            return 0
        reserved_ms = self.config.file_reserved_time_hours * 3_600_000
        expired = 0
        for mf in self._log.files.files[:-1]:  # never the segment being written
            if mf.path.stat().st_mtime_ns // 1_000_000 + reserved_ms > now_ms:
                break
            expired += 1
        if not expired:
            return 0
        with self._flush_lock, self._derived_lock:
            removed = self._log.files.delete_first(expired)
            log_min = self._log.min_offset
            for cq in list(self._queues.values()):
                removed += cq.delete_below_physical(log_min)
            removed += self._index.delete_below(log_min)
        logger.info("retention removed %d files; commit log now starts at %d", removed, log_min)
        self._disk_checked_ms = None
        return removed
