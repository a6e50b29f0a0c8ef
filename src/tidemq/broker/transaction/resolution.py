"""The exactly-once ledger of transactions, and the resolver that writes outcomes to the store.

TransactionLedger (memory only) knows, per origin (states.py), either the live half message —
`PendingHalf`, the newest copy's offsets and what `tidemq tx list` shows — or the outcome of a
resolved transaction. TransactionResolver does the writes: prepare (half message), commit (real
message, then op message), rollback and discard (op message), check copies. The broker runs it on
its one event loop and each operation is synchronous from the ledger lookup to the ledger update,
so two answers for one transaction (a client's END_TRANSACTION racing a check-back answer, or a
retried COMMIT) are serialised: the first resolves, the second finds the outcome and either
agrees (success, nothing stored) or contradicts it (IllegalStateTransition, refused).

Rebuilt at start from the store alone (`rebuild`):

    1. op queue from (CID_RMQ_SYS_TRANS op offset - OUTCOMES_REPLAY_EXTRA) to its end
       → outcome per origin (the __TXOUTCOME# property; upstream ops read as ROLLBACK);
    2. half queue from the CID_RMQ_SYS_TRANS half offset to its end → the newest record of each
       origin without an outcome is pending (every live transaction has a record there: the
       check service advances that offset only past records resolved, stale or copied forward);
    3. repair: a pending transaction whose committed real message is already in the store (the
       broker died between storing it and its op message) is marked COMMITTED and its op written,
       so a check-back cannot commit it twice. Found through the key index (UNIQ_KEY of the
       real topic) and preparedTransactionOffset → a record of the same origin.

Memory is bounded twice. Pending transactions: at most `in_flight_max`; a prepare beyond it is
refused (SYSTEM_BUSY), and every pending one is resolved or discarded within transactionTimeOut +
transactionCheckInterval * (transactionCheckMax + 1). Outcomes: the newest `outcomes_max` are
kept (FIFO). An answer for a transaction whose outcome was forgotten is refused with a clear
remark rather than guessed; the check service never needs a forgotten outcome, because pending
is authoritative in memory and rebuild replays every op that a record still in the walk can
refer to (check_back.py keeps the op offset behind the half offset's record).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import DelayRefused
from tidemq.broker.timer import TIMER_TOPIC_PREFIX
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput, TxState, apply
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import (
    KEYS,
    PGROUP,
    SCHEDULE_TOPIC_XXXX,
    TRANS_CHECK_GROUP,
    UNIQ_KEY,
    SysFlag,
)
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import GetStatus, MessageToStore, PutResult

log = logging.getLogger(__name__)

# Live half messages kept in memory (~300 B each: 60 MB). Beyond it prepares are refused.
TRANSACTIONS_IN_FLIGHT_MAX: Final = 200_000
# Outcomes remembered for late or repeated answers (~100 B each: 20 MB).
TRANSACTION_OUTCOMES_MAX: Final = 200_000
# At start, op messages replayed before the persisted op offset, so recent outcomes survive.
OUTCOMES_REPLAY_EXTRA: Final = TRANSACTION_OUTCOMES_MAX
# Records read per store call while scanning a system queue.
SCAN_BATCH_MAX: Final = 64
# Index candidates read when looking for a committed real message at start.
REPAIR_CANDIDATES_MAX: Final = 8

_FOREVER_MS: Final = 2**62


@dataclass(slots=True)
class PendingHalf:
    """A live transaction: its newest half record and what operators see of it."""

    origin: int
    queue_offset: int
    physical_offset: int
    state: TxState
    real_topic: str
    producer_group: str
    first_store_ms: int
    check_times: int
    key: str


class TransactionForgotten(Exception):
    """The transaction was resolved longer ago than the ledger remembers outcomes."""


class TransactionBusy(Exception):
    """`in_flight_max` half messages are live; a new prepare must wait."""


def pending_of(half: rec.StoredMessage, state: TxState) -> PendingHalf:
    props = half.property_map()
    topic, _qid = hm.real_destination(half)
    return PendingHalf(
        origin=hm.origin_of(half),
        queue_offset=half.queue_offset,
        physical_offset=half.physical_offset,
        state=state,
        real_topic=topic,
        producer_group=props.get(PGROUP, ""),
        first_store_ms=half.store_timestamp,
        check_times=hm.check_times_of(half),
        key=props.get(KEYS) or props.get(UNIQ_KEY, ""),
    )


class TransactionLedger:
    def __init__(
        self,
        *,
        in_flight_max: int = TRANSACTIONS_IN_FLIGHT_MAX,
        outcomes_max: int = TRANSACTION_OUTCOMES_MAX,
    ) -> None:
        assert in_flight_max > 0
        assert outcomes_max > 0
        self.in_flight_max = in_flight_max
        self.outcomes_max = outcomes_max
        self._pending: dict[int, PendingHalf] = {}
        self._outcomes: collections.OrderedDict[int, TxState] = collections.OrderedDict()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.in_flight_max

    def state(self, origin: int) -> TxState | None:
        """The transaction's state; None when never seen or its outcome was forgotten."""
        entry = self._pending.get(origin)
        if entry is not None:
            return entry.state
        return self._outcomes.get(origin)

    def pending(self, origin: int) -> PendingHalf | None:
        return self._pending.get(origin)

    def pending_list(self) -> list[PendingHalf]:
        return sorted(self._pending.values(), key=lambda p: p.origin)

    def track(self, entry: PendingHalf) -> None:
        """A new half record (prepare, check copy or rewrite) is now the transaction's newest."""
        assert entry.origin not in self._outcomes, entry
        current = self._pending.get(entry.origin)
        if current is None or entry.queue_offset >= current.queue_offset:
            self._pending[entry.origin] = entry

    def apply(self, origin: int, tx_input: TxInput) -> TxState:
        """Apply `tx_input`; a resolving one moves the row from pending to outcomes.

        Raises IllegalStateTransition, or TransactionForgotten for an unknown origin.
        """
        state = self.state(origin)
        if state is None:
            raise TransactionForgotten(origin)
        new = apply(state, tx_input)
        entry = self._pending.get(origin)
        if entry is not None:
            if new.resolved:
                del self._pending[origin]
                self._remember(origin, new)
            else:
                entry.state = new
        return new

    def _remember(self, origin: int, state: TxState) -> None:
        self._outcomes[origin] = state
        while len(self._outcomes) > self.outcomes_max:
            self._outcomes.popitem(last=False)

    def remember(self, origin: int, state: TxState) -> None:
        """Record an outcome read from the op queue (rebuild)."""
        assert state.resolved
        self._pending.pop(origin, None)
        self._remember(origin, state)

    def drop_below(self, queue_offset_min: int) -> list[PendingHalf]:
        """Forget pending transactions whose newest record fell off the half queue (retention)."""
        lost = [p for p in self._pending.values() if p.queue_offset < queue_offset_min]
        for entry in lost:
            del self._pending[entry.origin]
            self._remember(entry.origin, TxState.DISCARDED)
        return lost


_OUTCOME_STATES: Final = {
    hm.Outcome.COMMIT: TxState.COMMITTED,
    hm.Outcome.ROLLBACK: TxState.ROLLED_BACK,
    hm.Outcome.DISCARD: TxState.DISCARDED,
}
_OUTCOME_INPUTS: Final = {
    hm.Outcome.COMMIT: TxInput.COMMIT,
    hm.Outcome.ROLLBACK: TxInput.ROLLBACK,
    hm.Outcome.DISCARD: TxInput.DISCARD,
}


def start_offset(store: FileMessageStore, offsets: ConsumerOffsetTable, topic: str) -> int:
    """The CID_RMQ_SYS_TRANS offset of `topic` queue 0, clamped into the queue's range."""
    committed = offsets.query(TRANS_CHECK_GROUP, topic, hm.HALF_QUEUE_ID)
    low = store.min_offset(topic, hm.HALF_QUEUE_ID)
    high = store.max_offset(topic, hm.HALF_QUEUE_ID)
    return min(max(committed if committed is not None else low, low), high)


def scan_queue(
    store: FileMessageStore, topic: str, start: int, end: int
) -> Iterator[rec.StoredMessage]:
    """Records of `topic` queue 0 with start <= queue offset < end, in order. Records that fail
    their checks are skipped by the store (and logged there)."""
    offset = start
    while offset < end:
        result = store.get_messages(topic, hm.HALF_QUEUE_ID, offset, SCAN_BATCH_MAX)
        if result.status is GetStatus.OFFSET_TOO_SMALL or (
            not result.records and result.next_begin_offset > offset
        ):
            offset = result.next_begin_offset
            continue
        if not result.records:
            return
        for data in result.records:
            message = rec.decode_record(data)
            if message.queue_offset >= end:
                return
            yield message
        offset = result.next_begin_offset


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
        # Called with each new half record (the Spark sink's batch index, batch.py).
        self.prepare_listeners: list[Callable[[rec.StoredMessage], None]] = []
        # The send path's DelayRouter.route: a committed message with DELAY or TIMER_* is
        # parked like any other send, not delivered at once.
        self._route = route

    def set_store_host(self, store_host: tuple[str, int]) -> None:
        """The advertised address is known only once the server is bound (port 0)."""
        self._store_host = store_host

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self, msg: MessageToStore, producer_group: str) -> PutResult:
        """Store `msg` (a validated send to its real topic and queue) as a half message.

        Raises TransactionBusy when `in_flight_max` transactions are live.
        """
        if self.ledger.full:
            raise TransactionBusy(f"{self.ledger.in_flight} transactions in flight")
        result = self.store.put_message(hm.to_half_message(msg, producer_group))
        if result.ok:
            data = self.store.read_record(result.physical_offset)
            assert data is not None
            half = rec.decode_record(data)
            self.ledger.track(pending_of(half, TxState.PREPARED))
            self.stats.prepared += 1
            for listener in self.prepare_listeners:
                listener(half)
        return result

    def load_half(self, commit_log_offset: int) -> rec.StoredMessage | None:
        """The half record at `commit_log_offset`, or None when there is none (or another)."""
        if commit_log_offset < 0:
            return None
        try:
            data = self.store.read_record(commit_log_offset)
            if data is None:
                return None
            message = rec.decode_record(data)
        except (CorruptRecordError, ProtocolError) as exc:
            log.warning("no readable half message at %d: %s", commit_log_offset, exc)
            return None
        if message.topic != hm.HALF_TOPIC or message.physical_offset != commit_log_offset:
            return None
        return message

    # -- answers -------------------------------------------------------------------------------

    def end(self, half: rec.StoredMessage, tx_input: TxInput) -> EndResult:
        """Apply a producer's answer about `half` (any copy of the transaction).

        Raises IllegalStateTransition (contradicts the outcome) or TransactionForgotten.
        """
        origin = hm.origin_of(half)
        state = self.ledger.state(origin)
        if state is None:
            raise TransactionForgotten(origin)
        if state.resolved:
            try:
                new = apply(state, tx_input)
            except IllegalStateTransition:
                self.stats.refused_answers += 1
                raise
            if tx_input is not TxInput.UNKNOWN:
                self.stats.duplicate_answers += 1
            return EndResult(new, duplicate=True)
        if tx_input is TxInput.UNKNOWN:
            return EndResult(self.ledger.apply(origin, tx_input))
        stored = None
        if tx_input is TxInput.COMMIT:
            stored = self.store.put_message(self._routed(hm.to_real_message(half)))
            if not stored.ok:
                return EndResult(state, failure=stored)
            outcome = hm.Outcome.COMMIT
        else:
            assert tx_input is TxInput.ROLLBACK, tx_input
            outcome = hm.Outcome.ROLLBACK
        op = self._put_op(origin, outcome)
        if not op.ok and stored is None:
            return EndResult(state, failure=op)
        new = self.ledger.apply(origin, tx_input)
        if stored is not None:
            self.stats.committed += 1
        else:
            self.stats.rolled_back += 1
        return EndResult(new, stored=stored)

    def _routed(self, real: MessageToStore) -> MessageToStore:
        if self._route is None:
            return real
        try:
            return self._route(real)
        except DelayRefused as exc:
            # The half was accepted; losing the commit would be worse than delivering early.
            log.warning("committed message to %s delivered at once: %s", real.topic, exc)
            return real

    def _put_op(self, origin: int, outcome: hm.Outcome) -> PutResult:
        op = hm.op_message(
            [origin], outcome, store_host=self._store_host, now_ms=self._clock.now_ms()
        )
        result = self.store.put_message(op)
        if not result.ok:
            # After a COMMIT the real message is stored: the ledger says COMMITTED now and the
            # start-up repair finds the real message, so the outcome survives a restart anyway.
            log.error(
                "op message for transaction %d (%s) not stored: %s %s",
                origin,
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
        self._put_op(origin, hm.Outcome.DISCARD)
        self.ledger.apply(origin, TxInput.DISCARD)
        self.stats.discarded += 1
        return True

    def put_back(self, half: rec.StoredMessage, check_times: int) -> rec.StoredMessage | None:
        """Append a copy of `half` with TRANSACTION_CHECK_TIMES = `check_times`; it becomes the
        transaction's newest record. Returns the copy as stored (None if the store refused)."""
        result = self.store.put_message(hm.check_copy(half, check_times))
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
        """Rebuild the ledger from the op and half queues (see the module docstring)."""
        op_start = start_offset(self.store, offsets, hm.OP_TOPIC)
        op_start = max(op_start - OUTCOMES_REPLAY_EXTRA, self.store.min_offset(hm.OP_TOPIC, 0))
        op_end = self.store.max_offset(hm.OP_TOPIC, hm.HALF_QUEUE_ID)
        outcomes = 0
        for op in scan_queue(self.store, hm.OP_TOPIC, op_start, op_end):
            try:
                origins = hm.parse_op_body(op.body)
                state = _OUTCOME_STATES[hm.outcome_of_op(op)]
            except ProtocolError as exc:
                log.warning("skipping op message at %d: %s", op.queue_offset, exc)
                continue
            for origin in origins:
                self.ledger.remember(origin, state)
                outcomes += 1
        half_start = start_offset(self.store, offsets, hm.HALF_TOPIC)
        half_end = self.store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        for half in scan_queue(self.store, hm.HALF_TOPIC, half_start, half_end):
            origin = hm.origin_of(half)
            if self.ledger.state(origin) is not None and self.ledger.pending(origin) is None:
                continue
            try:
                state = TxState.CHECKING if hm.check_times_of(half) else TxState.PREPARED
                self.ledger.track(pending_of(half, state))
            except ProtocolError as exc:
                log.warning("skipping malformed half message %d: %s", half.queue_offset, exc)
        repaired = sum(self._repair(p) for p in self.ledger.pending_list())
        log.info(
            "transaction ledger rebuilt: %d outcomes from op offset %d, %d in flight from half "
            "offset %d, %d commits repaired",
            outcomes,
            op_start,
            self.ledger.in_flight,
            half_start,
            repaired,
        )

    def _repair(self, entry: PendingHalf) -> bool:
        data = self.store.read_record(entry.physical_offset)
        if data is None:
            return False
        half = rec.decode_record(data)
        uniq = half.property_map().get(UNIQ_KEY)
        if not uniq:
            return False
        # A committed message with a delay sits in a parking topic until due (then in the
        # real topic): the index is per topic, so look in each place it can be.
        parking = [t for t in self.store.topics_and_queues() if t.startswith(TIMER_TOPIC_PREFIX)]
        for topic in (entry.real_topic, SCHEDULE_TOPIC_XXXX, *parking):
            if self._repair_from(entry, topic, uniq):
                return True
        return False

    def _repair_from(self, entry: PendingHalf, topic: str, uniq: str) -> bool:
        for found in self.store.query_by_key(
            topic, uniq, REPAIR_CANDIDATES_MAX, entry.first_store_ms, _FOREVER_MS
        ):
            real = rec.decode_record(found)
            if SysFlag.transaction_type(real.sys_flag) != SysFlag.COMMIT:
                continue
            source = self.load_half(real.prepared_transaction_offset)
            if source is not None and hm.origin_of(source) == entry.origin:
                log.warning(
                    "transaction %d was committed before a crash: op repaired", entry.origin
                )
                self._put_op(entry.origin, hm.Outcome.COMMIT)
                self.ledger.apply(entry.origin, _OUTCOME_INPUTS[hm.Outcome.COMMIT])
                return True
        return False
