"""TransactionLedger: the in-memory form of the op queue, one row per transaction.

Per origin (states.py) the ledger knows either the live half message — `PendingHalf`, the newest
copy's offsets and what `tidemq tx list` shows — or the outcome of a resolved transaction. Only
the resolver (resolution.py) and the check-back service change it, on the broker's one event
loop; rebuild fills it from the store at start.

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
from dataclasses import dataclass
from typing import Final

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.states import TxInput, TxState, apply
from tidemq.protocol import record as rec
from tidemq.protocol.message import KEYS, PGROUP, UNIQ_KEY

# Live half messages kept in memory (~300 B each: 60 MB). Beyond it prepares are refused.
TRANSACTIONS_IN_FLIGHT_MAX: Final = 200_000
# Outcomes remembered for late or repeated answers (~100 B each: 20 MB).
TRANSACTION_OUTCOMES_MAX: Final = 200_000


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


def pending_from(
    props: dict[str, str],
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    state: TxState,
) -> PendingHalf:
    """The pending entry of a half record given as its decoded properties and offsets."""
    topic, _qid = hm.real_destination_from(props, queue_offset)
    return PendingHalf(
        origin=hm.origin_from(props, queue_offset),
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        state=state,
        real_topic=topic,
        producer_group=props.get(PGROUP, ""),
        first_store_ms=store_timestamp,
        check_times=hm.check_times_from(props),
        key=props.get(KEYS) or props.get(UNIQ_KEY, ""),
    )


def pending_of(half: rec.StoredMessage, state: TxState) -> PendingHalf:
    return pending_from(
        half.property_map(), half.queue_offset, half.physical_offset, half.store_timestamp, state
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

    def pending_queue_offsets(self) -> set[int]:
        """Where the newest record of each pending transaction is (its half-queue offset)."""
        return {entry.queue_offset for entry in self._pending.values()}

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
