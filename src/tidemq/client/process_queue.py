"""The consumer's per-queue buffer: pulled messages not yet consumed, and the offset to commit.

Messages of one queue arrive in increasing queue offset, so an insertion-ordered dict keyed by
offset stays sorted: its first key is the lowest unfinished message. The offset committed for a
queue is that key (messages below it are all done), or, when nothing is pending, the furthest
`next_begin_offset` pulls have reached (`pulled_to`): past messages the tag filter dropped and
records that could not be decoded (client/pull_answer.py), so neither holds the queue back. A
slow or failing message holds the committed offset back, never forward: after a crash the group
re-delivers from the lowest unfinished message (at-least-once).

    pulled:   10 11 12 13 14 [15 undecodable]  next_begin_offset 16    consumed: 10 12 13
    pending:     11       14                   commit offset = 11 (16 once 11 and 14 are done)

Orderly consumption takes messages out in order into an "in flight" set (`take`), and either
commits them (`commit_taken`) or puts them back for another try (`return_taken`).

Flow control: `cached_count`/`cached_bytes` against the consumer's thresholds; the pull loop
awaits `wait_below(...)` instead of polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tidemq.client.message import MessageExt


class ProcessQueue:
    def __init__(self) -> None:
        self._pending: dict[int, MessageExt] = {}
        self._taken: dict[int, MessageExt] = {}
        self._max_offset_seen = -1
        # The furthest next_begin_offset of a pull whose messages were all put here (-1: none).
        self._pulled_to = -1
        self._bytes = 0
        self._changed = asyncio.Event()
        self.dropped = False
        # Orderly consumption: whether the broker lock is held, and when it was last renewed.
        self.locked = False
        self.lock_renewed_at_ms = 0.0

    @property
    def cached_count(self) -> int:
        return len(self._pending) + len(self._taken)

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def put(self, messages: Iterable[MessageExt]) -> list[MessageExt]:
        """Add pulled messages; returns those that were new (a re-pull may repeat some)."""
        added: list[MessageExt] = []
        for message in messages:
            offset = message.queue_offset
            if offset in self._pending or offset in self._taken:
                continue
            self._pending[offset] = message
            self._bytes += len(message.body)
            self._max_offset_seen = max(self._max_offset_seen, offset)
            added.append(message)
        return added

    def pulled_to(self, next_begin_offset: int) -> None:
        """A pull's messages were put: everything below `next_begin_offset` is here or done."""
        self._pulled_to = max(self._pulled_to, next_begin_offset)

    def moved_to(self, offset: int) -> None:
        """The broker moved the queue's offset to `offset` (OFFSET_ILLEGAL), maybe backwards (the
        queue started again from 0): how far earlier pulls reached no longer says what is done,
        so neither mark may lift the committed offset above `offset`."""
        self._pulled_to = offset
        self._max_offset_seen = min(self._max_offset_seen, offset - 1)

    def remove(self, messages: Iterable[MessageExt]) -> int:
        """Mark messages done; returns the offset to commit (-1 if nothing was ever added)."""
        for message in messages:
            done = self._pending.pop(message.queue_offset, None)
            if done is not None:
                self._bytes -= len(done.body)
        self._changed.set()
        return self.commit_offset()

    def commit_offset(self) -> int:
        """The lowest unfinished offset, else how far pulls reached (-1: nothing seen)."""
        lowest = [next(iter(d)) for d in (self._taken, self._pending) if d]
        if lowest:
            return min(lowest)
        seen_end = self._max_offset_seen + 1 if self._max_offset_seen >= 0 else -1
        return max(seen_end, self._pulled_to)

    # Orderly: one batch in flight at a time, in offset order.

    def take(self, count: int) -> list[MessageExt]:
        assert count > 0
        batch: list[MessageExt] = []
        for offset in list(self._pending)[:count]:
            message = self._pending.pop(offset)
            self._taken[offset] = message
            batch.append(message)
        return batch

    def commit_taken(self) -> int:
        """The in-flight batch is done; returns the offset to commit."""
        for message in self._taken.values():
            self._bytes -= len(message.body)
        self._taken.clear()
        self._changed.set()
        return self.commit_offset()

    def return_taken(self, replacements: Iterable[MessageExt] = ()) -> None:
        """Put the in-flight batch back in front (optionally with updated copies)."""
        back = dict(self._taken)
        for message in replacements:
            if message.queue_offset in back:
                back[message.queue_offset] = message
        self._taken.clear()
        back.update(self._pending)
        self._pending = back

    def drop(self) -> None:
        self.dropped = True
        self._changed.set()

    async def wait_below(self, count_max: int, bytes_max: int) -> None:
        """Return once the cache is under both thresholds (or the queue was dropped)."""
        while not self.dropped and (self.cached_count >= count_max or self._bytes >= bytes_max):
            self._changed.clear()
            await self._changed.wait()

    async def wait_changed(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def notify(self) -> None:
        self._changed.set()
