"""Consumer offsets: for each (topic, group), the next queue offset to consume, per queue id.

Persisted as `<root>/config/consumerOffset.json` in RocketMQ's shape (remoting.md §7):

    {"offsetTable":{"<topic>@<group>":{"0":12,"1":7}}}

RocketMQ's fastjson writes the queue ids unquoted (`{0:12}`); the reader accepts both forms, the
writer emits standard JSON. The file is written every flushConsumerOffsetInterval (5 s) when
something changed, and at shutdown, by replacement (temp file + rename) so a crash never leaves a
half-written table. Offsets committed after the last write are lost on a crash, which RocketMQ
accepts too: consumers then see those messages again (at-least-once).

Negative commits are ignored: ali-ons commits -1 for queues it has made no progress on, and storing
that would rewind the group (Java stores it blindly).

On a slave the table is its master's copy (slave_sync.py, GET_ALL_CONSUMER_OFFSET every
slaveSyncIntervalMs), but consumers also commit on the slave while the master is away, and those
commits must survive the master's return. So the copy is merged per queue id, not per
topic@group, and the slave remembers what was committed on it and not yet seen on the master
(`pending`). For each pending value p of a queue, with m the master's value in this copy and l
the master's value at the previous copy (or what this slave last pushed to it):

    m >= p                          p is settled: take m, drop p
    m < p (or none), m == l         the master has not moved: keep p, push it to the master
      or no previous copy           (UPDATE_CONSUMER_OFFSET; a failed push goes again next copy)
    m != l, m < p (or m gone)       the master moved it (an admin reset, a consumer committing
                                    there): take m, drop p

Queues without a pending value take the master's value; one the master lacks is dropped from
that topic@group, while topic@group pairs only the slave has are kept whole (RocketMQ's putAll).
Pending values live in memory only: a slave restarted during an outage forgets them and its
consumers see again what they consumed since their last copy (at-least-once).

The transaction check-back's progress (CID_RMQ_SYS_TRANS's half and op offsets, check_back.py)
skips halves resolved by op records. With `log_end` given, the file also keeps L, the log end
that progress covers (a master: its log end when the file was written; a slave: the
"tidemqLogOffset" of the master's copy that set it, slave_sync.py):

    {"offsetTable":{...},"logOffset":L}

A log that ends before L at load (truncated to follow a new master, issue 14, or its unflushed
tail lost in a crash) may lack op records that progress counted, and the halves they resolved
would never be checked back: CID_RMQ_SYS_TRANS's offsets are dropped, so the ledger's rebuild
replays the whole op queue and scans the half queue from its start. Both go, not the half
offset alone: rebuild replays ops only from just before the op offset, and a half whose op lies
before that would be taken for pending and checked again (resolved twice). Halves whose op
records remain are skipped as resolved (up to the ledger's outcome memory,
TRANSACTION_OUTCOMES_MAX op records); the others are checked back (at least once, never lost).
Other groups' offsets are kept. A file without L (older) loads as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson

from tidemq.broker.persist import ConfigWriter, quote_int_keys, read_optional
from tidemq.errors import ProtocolError
from tidemq.protocol.message import TRANS_CHECK_GROUP

log = logging.getLogger(__name__)

OFFSETS_FILE: Final = "consumerOffset.json"
KEY_SEPARATOR: Final = "@"
# consumerOffset.json's TideMQ key: the log end CID_RMQ_SYS_TRANS's progress covers (module doc).
LOG_OFFSET_FIELD: Final = "logOffset"


def table_key(topic: str, group: str) -> str:
    # Unambiguous because the handlers validate names (^[%|a-zA-Z0-9_-]+$) before they get here.
    assert KEY_SEPARATOR not in topic, topic
    assert KEY_SEPARATOR not in group, group
    return f"{topic}{KEY_SEPARATOR}{group}"


def split_key(key: str) -> tuple[str, str]:
    # Topics and groups never contain '@' (name rule ^[%|a-zA-Z0-9_-]+$).
    topic, _, group = key.partition(KEY_SEPARATOR)
    return topic, group


def decode_offsets(data: bytes) -> dict[str, dict[int, int]]:
    """The table of a consumerOffset.json document (queue ids quoted or not).

    Raises:
        ProtocolError: `data` is not a consumer offset table.
    """
    try:
        doc = orjson.loads(quote_int_keys(data))
        raw = doc.get("offsetTable") or {}
        return {
            str(key): {int(qid): int(offset) for qid, offset in queues.items()}
            for key, queues in raw.items()
        }
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ProtocolError(f"not a consumer offset table: {exc}") from exc


def _log_offset_of(data: bytes) -> int | None:
    """consumerOffset.json's "logOffset" (module doc); None when absent.

    Raises:
        ProtocolError: not an offset.
    """
    covered = orjson.loads(quote_int_keys(data)).get(LOG_OFFSET_FIELD)
    if covered is not None and (type(covered) is not int or covered < 0):
        raise ProtocolError(f"{LOG_OFFSET_FIELD} is not an offset: {covered!r}")
    return covered


@dataclass(frozen=True, slots=True)
class OffsetPush:
    """A slave's pending commit to send to its master (UPDATE_CONSUMER_OFFSET)."""

    topic: str
    group: str
    queue_id: int
    offset: int


@dataclass(slots=True)
class OffsetCopy:
    """What one copy of the master's table did: topic@group pairs changed, pushes due."""

    changed: int = 0
    pushes: list[OffsetPush] = field(default_factory=list)


class ConsumerOffsetTable:
    """In-memory table with explicit `persist()`; a `dirty` flag says whether a write is due."""

    def __init__(self, config_dir: Path, *, log_end: Callable[[], int] | None = None) -> None:
        """`log_end`: the store's log end, to keep and check what the check-back's progress
        covers (module doc); None: neither."""
        self._path = config_dir / OFFSETS_FILE
        self._log_end = log_end
        # The log end CID_RMQ_SYS_TRANS's offsets cover when a master's copy (or the file) set
        # them; None: moved here, they cover the log end when written.
        self._check_covered: int | None = None
        self._writer = ConfigWriter(self._path)
        self._table: dict[str, dict[int, int]] = {}
        # A slave's bookkeeping for merging the master's copies (module doc): commits made here
        # not yet seen on the master, and the master's values as last copied (or pushed).
        self._pending: dict[str, dict[int, int]] = {}
        self._copied: dict[str, dict[int, int]] = {}
        self.dirty = False

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> None:
        data = read_optional(self._path)
        if data is None:
            return
        try:
            table = decode_offsets(data)
            covered = _log_offset_of(data)
        except ProtocolError as exc:
            raise ProtocolError(f"{self._path}: {exc}") from exc
        self._table = table
        self.dirty = False
        end = self._log_end() if self._log_end is not None else None
        if covered is not None and end is not None and covered > end:
            dropped = [key for key in table if split_key(key)[1] == TRANS_CHECK_GROUP]
            log.warning(
                "%s: %s's progress covers the log up to %d but the log ends at %d (truncated, "
                "or its tail lost in a crash): its %d offsets are dropped; the transaction "
                "check-back scans the half and op queues from their start",
                self._path.name,
                TRANS_CHECK_GROUP,
                covered,
                end,
                len(dropped),
            )
            for key in dropped:
                del table[key]
            covered, self.dirty = None, True
        self._check_covered = covered
        log.info("loaded offsets of %d topic@group pairs from %s", len(table), self._path)

    def copy_from_master(self, data: bytes, log_offset: int | None = None) -> OffsetCopy:
        """A slave: merge the master's offsets (GET_ALL_CONSUMER_OFFSET's body) per queue id,
        keeping what was committed here and not yet on the master (the module doc's rule).
        `log_offset`: the master's log end the copy covers (None: unknown, then this log's end
        when written).

        Raises:
            ProtocolError: `data` is not a consumer offset table (nothing changes).
        """
        master = decode_offsets(data)
        if any(split_key(key)[1] == TRANS_CHECK_GROUP for key in master):
            self._check_covered = log_offset  # the master's replace the slave's (no pending)
        copy = OffsetCopy()
        for key in master.keys() | self._pending.keys():
            merged = self._merge(key, master.get(key), copy.pushes)
            if merged is None or self._table.get(key, {}) == merged:
                continue
            if merged:
                self._table[key] = merged
            else:
                self._table.pop(key, None)
            copy.changed += 1
        self._copied = master
        if copy.changed:
            self.dirty = True
        return copy

    def _merge(
        self, key: str, master: dict[int, int] | None, pushes: list[OffsetPush]
    ) -> dict[int, int] | None:
        """`key`'s queues after a copy (None: keep the slave's entry as it is); appends the
        pending values to push."""
        pending = self._pending.get(key, {})
        if master is None and not pending:
            return None  # only the slave has it (putAll)
        merged = dict(master) if master is not None else dict(self._table.get(key, {}))
        last = self._copied.get(key, {})
        topic, group = split_key(key)
        for queue_id, wanted in list(pending.items()):
            now = master.get(queue_id) if master is not None else None
            if now is not None and now >= wanted:
                del pending[queue_id]  # settled: the master has it (or more)
            elif queue_id not in last or last[queue_id] == now:
                merged[queue_id] = wanted  # the master has not moved: it gets ours
                pushes.append(OffsetPush(topic, group, queue_id, wanted))
            else:
                del pending[queue_id]  # the master moved it (a reset): its value wins
                if now is None:
                    merged.pop(queue_id, None)
        if not pending:
            self._pending.pop(key, None)
        return merged

    def pushed(self, push: OffsetPush) -> None:
        """The master stored `push` (it answered SUCCESS): its value as far as this slave knows,
        so the next copy does not take it for a reset."""
        self._copied.setdefault(table_key(push.topic, push.group), {})[push.queue_id] = push.offset

    def push_refused(self, push: OffsetPush) -> None:
        """The master refused `push` for good (no such topic or queue there): stop sending it;
        the next copy takes the master's value."""
        key = table_key(push.topic, push.group)
        pending = self._pending.get(key)
        if pending is not None and pending.get(push.queue_id) == push.offset:
            del pending[push.queue_id]
            if not pending:
                del self._pending[key]

    @property
    def pending_count(self) -> int:
        """Commits made on this slave that its master has not confirmed yet."""
        return sum(len(queues) for queues in self._pending.values())

    def _snapshot(self) -> bytes:
        doc: dict[str, object] = {
            "offsetTable": {
                key: {str(qid): off for qid, off in sorted(queues.items())}
                for key, queues in sorted(self._table.items())
            }
        }
        if self._log_end is not None:
            covered = self._check_covered
            doc[LOG_OFFSET_FIELD] = self._log_end() if covered is None else covered
        # Clear first: a commit after the snapshot keeps the table dirty for the next write.
        self.dirty = False
        return orjson.dumps(doc)

    def persist(self) -> None:
        """Write the table now, on this thread (start-up, shutdown)."""
        self._writer.write(self._snapshot())

    def persist_if_dirty(self) -> bool:
        """Snapshot now and write it in a thread when called on the event loop (periodic)."""
        if not self.dirty:
            return False
        self._writer.submit(self._snapshot())
        return True

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, *, pending: bool = False
    ) -> bool:
        """Store `offset` as the group's next offset for the queue. Negative offsets are ignored.

        `pending`: a consumer's commit on a slave, kept across the master's copies until the
        master has it (module doc)."""
        if offset < 0 or queue_id < 0:
            log.debug("ignoring offset %d for %s@%s queue %d", offset, topic, group, queue_id)
            return False
        key = table_key(topic, group)
        queues = self._table.setdefault(key, {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True
            if group == TRANS_CHECK_GROUP:
                self._check_covered = None  # moved here: covers this log's end when written
        if pending:
            self._pending.setdefault(key, {})[queue_id] = offset
        return True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(table_key(topic, group))
        if queues is None:
            return None
        return queues.get(queue_id)

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(table_key(topic, group), {}))

    def groups_of_topic(self, topic: str) -> set[str]:
        return {g for t, g in map(split_key, self._table) if t == topic}

    def topics_of_group(self, group: str) -> set[str]:
        return {t for t, g in map(split_key, self._table) if g == group}

    def remove_topic(self, topic: str) -> None:
        for key in [k for k in self._table if split_key(k)[0] == topic]:
            self._remove(key)

    def remove_group(self, group: str) -> None:
        for key in [k for k in self._table if split_key(k)[1] == group]:
            self._remove(key)

    def _remove(self, key: str) -> None:
        del self._table[key]
        self._pending.pop(key, None)
        self.dirty = True

    def items(self) -> Iterator[tuple[str, dict[int, int]]]:
        for key, queues in self._table.items():
            yield key, dict(queues)

    def to_json(self) -> bytes:
        """The whole table as GET_ALL_CONSUMER_OFFSET (43) answers it (standard JSON)."""
        return orjson.dumps(
            {
                "offsetTable": {
                    key: {str(q): o for q, o in queues.items()}
                    for key, queues in self._table.items()
                }
            }
        )
