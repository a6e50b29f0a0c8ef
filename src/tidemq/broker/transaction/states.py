"""The states of one transaction (one half message and its check copies) as a table.

A transaction is named by its *origin*: the half-queue offset its first half message got. Check
copies and immunity rewrites carry the origin in TRAN_PREPARED_QUEUE_OFFSET, so every answer
about any copy lands on the same row of the ledger (resolution.py).

    PREPARED ──CHECK──▶ CHECKING ──CHECK/UNKNOWN──▶ CHECKING
       │  ╲                │
       │   ╲ COMMIT        ├──COMMIT──▶ COMMITTED ──COMMIT/UNKNOWN──▶ COMMITTED (idempotent)
       │    ╲ ROLLBACK     ├──ROLLBACK─▶ ROLLED_BACK ──ROLLBACK/UNKNOWN──▶ ROLLED_BACK
       │     ▼             └──DISCARD──▶ DISCARDED ──ROLLBACK/UNKNOWN──▶ DISCARDED
       └──DISCARD / UNKNOWN (stays PREPARED)

Every pair missing from `TRANSITIONS` is illegal: ROLLBACK after COMMIT, COMMIT after ROLLBACK
or DISCARD, a CHECK or DISCARD of a resolved transaction. `apply` raises IllegalStateTransition
naming both, and the END_TRANSACTION handler turns that into a clear refusal.
"""

from __future__ import annotations

import enum
from typing import Final

from tidemq.errors import QueueError


class TxState(enum.Enum):
    PREPARED = "PREPARED"
    CHECKING = "CHECKING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"

    @property
    def resolved(self) -> bool:
        return self in _RESOLVED


_RESOLVED: Final = frozenset({TxState.COMMITTED, TxState.ROLLED_BACK, TxState.DISCARDED})


class TxInput(enum.Enum):
    COMMIT = "COMMIT"  # END_TRANSACTION commitOrRollback=8
    ROLLBACK = "ROLLBACK"  # END_TRANSACTION commitOrRollback=12
    UNKNOWN = "UNKNOWN"  # END_TRANSACTION commitOrRollback=0 (NOT / UNKNOW)
    CHECK = "CHECK"  # the check-back service asked a producer
    # Checked transactionCheckMax times, no producer reachable in transactionUnreachedCheckMax
    # passes (such passes are no CHECK: the state stays), or older than fileReservedTime.
    DISCARD = "DISCARD"


class IllegalStateTransition(QueueError):
    """`input` is not allowed in `state` (a programmer or protocol error, never retried)."""

    def __init__(self, state: TxState, tx_input: TxInput) -> None:
        super().__init__(f"transaction is {state.value}: {tx_input.value} is not allowed")
        self.state = state
        self.input = tx_input


_S, _I = TxState, TxInput
TRANSITIONS: Final[dict[tuple[TxState, TxInput], TxState]] = {
    (_S.PREPARED, _I.COMMIT): _S.COMMITTED,
    (_S.PREPARED, _I.ROLLBACK): _S.ROLLED_BACK,
    (_S.PREPARED, _I.UNKNOWN): _S.PREPARED,
    (_S.PREPARED, _I.CHECK): _S.CHECKING,
    (_S.PREPARED, _I.DISCARD): _S.DISCARDED,
    (_S.CHECKING, _I.COMMIT): _S.COMMITTED,
    (_S.CHECKING, _I.ROLLBACK): _S.ROLLED_BACK,
    (_S.CHECKING, _I.UNKNOWN): _S.CHECKING,
    (_S.CHECKING, _I.CHECK): _S.CHECKING,
    (_S.CHECKING, _I.DISCARD): _S.DISCARDED,
    # Repeats of the same answer are idempotent: the second COMMIT stores nothing.
    (_S.COMMITTED, _I.COMMIT): _S.COMMITTED,
    (_S.COMMITTED, _I.UNKNOWN): _S.COMMITTED,
    (_S.ROLLED_BACK, _I.ROLLBACK): _S.ROLLED_BACK,
    (_S.ROLLED_BACK, _I.UNKNOWN): _S.ROLLED_BACK,
    # A discarded half message is never delivered: a late ROLLBACK agrees, a COMMIT cannot.
    (_S.DISCARDED, _I.ROLLBACK): _S.DISCARDED,
    (_S.DISCARDED, _I.UNKNOWN): _S.DISCARDED,
}
del _S, _I


def apply(state: TxState, tx_input: TxInput) -> TxState:
    """The state after `tx_input`. Raises IllegalStateTransition for a pair not in the table."""
    try:
        return TRANSITIONS[(state, tx_input)]
    except KeyError:
        raise IllegalStateTransition(state, tx_input) from None


def is_change(state: TxState, tx_input: TxInput) -> bool:
    """Whether applying `tx_input` moves to another state (False for idempotent repeats)."""
    return apply(state, tx_input) is not state
