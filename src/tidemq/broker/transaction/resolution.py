"""The exactly-once ledger of transactions, and the resolver that writes outcomes to the store.

TransactionLedger (ledger.py, memory only) knows, per origin (states.py), either the live half
message or the outcome of a resolved transaction. TransactionResolver does the writes: prepare
(half message), commit (real message, then op message), rollback and discard (op message), check
copies. The broker runs it on its one event loop and each operation is synchronous from the
ledger lookup to the ledger update, so two answers for one transaction (a client's
END_TRANSACTION racing a check-back answer, or a retried COMMIT) are serialised: the first
resolves, the second finds the outcome and either agrees (success, nothing stored) or contradicts
it (IllegalStateTransition, refused).

Answers come one by one (`end`) or as the batch of one loop turn (`end_many`, what the
END_TRANSACTION handler collects from oneway requests). A batch is applied as the same answers
one by one would be, but stores less: the real messages of its commits with one store call
(`put_each`, any queues), then one op message per outcome whose body lists every origin
("17,18,19,", the 5.x batch form). The order is what makes it safe: the commit log keeps a prefix
after a crash, so an op on disk means its real messages are too, and a real message whose op was
lost is found by the repair at start (rebuild.py).

Rebuilt at start from the store alone, and repaired where a crash cut a resolution short:
`rebuild` (rebuild.py).

The ledger itself, and how its memory is bounded, is ledger.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import DelayRefused
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.ledger import (
    TransactionBusy,
    TransactionForgotten,
    TransactionLedger,
    pending_from,
    pending_of,
)
from tidemq.broker.transaction.rebuild import rebuild_ledger
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput, TxState, apply
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore, PutResult

log = logging.getLogger(__name__)

__all__ = [
    "END_RUN_MAX",
    "RECENT_HALF_AGE_MAX_MS",
    "RECENT_HALVES_MAX",
    "Answer",
    "EndResult",
    "TransactionResolver",
]

# Half messages remembered from their prepare until their END (~1.5 KB each with a 1 KiB body:
# 6 MB), so an END that follows within a round trip, as almost all do, needs no record read and
# decode; FIFO beyond it. Only this young, so retention cannot have removed the record.
RECENT_HALVES_MAX: Final = 4_096
RECENT_HALF_AGE_MAX_MS: Final = 10_000

# Answers stored by one end_many run: each run writes one op message per outcome, whose body
# lists the run's origins (far below OP_BODY_OFFSETS_MAX), and bounds one loop turn's work.
END_RUN_MAX: Final = 1_024
assert END_RUN_MAX <= hm.OP_BODY_OFFSETS_MAX


@dataclass(slots=True)
class Answer:
    """A producer's COMMIT, ROLLBACK or UNKNOWN about a half record (any copy): the record's
    offsets and properties, decoded once, and the transaction's origin. The record is either
    read back (`half`) or, for a half message prepared moments ago, the message as it was put
    (`put`, with its PutResult)."""

    tx_input: TxInput
    props: dict[str, str]
    origin: int
    queue_offset: int
    physical_offset: int
    half: rec.StoredMessage | None = None
    put: tuple[MessageToStore, PutResult] | None = None

    @classmethod
    def of(cls, half: rec.StoredMessage, tx_input: TxInput) -> Answer:
        props = half.property_map()
        origin = hm.origin_from(props, half.queue_offset)
        return cls(tx_input, props, origin, half.queue_offset, half.physical_offset, half=half)

    def real_message(self) -> MessageToStore:
        """The committed message. Raises ProtocolError (no real destination)."""
        if self.half is not None:
            return hm.to_real_message(self.half, self.props)
        assert self.put is not None
        return hm.to_real_message_of_put(self.put[0], self.put[1])


@dataclass(frozen=True, slots=True)
class EndResult:
    """What an END_TRANSACTION did: `stored` is the real message's put (COMMIT that resolved),
    `duplicate` says the answer repeated a known outcome and stored nothing."""

    state: TxState
    stored: PutResult | None = None
    duplicate: bool = False
    failure: PutResult | None = None


class TransactionResolver:
    def __init__(
        self,
        store: FileMessageStore,
        ledger: TransactionLedger,
        stats: TransactionStats,
        clock: Clock,
        store_host: tuple[str, int],
        *,
        route: Callable[[MessageToStore], MessageToStore] | None = None,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.stats = stats
        self._clock = clock
        self._store_host = store_host
        # Called with each new half record's origin and properties (the Spark sink's batch
        # index, batch.py).
        self.prepare_listeners: list[Callable[[int, dict[str, str]], None]] = []
        # The send path's DelayRouter.route: a committed message with DELAY or TIMER_* is
        # parked like any other send, not delivered at once.
        self._route = route
        # Physical offset -> the half message as put and its result (RECENT_HALVES_MAX).
        self._recent: dict[int, tuple[MessageToStore, PutResult]] = {}

    def set_store_host(self, store_host: tuple[str, int]) -> None:
        """The advertised address is known only once the server is bound (port 0)."""
        self._store_host = store_host

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self, msg: MessageToStore, producer_group: str) -> PutResult:
        """Store `msg` (a validated send to its real topic and queue) as a half message.

        Raises TransactionBusy when `in_flight_max` transactions are live.
        """
        half = self.half_message(msg, producer_group)
        result = self.store.put_message(half)
        if result.ok:
            self.half_stored(half, result)
        return result

    def half_message(self, msg: MessageToStore, producer_group: str) -> MessageToStore:
        """The first half of `prepare`, for a caller that stores the half message together with
        other messages (one store call for a loop turn's sends): what to store.

        Raises TransactionBusy when `in_flight_max` transactions are live (halves stored
        together pass this check together, so the ledger may exceed it by one such batch).
        """
        if self.ledger.full:
            raise TransactionBusy(f"{self.ledger.in_flight} transactions in flight")
        return hm.to_half_message(msg, producer_group)

    def half_stored(self, half: MessageToStore, result: PutResult) -> None:
        """The second half of `prepare`: `half` (from `half_message`) was stored as `result`.

        The pending entry comes from what was put, not from reading the record back: the store
        keeps every property it reads (tests/broker/transaction compare the two).
        """
        assert result.ok, result
        assert half.parsed is not None
        props = half.parsed[1]
        entry = pending_from(
            props,
            result.queue_offset,
            result.physical_offset,
            result.store_timestamp,
            TxState.PREPARED,
        )
        self.ledger.track(entry)
        self.stats.prepared += 1
        recent = self._recent
        recent[result.physical_offset] = (half, result)
        if len(recent) > RECENT_HALVES_MAX:
            del recent[next(iter(recent))]
        for listener in self.prepare_listeners:
            listener(entry.origin, props)

    def answer_at(self, commit_log_offset: int, tx_input: TxInput) -> Answer | None:
        """The answer about the half record at `commit_log_offset`; None when there is none.

        A half message prepared moments ago comes from memory (as put), any other is read back.
        """
        recent = self._recent.pop(commit_log_offset, None)
        if recent is not None:
            half, put = recent
            if self._clock.now_ms() - put.store_timestamp <= RECENT_HALF_AGE_MAX_MS:
                assert half.parsed is not None
                props = half.parsed[1]
                origin = hm.origin_from(props, put.queue_offset)
                return Answer(
                    tx_input, props, origin, put.queue_offset, commit_log_offset, put=recent
                )
        loaded = self.load_half(commit_log_offset, from_peer=True)
        return None if loaded is None else Answer.of(loaded, tx_input)

    def load_half(
        self, commit_log_offset: int, *, from_peer: bool = False
    ) -> rec.StoredMessage | None:
        """The half record at `commit_log_offset`, or None when there is none (or another);
        `from_peer` when a request named the offset (store.read_record)."""
        if commit_log_offset < 0:
            return None
        try:
            data = self.store.read_record(commit_log_offset, from_peer=from_peer)
            if data is None:
                return None
            # read_record returns only a record whose whole-record CRC it checked.
            message = rec.decode_record(data, verify_crc=False)
        except (CorruptRecordError, ProtocolError) as exc:
            log.warning("no readable half message at %d: %s", commit_log_offset, exc)
            return None
        if message.topic != hm.HALF_TOPIC or message.physical_offset != commit_log_offset:
            return None
        return message

    # -- answers -------------------------------------------------------------------------------

    def end(self, half: rec.StoredMessage, tx_input: TxInput) -> EndResult:
        """Apply a producer's answer about `half` (any copy of the transaction).

        Raises IllegalStateTransition (contradicts the outcome), TransactionForgotten, or
        ProtocolError (the half record lacks its real destination).
        """
        (result,) = self.end_many([Answer.of(half, tx_input)])
        if isinstance(result, Exception):
            raise result
        return result

    def end_many(self, answers: Sequence[Answer]) -> list[EndResult | Exception]:
        """Apply `answers` in order, each as `end` would; an answer's exception is its result.

        Answers about distinct transactions are stored together: the real messages of a run of
        commits with one store call (`put_each`: any queues, each message checked and refused on
        its own), then one op message per outcome listing those stored (rebuild reads that batch
        op form). A second answer about a transaction of the run ends
        the run first, so it finds the first one's outcome, as it would one by one.
        """
        results: list[EndResult | Exception | None] = []  # None: in the run, stored below
        run: list[int] = []
        origins: set[int] = set()
        ledger = self.ledger
        for index, answer in enumerate(answers):
            origin = answer.origin
            if origin in origins or len(run) >= END_RUN_MAX:
                self._store_run(answers, run, results)
                run, origins = [], set()
            state = ledger.state(origin)
            result: EndResult | Exception | None = None
            if state is None:
                result = TransactionForgotten(origin)
            elif state.resolved:
                result = self._repeat(state, answer.tx_input)
            elif answer.tx_input is TxInput.UNKNOWN:
                result = EndResult(ledger.apply(origin, TxInput.UNKNOWN))
            else:
                run.append(index)
                origins.add(origin)
            results.append(result)
        self._store_run(answers, run, results)
        done = [result for result in results if result is not None]
        assert len(done) == len(results)
        return done

    def _repeat(self, state: TxState, tx_input: TxInput) -> EndResult | Exception:
        """An answer about a resolved transaction: agrees (nothing stored) or is refused."""
        try:
            new = apply(state, tx_input)
        except IllegalStateTransition as exc:
            self.stats.refused_answers += 1
            return exc
        if tx_input is not TxInput.UNKNOWN:
            self.stats.duplicate_answers += 1
        return EndResult(new, duplicate=True)

    def _store_run(
        self,
        answers: Sequence[Answer],
        run: list[int],
        results: list[EndResult | Exception | None],
    ) -> None:
        """Store the COMMITs and ROLLBACKs at `run` (distinct pending transactions) and fill in
        their results. Real messages first, then the op messages: the commit log keeps a prefix
        after a crash, so an op on disk means its real messages are too; a real message whose op
        was lost is found by rebuild's repair."""
        if not run:
            return
        reals: list[tuple[int, MessageToStore]] = []
        rollbacks: list[int] = []
        for index in run:
            answer = answers[index]
            if answer.tx_input is TxInput.ROLLBACK:
                rollbacks.append(index)
                continue
            assert answer.tx_input is TxInput.COMMIT, answer.tx_input
            try:
                real = self._routed(answer.real_message())
            except ProtocolError as exc:
                results[index] = exc
                continue
            reals.append((index, real))
        stored: list[tuple[int, PutResult]] = []
        if reals:
            puts = self.store.put_each([real for _, real in reals])
            for (index, _), put in zip(reals, puts, strict=True):
                if put.ok:
                    stored.append((index, put))
                else:
                    results[index] = self._unchanged(answers[index], put)
        ledger = self.ledger
        if stored:
            # A lost op message is logged; the ledger says COMMITTED now and the start-up repair
            # finds the real message, so the outcome survives a restart anyway.
            self.put_op([answers[index].origin for index, _ in stored], hm.Outcome.COMMIT)
            for index, put in stored:
                state = ledger.apply(answers[index].origin, TxInput.COMMIT)
                results[index] = EndResult(state, stored=put)
            self.stats.committed += len(stored)
        if rollbacks:
            op = self.put_op([answers[index].origin for index in rollbacks], hm.Outcome.ROLLBACK)
            for index in rollbacks:
                if op.ok:
                    state = ledger.apply(answers[index].origin, TxInput.ROLLBACK)
                    results[index] = EndResult(state)
                else:
                    results[index] = self._unchanged(answers[index], op)
            if op.ok:
                self.stats.rolled_back += len(rollbacks)

    def _unchanged(self, answer: Answer, failure: PutResult) -> EndResult:
        state = self.ledger.state(answer.origin)
        assert state is not None
        return EndResult(state, failure=failure)

    def _routed(self, real: MessageToStore) -> MessageToStore:
        if self._route is None:
            return real
        try:
            return self._route(real)
        except DelayRefused as exc:
            # The half was accepted; losing the commit would be worse than delivering early.
            log.warning("committed message to %s delivered at once: %s", real.topic, exc)
            return real

    def put_op(self, origins: list[int], outcome: hm.Outcome) -> PutResult:
        """Store the op message saying `outcome` for `origins`; a refusal is logged here."""
        op = hm.op_message(
            origins, outcome, store_host=self._store_host, now_ms=self._clock.now_ms()
        )
        result = self.store.put_message(op)
        if not result.ok:
            log.error(
                "op message for transactions %s (%s) not stored: %s %s",
                origins,
                outcome.value,
                result.status.value,
                result.error,
            )
        return result

    # -- check service operations --------------------------------------------------------------

    def discard(self, half: rec.StoredMessage) -> bool:
        """Park the half message in TRANS_CHECK_MAX_TIME_TOPIC and mark it DISCARDED."""
        origin = hm.origin_of(half)
        parked = self.store.put_message(hm.discard_message(half))
        if not parked.ok:
            log.error("could not discard transaction %d: %s", origin, parked.error)
            return False
        self.put_op([origin], hm.Outcome.DISCARD)
        self.ledger.apply(origin, TxInput.DISCARD)
        self.stats.discarded += 1
        return True

    def put_back(
        self, half: rec.StoredMessage, check_times: int, unreached_checks: int | None = None
    ) -> rec.StoredMessage | None:
        """Append a copy of `half` with TRANSACTION_CHECK_TIMES = `check_times` (and, given,
        `unreached_checks`: hm.check_copy); it becomes the transaction's newest record. Returns
        the copy as stored (None if the store refused)."""
        result = self.store.put_message(hm.check_copy(half, check_times, unreached_checks))
        if not result.ok:
            log.error("could not put back half message %d: %s", half.queue_offset, result.error)
            return None
        data = self.store.read_record(result.physical_offset)
        assert data is not None
        copy = rec.decode_record(data)
        current = self.ledger.pending(hm.origin_of(half))
        state = current.state if current is not None else TxState.PREPARED
        self.ledger.track(pending_of(copy, state))
        return copy

    # -- start ---------------------------------------------------------------------------------

    def rebuild(self, offsets: ConsumerOffsetTable) -> None:
        """Rebuild the ledger from the op and half queues, and repair (rebuild.py)."""
        rebuild_ledger(self, offsets)
