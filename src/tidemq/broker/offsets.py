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
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson

from tidemq.broker.persist import ConfigWriter, quote_int_keys, read_optional
from tidemq.errors import ProtocolError

log = logging.getLogger(__name__)

OFFSETS_FILE: Final = "consumerOffset.json"
KEY_SEPARATOR: Final = "@"


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


class ConsumerOffsetTable:
    """In-memory table with explicit `persist()`; a `dirty` flag says whether a write is due."""

    def __init__(self, config_dir: Path) -> None:
        self._path = config_dir / OFFSETS_FILE
        self._writer = ConfigWriter(self._path)
        self._table: dict[str, dict[int, int]] = {}
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
        except ProtocolError as exc:
            raise ProtocolError(f"{self._path}: {exc}") from exc
        self._table = table
        self.dirty = False
        log.info("loaded offsets of %d topic@group pairs from %s", len(table), self._path)

    def copy_from_master(self, data: bytes) -> int:
        """A slave: take the master's offsets (GET_ALL_CONSUMER_OFFSET's body). Each topic@group
        the master has replaces the slave's; one only the slave has is kept (RocketMQ's putAll:
        commits made here while the master was away survive until the master has that pair).
        Returns how many pairs changed.

        Raises:
            ProtocolError: `data` is not a consumer offset table (nothing changes).
        """
        changed = 0
        for key, queues in decode_offsets(data).items():
            if self._table.get(key) != queues:
                self._table[key] = queues
                changed += 1
        if changed:
            self.dirty = True
        return changed

    def _snapshot(self) -> bytes:
        doc = {
            "offsetTable": {
                key: {str(qid): off for qid, off in sorted(queues.items())}
                for key, queues in sorted(self._table.items())
            }
        }
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

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Store `offset` as the group's next offset for the queue. Negative offsets are ignored."""
        if offset < 0 or queue_id < 0:
            log.debug("ignoring offset %d for %s@%s queue %d", offset, topic, group, queue_id)
            return False
        queues = self._table.setdefault(table_key(topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True
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
            del self._table[key]
            self.dirty = True

    def remove_group(self, group: str) -> None:
        for key in [k for k in self._table if split_key(k)[1] == group]:
            del self._table[key]
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
