"""The member's safety rules (controller/rules.py), as pure functions: no etcd."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.config import BrokerConfig
from tidemq.broker.failover import ControlledBroker
from tidemq.clock import SystemClock
from tidemq.controller.rules import create_refusal, previous_epoch, resumes, stand_refusal
from tidemq.controller.state import EPOCH_HISTORY_MAX, Addrs, AliveRecord, GroupState

A1 = Addrs("10.0.0.1:10911", "10.0.0.1:10912")
A2 = Addrs("10.0.0.2:10911", "10.0.0.2:10912")


def _alive(last_epoch: int | None) -> AliveRecord:
    return AliveRecord("10.0.0.9:10911", "10.0.0.9:10912", 0, last_epoch)


def test_only_a_history_less_replica_with_no_alive_history_creates() -> None:
    assert create_refusal({1: _alive(0), 2: _alive(0)}, 1, 0) is None
    assert create_refusal({}, 1, 0) is None
    assert "last epoch 3" in (create_refusal({}, 1, 3) or "")
    # Our own record is not a peer's (our last epoch is the argument).
    assert create_refusal({1: _alive(5)}, 1, 0) is None
    for peer in (_alive(2), _alive(None), None):  # history, a record without it, unreadable
        refusal = create_refusal({1: _alive(0), 2: peer, 3: _alive(0)}, 1, 0)
        assert refusal is not None
        assert "[2]" in refusal


def test_a_replica_stands_only_with_the_current_epoch_recorded() -> None:
    state = GroupState.first(1, A1, 0).expand(frozenset({2})).elect(2, A2, 50)
    assert stand_refusal(state, 2) is None
    for last in (0, 1, 3):
        assert stand_refusal(state, last) is not None


def test_previous_epoch_of_a_full_and_of_a_first_history() -> None:
    first = GroupState.first(1, A1, 0)
    assert previous_epoch(first) == 0
    state = first
    for _ in range(EPOCH_HISTORY_MAX + 3):
        state = state.elect(1, A1, 0)
    assert len(state.epochs) == EPOCH_HISTORY_MAX
    assert previous_epoch(state) == state.epoch - 1


@pytest.mark.parametrize(
    ("me", "last", "standing", "expected"),
    [
        (1, 0, 1, True),  # the creator, killed before it recorded epoch 1
        (1, 0, 0, False),  # a wiped store under the creator's id: no standing record
        (1, 1, 1, False),  # recorded: an ordinary restart (elect epoch + 1)
        (1, 0, 2, False),  # stood for another epoch
        (2, 0, 1, False),  # not the master the state names
    ],
)
def test_resumes_epoch_1(me: int, last: int, standing: int, expected: bool) -> None:
    assert resumes(GroupState.first(1, A1, 0), me, last, standing) is expected


def test_resumes_a_later_epoch_only_from_the_previous_one() -> None:
    state = GroupState.first(1, A1, 0).expand(frozenset({2})).elect(2, A2, 50)  # epoch 2
    assert resumes(state, 2, 1, 2)
    assert not resumes(state, 2, 0, 2), "a log from before epoch 1's history"
    # A history with a gap (3 after 1, as after a restore): the previous epoch is 1, not 2.
    gap = GroupState(3, 2, A2.addr, A2.ha_addr, frozenset({2}), ((1, 0), (3, 50)))
    assert resumes(gap, 2, 1, 3)
    assert not resumes(gap, 2, 2, 3)


def test_the_broker_keeps_its_standing_record_in_the_store(tmp_path: Path) -> None:
    config = BrokerConfig(
        enable_controller_mode=True,
        broker_id=1,
        ha_secret="0123456789abcdef",
        controller_etcd_endpoints=("127.0.0.1:2379",),
        store_path_root_dir=tmp_path,
    )
    broker = ControlledBroker(config, SystemClock())
    assert broker.standing() == 0, "a new (or wiped) store stood for nothing"
    broker.note_standing(7)
    broker.note_standing(8)
    assert broker.standing() == 8
    assert (tmp_path / "standing").read_text() == "8\n"
    assert ControlledBroker(config, SystemClock()).standing() == 8, "durable across restarts"
    (tmp_path / "standing").write_text("garbage")
    assert broker.standing() == 0
