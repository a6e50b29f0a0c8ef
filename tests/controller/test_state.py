"""The group state's codec, transitions and the truncation rule (pure; no etcd)."""

from __future__ import annotations

import orjson
import pytest

from tidemq.controller.state import (
    EPOCH_HISTORY_MAX,
    Addrs,
    AliveRecord,
    ControllerError,
    GroupState,
    alive_id,
    alive_key,
    alive_prefix,
    state_key,
    truncation_point,
)
from tidemq.errors import QueueError

A1 = Addrs("10.0.0.1:10911", "10.0.0.1:10912")
A2 = Addrs("10.0.0.2:10911", "10.0.0.2:10912")


def test_first_state_names_its_creator_master_of_epoch_1() -> None:
    state = GroupState.first(1, A1, 4096)
    assert state == GroupState(1, 1, A1.addr, A1.ha_addr, frozenset({1}), ((1, 4096),))


def test_state_json_round_trip_uses_the_documented_keys() -> None:
    state = GroupState.first(2, A2, 0).expand(frozenset({1, 3}))
    raw = state.to_json()
    assert orjson.loads(raw) == {
        "epoch": 1,
        "master": 2,
        "masterAddr": A2.addr,
        "masterHaAddr": A2.ha_addr,
        "syncSet": [1, 2, 3],
        "epochs": [[1, 0]],
    }
    assert GroupState.from_json(raw) == state


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"epoch": 1}',
        b'{"epoch": 0, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": [[0, 0]]}',
        b'{"epoch": true, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": [[1, 0]]}',
        b'{"epoch": 1, "master": 1, "masterAddr": 5, "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": [[1, 0]]}',
        b'{"epoch": 1, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": "1",'
        b' "epochs": [[1, 0]]}',
        b'{"epoch": 1, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": [[1, -1]]}',
        b'{"epoch": 1, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": []}',
        b'{"epoch": 2, "master": 1, "masterAddr": "a", "masterHaAddr": "b", "syncSet": [1],'
        b' "epochs": [[1, 0]]}',
    ],
)
def test_malformed_state_raises_a_controller_error(raw: bytes) -> None:
    with pytest.raises(ControllerError, match="malformed"):
        GroupState.from_json(raw)


def _doc(**changes: object) -> bytes:
    doc: dict[str, object] = {
        "epoch": 3,
        "master": 2,
        "masterAddr": A2.addr,
        "masterHaAddr": A2.ha_addr,
        "syncSet": [1, 2],
        "epochs": [[1, 0], [2, 100], [3, 100]],
    }
    doc.update(changes)
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    "changes",
    [
        {"epochs": [[1, 0], [3, 100], [3, 200]]},  # epochs not strictly increasing
        {"epochs": [[2, 0], [1, 100], [3, 200]]},
        {"epochs": [[1, 0], [2, 300], [3, 200]]},  # a start going back
        {"master": 3},  # the master outside syncSet
        {"masterAddr": "10.0.0.2"},  # no port
        {"masterHaAddr": ":10912"},  # no host
        {"masterAddr": "10.0.0.2:99999"},
        {"masterHaAddr": "10.0.0.2:x1"},
    ],
)
def test_an_inconsistent_state_is_malformed(changes: dict[str, object]) -> None:
    assert GroupState.from_json(_doc())  # the base document is valid
    with pytest.raises(ControllerError, match="malformed"):
        GroupState.from_json(_doc(**changes))


def test_a_state_without_master_needs_no_addresses() -> None:
    state = GroupState.from_json(_doc(master=0, masterAddr="", masterHaAddr="", syncSet=[1]))
    assert state.master == 0
    assert issubclass(ControllerError, QueueError)


def test_alive_record_round_trip_and_malformed() -> None:
    record = AliveRecord("1.2.3.4:5", "1.2.3.4:6", 77)
    assert orjson.loads(record.to_json()) == {
        "addr": "1.2.3.4:5",
        "haAddr": "1.2.3.4:6",
        "maxOffset": 77,
    }
    assert AliveRecord.from_json(record.to_json()) == record
    with pytest.raises(ControllerError, match="maxOffset"):
        AliveRecord.from_json(b'{"addr": "a", "haAddr": "b", "maxOffset": -1}')


def test_alive_record_carries_the_last_epoch_and_reads_records_without_it() -> None:
    record = AliveRecord("1.2.3.4:5", "1.2.3.4:6", 77, last_epoch=4)
    assert orjson.loads(record.to_json())["lastEpoch"] == 4
    assert AliveRecord.from_json(record.to_json()) == record
    # A record of an older version has no lastEpoch: unknown, not 0 (rules.create_refusal).
    legacy = AliveRecord.from_json(b'{"addr": "a", "haAddr": "b", "maxOffset": 0}')
    assert legacy.last_epoch is None
    for bad in (b"-1", b"true", b'"3"', b"null"):
        with pytest.raises(ControllerError, match="lastEpoch"):
            AliveRecord.from_json(
                b'{"addr": "a", "haAddr": "b", "maxOffset": 0, "lastEpoch": ' + bad + b"}"
            )


def test_elect_bumps_the_epoch_resets_sync_set_and_appends_history() -> None:
    state = GroupState.first(1, A1, 100).expand(frozenset({2, 3}))
    new = state.elect(2, A2, 250)
    assert new.epoch == 2
    assert new.master == 2
    assert (new.master_addr, new.master_ha_addr) == A2
    assert new.sync_set == frozenset({2})
    assert new.epochs == ((1, 100), (2, 250))


def test_elect_refuses_a_candidate_outside_sync_set() -> None:
    state = GroupState.first(1, A1, 0)
    with pytest.raises(AssertionError, match="not in syncSet"):
        state.elect(2, A2, 0)


def test_history_is_trimmed_to_the_last_entries() -> None:
    state = GroupState.first(1, A1, 0)
    for epoch in range(2, EPOCH_HISTORY_MAX + 11):
        state = state.elect(state.master, A1, epoch * 10)
    assert len(state.epochs) == EPOCH_HISTORY_MAX
    assert state.epochs[-1] == (state.epoch, state.epoch * 10)
    assert state.epochs[0][0] == state.epoch - EPOCH_HISTORY_MAX + 1
    assert GroupState.from_json(state.to_json()) == state


def test_shrink_and_expand_keep_the_master() -> None:
    state = GroupState.first(1, A1, 0).expand(frozenset({2, 3}))
    assert state.shrink(frozenset({3})).sync_set == frozenset({1, 2})
    assert state.shrink(frozenset({3})).epoch == state.epoch
    with pytest.raises(AssertionError):
        state.shrink(frozenset({1}))


def test_key_names() -> None:
    assert state_key("/tidemq", "c", "broker-a") == "/tidemq/groups/c/broker-a/state"
    assert state_key("/tidemq/", "c", "b") == "/tidemq/groups/c/b/state"
    prefix = alive_prefix("/tidemq", "c", "b")
    assert alive_key("/tidemq", "c", "b", 3) == prefix + "3"
    assert alive_id(prefix + "3", prefix) == 3
    assert alive_id(prefix + "x", prefix) is None
    assert alive_id("/tidemq/groups/c/b/state", prefix) is None


@pytest.mark.parametrize(
    "rest", ["\u00b2", "\u0663", "0", "01", "-1", " 1", "1 ", "12345678901", ""]
)
def test_alive_id_takes_only_ascii_replica_ids(rest: str) -> None:
    """ "²".isdigit() is True but int("²") raises: such a key must be skipped, not crash a read."""
    prefix = alive_prefix("/tidemq", "c", "b")
    assert alive_id(prefix + rest, prefix) is None
    assert alive_id(prefix + "9999999999", prefix) == 9_999_999_999


HISTORY = ((1, 0), (2, 100), (3, 130))


def test_truncation_of_a_deposed_master() -> None:
    # Master of epoch 2 wrote 100..150; the group acknowledged only up to 130, where the master
    # of epoch 3 began. The old master keeps 0..130 and drops the rest.
    assert truncation_point(2, HISTORY, 150) == 130


def test_truncation_nothing_to_cut() -> None:
    assert truncation_point(3, HISTORY, 500) is None  # on the latest epoch already
    assert truncation_point(2, HISTORY, 120) is None  # behind the next epoch's start
    assert truncation_point(2, HISTORY, 130) is None
    assert truncation_point(None, HISTORY, 0) is None  # a fresh replica


def test_a_log_from_before_controller_mode_is_cut_to_epoch_1s_start() -> None:
    history = ((1, 100), (2, 150))
    assert truncation_point(None, history, 140) == 100  # the old 4.x master: cut its tail
    assert truncation_point(None, history, 80) is None  # a 4.x slave behind: a prefix


def test_truncation_of_a_slave_two_epochs_behind() -> None:
    assert truncation_point(1, HISTORY, 140) == 100


def test_truncation_refuses_unmatchable_replicas() -> None:
    trimmed = ((5, 10), (6, 20))
    with pytest.raises(ControllerError, match="older than the oldest"):
        truncation_point(4, trimmed, 30)
    with pytest.raises(ControllerError, match="unknown"):
        truncation_point(7, trimmed, 30)
    with pytest.raises(ControllerError, match="no epoch file"):
        truncation_point(None, trimmed, 30)
