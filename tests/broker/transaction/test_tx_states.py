"""The transaction state table, exhaustively: every (state, input) pair."""

from __future__ import annotations

import itertools

import pytest

from tidemq.broker.transaction.states import (
    TRANSITIONS,
    IllegalStateTransition,
    TxInput,
    TxState,
    apply,
    is_change,
)

ALL_PAIRS = list(itertools.product(TxState, TxInput))


@pytest.mark.parametrize(("state", "tx_input"), ALL_PAIRS)
def test_every_pair_is_a_state_or_illegal(state: TxState, tx_input: TxInput) -> None:
    if (state, tx_input) in TRANSITIONS:
        assert isinstance(apply(state, tx_input), TxState)
    else:
        with pytest.raises(IllegalStateTransition) as info:
            apply(state, tx_input)
        assert info.value.state is state
        assert info.value.input is tx_input
        assert state.value in str(info.value)
        assert tx_input.value in str(info.value)


def test_contradictions_are_illegal() -> None:
    for state, tx_input in [
        (TxState.COMMITTED, TxInput.ROLLBACK),
        (TxState.ROLLED_BACK, TxInput.COMMIT),
        (TxState.DISCARDED, TxInput.COMMIT),
        (TxState.COMMITTED, TxInput.CHECK),
        (TxState.COMMITTED, TxInput.DISCARD),
    ]:
        with pytest.raises(IllegalStateTransition):
            apply(state, tx_input)


def test_repeats_are_idempotent_and_resolved_states_are_sinks() -> None:
    assert not is_change(TxState.COMMITTED, TxInput.COMMIT)
    assert not is_change(TxState.ROLLED_BACK, TxInput.ROLLBACK)
    assert is_change(TxState.PREPARED, TxInput.CHECK)
    for (state, _), new in TRANSITIONS.items():
        if state.resolved:
            assert new is state
    assert {s for s in TxState if s.resolved} == {
        TxState.COMMITTED,
        TxState.ROLLED_BACK,
        TxState.DISCARDED,
    }
