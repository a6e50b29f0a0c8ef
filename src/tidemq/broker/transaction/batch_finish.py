"""Resolving a recorded batch's pending halves: in chunks, each chunk one `end_many` run.

Why chunks: a PUBLISH of a big batch resolves every half of it (a Spark micro-batch holds
hundreds of thousands of rows). Resolved one by one, in one loop turn, that held the broker's
event loop for seconds (measured: 50,000 halves, >12 s, heartbeats and the co-hosted name
server's route queries timing out after 3 s). Now:

- each chunk of FINISH_CHUNK_MAX halves is one `TransactionResolver.end_many` call: the real
  messages of its commits with one store call, one op message per outcome listing them all,
  instead of a store call and an op message per half;
- the half records come from the resolver's memory of recent prepares when it still has them
  (`answer_at`), else from the store;
- the END_BATCH handler awaits `finish_shared`, whose run (`finish_async`) lets the loop run
  between chunks (FINISH_TURN_BUDGET_S of work per turn at most), so no request waits behind a
  whole batch.

What decides each half is read once, when the END_BATCH stored (or found) its record
(`BatchDecision`), not per chunk: between turns the batch's state may leave the index's LRU, and
reading it back is a key-index query on the loop.

One finisher runs per batch (`finish_shared`). A repeated END_BATCH arriving while the halves
of the same decision are being resolved (a driver's retry after a timeout) awaits that run and
answers its counts and durability, rather than resolving what the first has not reached yet
itself: its answer would then cover only its own share, and under SYNC_FLUSH it could answer
SUCCESS before the commits the first one stored are flushed. An END_BATCH with another decision
(a ROLLBACK made final, a replay's COMMIT after a ROLLBACK) waits for the running one, then
resolves what is still pending; its durability covers the awaited run's too.

A half another path resolves between two chunks (a check-back's `decide_orphan`) is found
resolved by `end_many` and counted by neither: the first resolution stored it. Every step of one
half (ledger lookup, store, ledger update) still runs in one turn, so nothing is stored twice
(resolution.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass
from typing import Final

from tidemq.broker.transaction.batch_index import BatchState
from tidemq.broker.transaction.resolution import Answer, TransactionResolver
from tidemq.broker.transaction.states import TxInput
from tidemq.store.types import PutResult

log = logging.getLogger(__name__)

# Halves resolved by one end_many run (one put_each, one op message per outcome).
FINISH_CHUNK_MAX: Final = 128
# Work done before the loop gets a turn, in seconds (a chunk measured 5-15 ms on a busy host).
FINISH_TURN_BUDGET_S: Final = 0.008

# origin -> txn of a batch's pending halves (BatchIndex.pending).
Pending = dict[int, str]
# txn -> COMMIT, ROLLBACK or None (leave pending): what the batch's records decide.
Decide = Callable[[str], TxInput | None]


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What a batch's records decide for its halves (SinkBatchResolver._decision's rules)."""

    committed: frozenset[str] | None = None  # a published COMMIT's txns: the rest roll back
    rolled_back: Set[str] = frozenset()
    closed: bool = False  # a final ROLLBACK: every half rolls back
    superseded: bool = False  # a later batch of the sink is recorded: undecided halves roll back

    @classmethod
    def of(cls, state: BatchState | None, superseded: bool, *, copy: bool = True) -> BatchDecision:
        """The decision `state` holds; `copy` (a snapshot) unless it is used at once."""
        if state is None:
            return cls(superseded=superseded)
        rolled_back = frozenset(state.rolled_back) if copy else state.rolled_back
        committed = state.committed if state.published else None
        return cls(committed, rolled_back, state.closed, superseded)

    @property
    def decides_nothing(self) -> bool:
        """Every half stays pending (not recorded, or decided but not published here)."""
        return self.committed is None and not (self.closed or self.superseded or self.rolled_back)

    def decide(self, txn: str) -> TxInput | None:
        """COMMIT, ROLLBACK or None (leave pending) for a half of `txn`."""
        if self.committed is not None:
            return TxInput.COMMIT if txn in self.committed else TxInput.ROLLBACK
        if self.closed or self.superseded or txn in self.rolled_back:
            return TxInput.ROLLBACK
        return None


@dataclass(slots=True)
class FinishTally:
    committed: int = 0
    rolled_back: int = 0
    durable_end: int = 0  # commit-log end covering what was stored
    failure: PutResult | None = None  # a store refusal: the rest stays pending


@dataclass(frozen=True, slots=True)
class _Run:
    decision: BatchDecision
    task: asyncio.Future[FinishTally]


class BatchFinisher:
    """Resolves the pending halves of one batch (see the module docstring)."""

    def __init__(self, resolver: TransactionResolver, forget: Callable[[int], None]) -> None:
        self._resolver = resolver
        self._forget = forget
        self._runs: dict[tuple[str, int], _Run] = {}  # (sink id, batch id) -> its finisher

    async def finish_shared(
        self, key: tuple[str, int], pending: Callable[[], Pending], decision: BatchDecision
    ) -> FinishTally:
        """`finish_async` of the batch `key` (sink id, batch id), one run at a time per batch:
        a run of the same decision is awaited and its tally answered; one of another decision
        is awaited first (its durable_end kept). `pending` is read when this run starts."""
        if decision.decides_nothing:
            return FinishTally()
        covered = 0
        run = self._runs.get(key)
        while run is not None and run.decision != decision:
            await asyncio.wait([run.task])
            if not run.task.cancelled() and run.task.exception() is None:
                covered = max(covered, run.task.result().durable_end)
            run = self._runs.get(key)
        if run is None:
            started = _Run(
                decision, asyncio.ensure_future(self.finish_async(pending(), decision.decide))
            )
            started.task.add_done_callback(lambda _: self._ended(key, started))
            self._runs[key] = run = started
        # Shielded: a request that goes away (its connection closed) leaves the run to the others.
        tally = await asyncio.shield(run.task)
        return dataclasses.replace(tally, durable_end=max(tally.durable_end, covered))

    def _ended(self, key: tuple[str, int], run: _Run) -> None:
        if self._runs.get(key) is run:
            del self._runs[key]
        if not run.task.cancelled() and run.task.exception() is not None:
            # Retrieved here too: every request awaiting it may be gone.
            log.error("finishing batch %s/%d failed: %r", *key, run.task.exception())

    def finish(self, pending: Pending, decide: Decide) -> FinishTally:
        """Every chunk at once (the start's rebuild, tests)."""
        tally = FinishTally()
        for chunk in _chunks(pending):
            if not self._chunk(chunk, decide, tally):
                break
        return tally

    async def finish_async(self, pending: Pending, decide: Decide) -> FinishTally:
        """Chunk by chunk, yielding the loop once FINISH_TURN_BUDGET_S is spent."""
        tally = FinishTally()
        started = time.perf_counter()
        for chunk in _chunks(pending):
            if not self._chunk(chunk, decide, tally):
                break
            if time.perf_counter() - started >= FINISH_TURN_BUDGET_S:
                await asyncio.sleep(0)
                started = time.perf_counter()
        return tally

    def _chunk(self, chunk: list[tuple[int, str]], decide: Decide, tally: FinishTally) -> bool:
        """Resolve one chunk; False when the store refused (stop: the rest stays pending)."""
        resolver = self._resolver
        answers: list[Answer] = []
        for origin, txn in chunk:
            tx_input = decide(txn)
            if tx_input is None:
                continue
            entry = resolver.ledger.pending(origin)
            answer = None if entry is None else resolver.answer_at(entry.physical_offset, tx_input)
            if answer is None or answer.origin != origin:
                self._forget(origin)  # resolved elsewhere, or its record is gone
                continue
            answers.append(answer)
        if not answers:
            return True
        for answer, result in zip(answers, resolver.end_many(answers), strict=True):
            if isinstance(result, Exception):
                log.error(
                    "sink half %d not resolved (%s): %s",
                    answer.origin,
                    answer.tx_input.value,
                    result,
                )
                self._forget(answer.origin)
                continue
            if result.failure is not None:  # stays indexed, to be tried again
                tally.failure = result.failure
                continue
            self._forget(answer.origin)
            if result.duplicate:
                continue
            if answer.tx_input is TxInput.COMMIT:
                tally.committed += 1
            else:
                tally.rolled_back += 1
            if result.stored is not None:
                stored = result.stored
                tally.durable_end = max(tally.durable_end, stored.physical_offset + stored.size)
        return tally.failure is None


def _chunks(pending: Pending) -> Iterator[list[tuple[int, str]]]:
    items = sorted(pending.items())  # origin order: the order the halves were stored
    for start in range(0, len(items), FINISH_CHUNK_MAX):
        yield items[start : start + FINISH_CHUNK_MAX]
