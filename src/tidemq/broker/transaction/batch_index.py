"""The batch index of the exactly-once Spark sink: what the batch records say, per sink and
batch (bounded: an LRU of sinks, the newest batches of each), and the pending tagged halves per
batch. batch.py (SinkBatchResolver) keeps it; the module docstring there says what it holds and
why its bounds suffice.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Final

from tidemq.broker.transaction.batch_record import BatchOutcome, BatchRecord, Holders, SparkTxn

# Batch records remembered per sink: a query only ever replays its last batch, so a few suffice.
BATCH_RECORDS_PER_SINK_MAX: Final = 16
# Sinks remembered (LRU); each holds at most BATCH_RECORDS_PER_SINK_MAX records.
BATCH_SINKS_MAX: Final = 1_024


@dataclass(slots=True)
class BatchState:
    """What the records say about one batch."""

    committed: frozenset[str] | None = None  # the COMMIT decision's txns (decided or published)
    holders: Holders = ()  # the brokers holding halves of the decision
    published: bool = False  # the decision was published here (its halves resolved)
    rolled_back: set[str] = field(default_factory=set)
    closed: bool = False  # a final ROLLBACK was recorded: every half of it rolls back


@dataclass(slots=True)
class _SinkHistory:
    batches: collections.OrderedDict[int, BatchState] = field(
        default_factory=collections.OrderedDict
    )
    batch_max: int = -1


class BatchIndex:
    """Batch records (bounded, see the module docstring) and the pending tagged halves."""

    def __init__(
        self,
        *,
        records_per_sink_max: int = BATCH_RECORDS_PER_SINK_MAX,
        sinks_max: int = BATCH_SINKS_MAX,
    ) -> None:
        assert records_per_sink_max > 0
        assert sinks_max > 0
        self.records_per_sink_max = records_per_sink_max
        self.sinks_max = sinks_max
        self._sinks: collections.OrderedDict[str, _SinkHistory] = collections.OrderedDict()
        self._pending: dict[tuple[str, int], dict[int, str]] = {}
        self._batch_of: dict[int, tuple[str, int]] = {}

    @property
    def sinks(self) -> int:
        return len(self._sinks)

    @property
    def pending_count(self) -> int:
        return len(self._batch_of)

    def apply(self, record: BatchRecord) -> None:
        history = self._sinks.get(record.sink_id)
        if history is None:
            history = self._sinks[record.sink_id] = _SinkHistory()
            while len(self._sinks) > self.sinks_max:
                self._sinks.popitem(last=False)
        self._sinks.move_to_end(record.sink_id)
        history.batch_max = max(history.batch_max, record.batch_id)
        state = history.batches.setdefault(record.batch_id, BatchState())
        if record.outcome is BatchOutcome.COMMIT:
            state.committed = record.txns
            state.holders = record.holders
            state.published = record.published
        else:
            state.rolled_back |= record.txns
            state.closed = state.closed or record.final
        while len(history.batches) > self.records_per_sink_max:
            history.batches.popitem(last=False)

    def knows(self, sink_id: str) -> bool:
        """Whether the sink's records are in memory (its newest ones: see `restore`)."""
        return sink_id in self._sinks

    def restore(self, sink_id: str, records: list[BatchRecord]) -> None:
        """Remember a sink read back from disk: its `records`, oldest first (none: a sink
        without records, so that it is not looked up again while it stays remembered)."""
        if sink_id not in self._sinks:
            self._sinks[sink_id] = _SinkHistory()
            while len(self._sinks) > self.sinks_max:
                self._sinks.popitem(last=False)
        for record in records:
            self.apply(record)

    def state(self, sink_id: str, batch_id: int) -> BatchState | None:
        history = self._sinks.get(sink_id)
        return None if history is None else history.batches.get(batch_id)

    def batch_max(self, sink_id: str) -> int:
        """The highest batch id recorded for the sink (-1 when none is remembered)."""
        history = self._sinks.get(sink_id)
        return -1 if history is None else history.batch_max

    def track(self, origin: int, tag: SparkTxn) -> None:
        key = (tag.sink_id, tag.batch_id)
        self._pending.setdefault(key, {})[origin] = tag.txn
        self._batch_of[origin] = key

    def forget(self, origin: int) -> None:
        key = self._batch_of.pop(origin, None)
        if key is None:
            return
        pending = self._pending.get(key)
        if pending is not None:
            pending.pop(origin, None)
            if not pending:
                del self._pending[key]

    def pending(self, sink_id: str, batch_id: int) -> dict[int, str]:
        """origin → txn of the batch's halves not known to be resolved (a copy)."""
        return dict(self._pending.get((sink_id, batch_id), {}))

    def pending_batches(self) -> list[tuple[str, int]]:
        return list(self._pending)
