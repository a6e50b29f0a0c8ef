"""The exactly-once ledger and the resolver's writes (resolution.py) over a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from tx_harness import GROUP, TOPIC, World, user_message

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.ledger import TransactionBusy, TransactionForgotten
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput, TxState
from tidemq.clock import FakeClock
from tidemq.protocol import record as rec
from tidemq.protocol.message import SysFlag


def test_prepare_is_invisible_in_the_real_topic(world: World) -> None:
    put = world.prepare()
    assert put.queue_offset == 0
    assert world.real_messages() == []
    assert world.ledger.pending(0) is not None
    assert world.stats.prepared == 1


def test_commit_stores_the_real_message_then_the_op(world: World) -> None:
    put = world.prepare(b"hello")
    result = world.resolver.end(world.half_at(put.physical_offset), TxInput.COMMIT)
    assert result.state is TxState.COMMITTED
    assert result.stored is not None
    (real,) = world.real_messages()
    assert real.body == b"hello"
    assert real.prepared_transaction_offset == put.physical_offset
    assert SysFlag.transaction_type(real.sys_flag) == SysFlag.COMMIT
    assert world.op_origins() == [0]
    assert world.ledger.pending(0) is None
    assert world.stats.committed == 1


def test_rollback_writes_only_the_op(world: World) -> None:
    put = world.prepare()
    result = world.resolver.end(world.half_at(put.physical_offset), TxInput.ROLLBACK)
    assert result.state is TxState.ROLLED_BACK
    assert result.stored is None
    assert world.real_messages() == []
    assert world.op_origins() == [0]
    assert world.stats.rolled_back == 1


def test_unknown_changes_nothing(world: World) -> None:
    put = world.prepare()
    result = world.resolver.end(world.half_at(put.physical_offset), TxInput.UNKNOWN)
    assert result.state is TxState.PREPARED
    assert world.op_origins() == []


def test_double_commit_answers_success_and_stores_nothing(world: World) -> None:
    put = world.prepare()
    half = world.half_at(put.physical_offset)
    world.resolver.end(half, TxInput.COMMIT)
    again = world.resolver.end(half, TxInput.COMMIT)
    assert again.duplicate
    assert again.stored is None
    assert again.state is TxState.COMMITTED
    assert len(world.real_messages()) == 1
    assert world.op_origins() == [0]
    assert world.stats.duplicate_answers == 1


def test_rollback_after_commit_and_commit_after_rollback_are_refused(world: World) -> None:
    first = world.half_at(world.prepare(b"a").physical_offset)
    second = world.half_at(world.prepare(b"b").physical_offset)
    world.resolver.end(first, TxInput.COMMIT)
    world.resolver.end(second, TxInput.ROLLBACK)
    with pytest.raises(IllegalStateTransition, match="COMMITTED"):
        world.resolver.end(first, TxInput.ROLLBACK)
    with pytest.raises(IllegalStateTransition, match="ROLLED_BACK"):
        world.resolver.end(second, TxInput.COMMIT)
    assert [m.body for m in world.real_messages()] == [b"a"]
    assert world.stats.refused_answers == 2


def test_answer_about_a_copy_resolves_the_same_transaction(world: World) -> None:
    half = world.half_at(world.prepare().physical_offset)
    copy = world.resolver.put_back(half, 1)
    assert copy is not None
    world.resolver.end(copy, TxInput.COMMIT)  # the check-back answer
    late = world.resolver.end(half, TxInput.COMMIT)  # the producer's own, late
    assert late.duplicate
    assert len(world.real_messages()) == 1


def test_commit_after_discard_is_refused_rollback_agrees(world: World) -> None:
    half = world.half_at(world.prepare().physical_offset)
    assert world.resolver.discard(half)
    (parked,) = world.records(hm.DISCARD_TOPIC)
    assert parked.body == half.body
    with pytest.raises(IllegalStateTransition, match="DISCARDED"):
        world.resolver.end(half, TxInput.COMMIT)
    assert world.resolver.end(half, TxInput.ROLLBACK).duplicate
    assert world.real_messages() == []


def test_in_flight_max_refuses_prepares(tmp_path: Path, clock: FakeClock) -> None:
    w = World(tmp_path, clock, in_flight_max=2)
    try:
        first = w.prepare(b"1")
        w.prepare(b"2")
        with pytest.raises(TransactionBusy):
            w.prepare(b"3")
        w.resolver.end(w.half_at(first.physical_offset), TxInput.ROLLBACK)
        w.prepare(b"3")
    finally:
        w.close()


def test_outcomes_memory_is_bounded_and_forgotten_answers_are_refused(
    tmp_path: Path, clock: FakeClock
) -> None:
    w = World(tmp_path, clock, outcomes_max=2)
    try:
        halves = [w.half_at(w.prepare(bytes([i])).physical_offset) for i in range(3)]
        for half in halves:
            w.resolver.end(half, TxInput.COMMIT)
        assert w.ledger.state(0) is None  # the oldest outcome was forgotten
        assert w.ledger.state(2) is TxState.COMMITTED
        with pytest.raises(TransactionForgotten):
            w.resolver.end(halves[0], TxInput.COMMIT)
        assert len(w.real_messages()) == 3
    finally:
        w.close()


def test_outcomes_and_pending_survive_a_restart(world: World) -> None:
    committed = world.prepare(b"c")
    rolled = world.prepare(b"r")
    live = world.prepare(b"live")
    world.resolver.end(world.half_at(committed.physical_offset), TxInput.COMMIT)
    world.resolver.end(world.half_at(rolled.physical_offset), TxInput.ROLLBACK)
    world.restart()
    assert world.ledger.state(committed.queue_offset) is TxState.COMMITTED
    assert world.ledger.state(rolled.queue_offset) is TxState.ROLLED_BACK
    assert world.ledger.state(live.queue_offset) is TxState.PREPARED
    assert world.resolver.end(world.half_at(committed.physical_offset), TxInput.COMMIT).duplicate
    with pytest.raises(IllegalStateTransition):
        world.resolver.end(world.half_at(rolled.physical_offset), TxInput.COMMIT)
    world.resolver.end(world.half_at(live.physical_offset), TxInput.COMMIT)
    assert [m.body for m in world.real_messages()] == [b"c", b"live"]


def test_rebuild_reads_the_batch_op_form(world: World) -> None:
    halves = [world.half_at(world.prepare(bytes([i])).physical_offset) for i in range(3)]
    op = hm.op_message([0, 2], hm.Outcome.ROLLBACK, store_host=("127.0.0.1", 1), now_ms=1)
    assert world.store.put_message(op).ok
    world.restart()
    assert world.ledger.state(0) is TxState.ROLLED_BACK
    assert world.ledger.state(1) is TxState.PREPARED
    assert world.ledger.state(2) is TxState.ROLLED_BACK
    assert len(halves) == 3


def test_restart_repairs_a_commit_whose_op_was_lost(world: World) -> None:
    """The broker died after storing the real message and before the op message."""
    half = world.half_at(world.prepare(b"x").physical_offset)
    assert world.store.put_message(hm.to_real_message(half)).ok  # no op, no ledger update
    world.restart()
    assert world.ledger.state(0) is TxState.COMMITTED
    assert world.op_origins() == [0]
    assert world.resolver.end(half, TxInput.COMMIT).duplicate
    assert len(world.real_messages()) == 1


def test_load_half_refuses_other_records(world: World) -> None:
    put = world.prepare()
    world.resolver.end(world.half_at(put.physical_offset), TxInput.COMMIT)
    (real,) = world.real_messages()
    assert world.resolver.load_half(real.physical_offset) is None
    assert world.resolver.load_half(put.physical_offset + 1) is None
    assert world.resolver.load_half(-1) is None
    assert world.resolver.load_half(10**9) is None
    assert isinstance(world.resolver.load_half(put.physical_offset), rec.StoredMessage)
    assert real.topic == TOPIC


@pytest.mark.parametrize(
    ("properties", "parking_topic"),
    [
        ({"DELAY": "2"}, "SCHEDULE_TOPIC_XXXX"),
        ({"TIMER_DELAY_SEC": "60"}, "rmq_sys_timer_"),
    ],
)
def test_committed_delayed_message_is_parked_and_repaired(
    tmp_path: Path, clock: FakeClock, properties: dict[str, str], parking_topic: str
) -> None:
    w = World(tmp_path, clock, delays=True)
    try:
        put = w.resolver.prepare(user_message(b"later", properties=properties), GROUP)
        half = w.half_at(put.physical_offset)
        result = w.resolver.end(half, TxInput.COMMIT)
        assert result.stored is not None
        assert w.real_messages() == []  # not delivered before its time
        parked = rec.decode_record(w.store.read_record(result.stored.physical_offset) or b"")
        assert parked.topic.startswith(parking_topic)
        assert parked.prepared_transaction_offset == put.physical_offset
        # A second transaction committed before a crash that lost its op message.
        put2 = w.resolver.prepare(user_message(b"lost-op", properties=properties), GROUP)
        half2 = w.half_at(put2.physical_offset)
        assert w.store.put_message(w.resolver._routed(hm.to_real_message(half2))).ok
        w.restart()
        assert w.ledger.state(hm.origin_of(half2)) is TxState.COMMITTED
        assert w.resolver.end(half2, TxInput.COMMIT).duplicate
    finally:
        w.close()
