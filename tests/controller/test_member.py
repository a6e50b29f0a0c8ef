"""GroupMember against a real etcd: three members of one group, each with a recording Replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest

from tidemq.clock import SystemClock
from tidemq.controller.etcd import EtcdSession
from tidemq.controller.lease import LeaseKeeper
from tidemq.controller.member import GroupMember, Role
from tidemq.controller.state import (
    Addrs,
    AliveRecord,
    EtcdUnavailable,
    GroupState,
    alive_key,
    state_key,
)
from tidemq.testing import eventually, eventually_async
from tidemq.testing.etcd import EtcdProcess

pytestmark = pytest.mark.etcd

PREFIX = "/tidemq"
CLUSTER = "c"
NAME = "broker-a"
TTL_S = 2
RANK_DELAY_MS = 200


@dataclass
class RecordingReplica:
    """The Replica protocol, recording each call; the test sets offsets, lag and catch-up. Like
    the broker, it records the epoch it becomes master of or follows (a wiped store: 0), and
    the epoch it last stood for. hang_master: become_master never returns (a broker killed
    while it stops its STANDBY app, before it records the epoch)."""

    id: int
    offset: int = 0
    epoch: int = 0
    stood: int = 0
    hang_master: bool = False
    events: list[tuple[object, ...]] = field(default_factory=list)
    sync_set: frozenset[int] | None = None
    lag: frozenset[int] = frozenset()
    caught: frozenset[int] = frozenset()

    @property
    def broker_id(self) -> int:
        return self.id

    def address(self) -> str:
        return f"127.0.0.1:{10_000 + self.id * 10}"

    def ha_address(self) -> str:
        return f"127.0.0.1:{10_001 + self.id * 10}"

    def max_offset(self) -> int:
        return self.offset

    def last_epoch(self) -> int:
        return self.epoch

    def note_standing(self, epoch: int) -> None:
        self.stood = epoch

    def standing(self) -> int:
        return self.stood

    async def stop_replicating(self) -> int:
        self.events.append(("stop_replicating", self.offset))
        return self.offset

    async def become_master(self, state: GroupState) -> None:
        if self.hang_master:
            await asyncio.Event().wait()
        self.epoch = state.epoch
        self.events.append(("master", state.epoch))

    async def become_slave(self, state: GroupState) -> None:
        self.epoch = state.epoch
        self.events.append(("slave", state.epoch, state.master))

    async def step_down(self, reason: str) -> None:
        self.events.append(("step_down", reason))

    def set_sync_set(self, ids: frozenset[int]) -> None:
        self.sync_set = ids

    def lagging(self, max_ms: int) -> frozenset[int]:
        return self.lag

    def caught_up(self) -> frozenset[int]:
        return self.caught


class Group:
    """Members of one group on one etcd, each with its own session (as separate brokers)."""

    def __init__(self, etcd: EtcdProcess, observer: EtcdSession) -> None:
        self.etcd = etcd
        self.observer = observer
        self.members: dict[int, GroupMember] = {}
        self.replicas: dict[int, RecordingReplica] = {}
        self._sessions: list[EtcdSession] = []

    async def start(
        self,
        replica_id: int,
        offset: int = 0,
        epoch: int = 0,
        *,
        stood: int = 0,
        hang_master: bool = False,
    ) -> GroupMember:
        """A member on a store ending at `offset` whose epoch file ends with `epoch` and whose
        standing record is `stood`."""
        session = EtcdSession([self.etcd.endpoint], call_timeout_s=1.0)
        self._sessions.append(session)
        clock = SystemClock()
        replica = RecordingReplica(replica_id, offset, epoch, stood=stood, hang_master=hang_master)
        lease = LeaseKeeper(session, TTL_S, clock)
        member = GroupMember(
            session, lease, replica, CLUSTER, NAME, PREFIX, clock, 3000, rank_delay_ms=RANK_DELAY_MS
        )
        self.members[replica_id] = member
        self.replicas[replica_id] = replica
        member.start()
        return member

    def masters(self) -> list[int]:
        return [i for i, m in self.members.items() if m.role is Role.MASTER]

    def following(self, epoch: int, master: int) -> list[int]:
        return [
            i
            for i, m in self.members.items()
            if m.role is Role.SLAVE and ("slave", epoch, master) == self.replicas[i].events[-1]
        ]

    async def state(self) -> GroupState:
        got = await self.observer.get(state_key(PREFIX, CLUSTER, NAME))
        assert got is not None
        return GroupState.from_json(got.value)

    async def wait_state(self, what: str, check: object) -> GroupState:
        assert callable(check)
        found: list[GroupState] = []

        async def matches() -> bool:
            state = await self.state()
            found[:] = [state]
            return bool(check(state))

        await eventually_async(matches, 15.0, what=what)
        return found[0]

    async def stop_all(self) -> None:
        for member in self.members.values():
            if member.role is not Role.STOPPED:
                await member.stop(clean=False)
        for session in self._sessions:
            await session.close()


@pytest.fixture
async def group(etcd: EtcdProcess, session: EtcdSession) -> AsyncIterator[Group]:
    group = Group(etcd, session)
    try:
        yield group
    finally:
        await group.stop_all()


async def _three(group: Group) -> int:
    """Start members 1, 2 and 3 at once; the one master they settle on."""
    for replica_id in (1, 2, 3):
        await group.start(replica_id, offset=100 * replica_id)
    await eventually(lambda: len(group.masters()) == 1, 15.0, what="one master")
    master = group.masters()[0]
    others = [i for i in (1, 2, 3) if i != master]
    await eventually(lambda: sorted(group.following(1, master)) == others, 15.0, what="slaves")
    return master


def _caught_up_offset(group: Group, master: int, replica_id: int) -> int:
    """A slave that caught up holds at least the master's log (its own offset differs, to tell
    from the history which one was elected)."""
    return group.replicas[master].offset + replica_id


async def _expand(group: Group, master: int, ids: set[int]) -> GroupState:
    for replica_id in ids:
        group.replicas[replica_id].offset = _caught_up_offset(group, master, replica_id)
    group.replicas[master].caught = frozenset(ids)
    want = frozenset({master, *ids})
    state = await group.wait_state("syncSet expanded", lambda s: s.sync_set == want)
    assert group.replicas[master].sync_set == want
    return state


async def test_first_start_elects_exactly_one_master(group: Group) -> None:
    master = await _three(group)
    state = await group.state()
    offset = 100 * master
    assert state == GroupState.first(master, Addrs(*_addrs(group, master)), offset), (
        "epoch 1 names the creator, syncSet is the creator alone"
    )
    assert group.replicas[master].events == [("master", 1)]
    assert group.replicas[master].sync_set == frozenset({master})
    for replica_id in (1, 2, 3):
        got = await group.observer.get(alive_key(PREFIX, CLUSTER, NAME, replica_id))
        assert got is not None, f"alive key of {replica_id}"


def _addrs(group: Group, replica_id: int) -> tuple[str, str]:
    replica = group.replicas[replica_id]
    return replica.address(), replica.ha_address()


async def test_expand_and_shrink_are_cased(group: Group) -> None:
    master = await _three(group)
    others = {i for i in (1, 2, 3) if i != master}
    await _expand(group, master, others)
    laggard = min(others)
    group.replicas[master].caught = frozenset()
    group.replicas[master].lag = frozenset({laggard})
    want = frozenset({master, *others} - {laggard})
    state = await group.wait_state("syncSet shrunk", lambda s: s.sync_set == want)
    assert state.epoch == 1
    await eventually(lambda: group.replicas[master].sync_set == want, what="acks stop waiting")


async def test_crashed_master_is_replaced_by_a_sync_set_member(group: Group) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    await _expand(group, master, set(others))
    await group.members[master].stop(clean=False)  # a crash: the lease expires on its own

    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    new = state.master
    assert new == others[0], "the lowest alive syncSet id ranks first"
    assert state.sync_set == frozenset({new})
    new_start = _caught_up_offset(group, master, new)
    assert state.epochs == ((1, 100 * master), (2, new_start))
    await eventually(lambda: group.masters() == [new], what="the new master acts")
    events = group.replicas[new].events
    assert events[-2:] == [("stop_replicating", new_start), ("master", 2)]
    await eventually(lambda: group.following(2, new) == [others[1]], what="the other follows")


async def test_a_clean_stop_hands_over_at_once(group: Group) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    await _expand(group, master, set(others))
    await group.members[master].stop(clean=True)
    assert await group.observer.get(alive_key(PREFIX, CLUSTER, NAME, master)) is None
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert state.master == others[0]


async def test_no_member_outside_sync_set_is_ever_elected(group: Group) -> None:
    master = await _three(group)
    await group.members[master].stop(clean=False)
    alive = alive_key(PREFIX, CLUSTER, NAME, master)

    async def master_gone() -> bool:
        return await group.observer.get(alive) is None

    await eventually_async(master_gone, 10.0, what="the master's lease expired")
    # The others see the master gone but may not stand: give them several rank delays.
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    state = await group.state()
    assert (state.epoch, state.master) == (1, master)
    assert group.masters() == []
    # The master comes back (a restart): it takes the group again, in a new epoch.
    await group.start(master, offset=100 * master, epoch=1)
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert state.master == master
    assert state.epochs[-1] == (2, 100 * master)


async def test_a_deposed_master_steps_down_and_follows(group: Group) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    state = await _expand(group, master, set(others))
    got = await group.observer.get(state_key(PREFIX, CLUSTER, NAME))
    assert got is not None
    usurper = others[-1]
    usurper_offset = group.replicas[usurper].offset
    deposed = state.elect(usurper, Addrs(*_addrs(group, usurper)), usurper_offset)
    # As if the usurper's own candidacy had won (it stands before its CAS), then it crashed.
    group.replicas[usurper].stood = deposed.epoch
    assert await group.observer.cas(
        state_key(PREFIX, CLUSTER, NAME), deposed.to_json(), got.mod_revision
    )

    await eventually(
        lambda: any(e[0] == "step_down" for e in group.replicas[master].events), what="step down"
    )
    assert group.members[master].role is not Role.MASTER
    await eventually(lambda: group.masters() == [usurper], 15.0, what="the usurper acts")
    final = await group.state()
    await eventually(
        lambda: master in group.following(final.epoch, usurper), what="the old master follows"
    )


async def test_a_master_that_loses_its_lease_steps_down(group: Group) -> None:
    master = await _three(group)
    member = group.members[master]
    lease_id = member.lease.lease_id
    assert lease_id is not None
    await group.observer.revoke(lease_id)  # etcd forgot it: on_lost, fence, new lease
    await eventually(
        lambda: any(e[0] == "step_down" for e in group.replicas[master].events), what="step down"
    )
    assert ("step_down", "master lease lost") in group.replicas[master].events
    # syncSet was the master alone, so only it may take the group again (epoch 2).
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert state.master == master
    await eventually(lambda: group.masters() == [master], what="acting again")
    assert member.may_acknowledge()


async def test_a_master_cut_off_from_etcd_steps_down_without_it(group: Group) -> None:
    master = await _three(group)
    member = group.members[master]
    group.etcd.pause()
    try:
        # No call to etcd can succeed now: the fence must come from the lease deadline alone.
        await eventually(
            lambda: ("step_down", "master lease lost") in group.replicas[master].events,
            10.0,
            what="the master fences itself while etcd is paused",
        )
        assert not member.may_acknowledge()
    finally:
        group.etcd.resume()
    # etcd is back: the group has one acting master again (syncSet was the master alone).
    state = await group.wait_state("a new epoch", lambda s: s.epoch >= 2)
    assert state.master == master
    await eventually(lambda: group.masters() == [master], 15.0, what="acting again")


async def test_a_sync_set_member_whose_log_ends_before_the_epoch_start_never_stands(
    group: Group,
) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    await _expand(group, master, set(others))
    # The first-ranked member's store was wiped (same id): it must leave the group to the other.
    wiped = others[0]
    group.replicas[wiped].offset = 0
    await group.members[master].stop(clean=True)
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert state.master == others[1]
    assert ("master", 2) not in group.replicas[wiped].events


async def test_a_stray_alive_key_does_not_stop_a_hand_over(group: Group) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    await _expand(group, master, set(others))
    # "²".isdigit() is True, int("²") is not: a key that once failed every read of the group.
    stray = alive_key(PREFIX, CLUSTER, NAME, 1)[:-1] + "\u00b2"
    await group.observer.put(stray, b"{}")
    await group.members[master].stop(clean=True)
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert state.master == others[0]


async def test_a_wiped_sync_set_member_is_never_elected_even_when_its_log_reaches_the_start(
    group: Group,
) -> None:
    # Epoch 1 starts at 0, so the wiped replica's empty log "reaches" it: only its epoch file
    # (last_epoch 0) tells it lacks the acknowledged messages.
    await group.start(1)
    await eventually(lambda: group.masters() == [1], 15.0, what="1 master")
    await group.start(2)
    await group.start(3)
    await eventually(lambda: sorted(group.following(1, 1)) == [2, 3], 15.0, what="slaves")
    for replica_id in (1, 2, 3):
        group.replicas[replica_id].offset = 5000
    group.replicas[1].caught = frozenset({2, 3})
    await group.wait_state("expanded", lambda s: s.sync_set == frozenset({1, 2, 3}))
    group.replicas[1].caught = frozenset()
    for replica_id in (1, 2, 3):  # the whole group crashes at once: nobody stands meanwhile
        await group.members.pop(replica_id).stop(clean=False)

    async def all_gone() -> bool:
        return not await group.observer.get_prefix(alive_key(PREFIX, CLUSTER, NAME, 1)[:-1])

    await eventually_async(all_gone, 10.0, what="every lease expired")
    assert (await group.state()).sync_set == frozenset({1, 2, 3})
    await group.start(2, offset=0, epoch=0)  # 2's store was wiped; it comes back first
    await eventually(lambda: group.members[2].alive.keys() == {2}, what="2 alive")
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert (await group.state()).epoch == 1, "the wiped replica stood"
    await group.start(3, offset=5000, epoch=1)
    state = await group.wait_state("epoch 2", lambda s: s.epoch == 2)
    assert (state.master, state.epochs[-1]) == (3, (2, 5000))
    assert ("master", 2) not in group.replicas[2].events
    await eventually(lambda: group.masters() == [3], what="3 acts")


async def test_a_deleted_state_is_not_recreated_by_members_with_history(group: Group) -> None:
    master = await _three(group)
    others = sorted(i for i in (1, 2, 3) if i != master)
    key = state_key(PREFIX, CLUSTER, NAME)
    saved = await group.observer.get(key)
    assert saved is not None
    await group.observer.delete(key)
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert await group.observer.get(key) is None, "a member re-created the state"
    member = group.members[master]
    assert member.role is Role.MASTER, "the master keeps serving while its lease holds"
    assert member.state is not None, "the last state is kept"
    assert group.replicas[master].events == [("master", 1)]
    # A replica with history that starts now refuses too, and so does a new one, which sees
    # replicas with history alive.
    await group.members.pop(others[0]).stop(clean=True)
    await group.start(others[0], offset=100 * others[0], epoch=1)
    await group.start(4)
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert await group.observer.get(key) is None
    # The operator restores the state: the group goes on where it was.
    await group.observer.put(key, saved.value)
    await eventually(lambda: others[0] in group.following(1, master), what="follows again")
    await _expand(group, master, set(others))
    assert group.replicas[master].events == [("master", 1)]


async def test_no_replica_creates_a_missing_state_while_one_with_history_is_alive(
    group: Group,
) -> None:
    key = state_key(PREFIX, CLUSTER, NAME)
    # The history-less replica starts first, the one with history (epoch 3) right after: the
    # creator waits a rank delay, so it sees its peer alive before it could create.
    fresh = await group.start(2, offset=0)
    await group.start(1, offset=500, epoch=3)
    # An alive record without lastEpoch (an older version) may hold history too.
    legacy = alive_key(PREFIX, CLUSTER, NAME, 3)
    await group.observer.put(legacy, AliveRecord("127.0.0.1:10030", "127.0.0.1:10031", 0).to_json())
    await eventually(lambda: fresh.alive.keys() == {1, 2, 3}, what="2 sees its peers")
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert await group.observer.get(key) is None, "created while history was alive"
    record = fresh.alive[1]
    assert record is not None
    assert record.last_epoch == 3
    await group.members.pop(1).stop(clean=True)
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert await group.observer.get(key) is None, "created while an unknown record was alive"
    # Nobody alive may hold history: the group is new to etcd, and the fresh replica starts it.
    await group.observer.delete(legacy)
    await eventually(lambda: group.masters() == [2], what="2 created the state")
    state = await group.state()
    assert (state.epoch, state.master) == (1, 2)
    assert group.replicas[2].stood == 1, "stood for epoch 1 before creating it"


async def test_a_creator_killed_before_recording_epoch_1_takes_the_group_on_restart(
    group: Group,
) -> None:
    await group.start(1, hang_master=True)  # killed in become_master: epoch 1 never recorded

    async def created() -> bool:
        return await group.observer.get(state_key(PREFIX, CLUSTER, NAME)) is not None

    await eventually_async(created, 15.0, what="1 created the state")
    state = await group.state()
    assert (state.epoch, state.master) == (1, 1)
    await group.start(2)
    await eventually(lambda: group.following(1, 1) == [2], what="2 follows epoch 1")
    assert (group.replicas[1].stood, group.replicas[1].epoch) == (1, 0)
    await group.members.pop(1).stop(clean=False)
    # Back as a wiped store (no standing record): its epoch file looks the same, yet it must
    # never take the group.
    await group.start(1)
    await eventually(lambda: group.members[2].alive.keys() == {1, 2}, what="1 alive again")
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert group.masters() == []
    assert await group.state() == state
    await group.members.pop(1).stop(clean=False)
    # Back on its own store, killed in the same gap again, then back once more: it finishes
    # the election it won, in epoch 1 (a new epoch would wedge it on a second such kill).
    await group.start(1, stood=1, hang_master=True)
    await eventually(lambda: group.replicas[1].events == [("stop_replicating", 0)], what="again")
    await group.members.pop(1).stop(clean=False)
    await group.start(1, stood=1)
    await eventually(lambda: group.masters() == [1], what="1 acts")
    assert group.replicas[1].events == [("stop_replicating", 0), ("master", 1)]
    assert await group.state() == state
    assert group.following(1, 1) == [2]


async def test_a_malformed_state_is_not_acted_on(group: Group) -> None:
    master = await _three(group)
    other = min(i for i in (1, 2, 3) if i != master)
    key = state_key(PREFIX, CLUSTER, NAME)
    saved = await group.observer.get(key)
    assert saved is not None
    good = GroupState.from_json(saved.value)
    # Names another master that is not in its syncSet: parsed as before, it deposed the master.
    bad = orjson.loads(good.elect(master, Addrs(*_addrs(group, master)), 0).to_json())
    bad["master"] = other
    await group.observer.put(key, orjson.dumps(bad))
    await asyncio.sleep(5 * RANK_DELAY_MS / 1000)
    assert group.members[master].role is Role.MASTER
    assert all(e[0] != "step_down" for e in group.replicas[master].events)
    await group.observer.put(key, good.to_json())
    await _expand(group, master, {other})


async def test_an_expand_whose_answer_was_lost_never_lowers_the_local_set(
    group: Group, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = await _three(group)
    x = min(i for i in (1, 2, 3) if i != master)
    member, replica = group.members[master], group.replicas[master]
    history: list[frozenset[int]] = []
    real_set = replica.set_sync_set

    def record(ids: frozenset[int]) -> None:
        history.append(ids)
        real_set(ids)

    monkeypatch.setattr(replica, "set_sync_set", record)
    real_cas = member.session.cas
    lost: list[int] = []

    async def cas(key: str, value: bytes, rev: int) -> bool:
        won = await real_cas(key, value, rev)
        if not lost:  # applied, but the answer is lost
            lost.append(rev)
            replica.caught = frozenset()  # x is not reported caught up for a while
            raise EtcdUnavailable("answer lost")
        return won

    monkeypatch.setattr(member.session, "cas", cas)
    # The watch lags, and no periodic re-read comes: only the member's own reaction may help.
    real_apply = member._apply
    monkeypatch.setattr(
        member, "_apply", lambda n: None if n.key.endswith("/state") else real_apply(n)
    )
    member._next_refresh_ms = float("inf")
    replica.caught = frozenset({x})
    await eventually(lambda: bool(lost), what="the expand CAS")
    assert x in (await group.state()).sync_set, "etcd applied it"
    await eventually(
        lambda: member.state is not None and x in member.state.sync_set, what="re-read"
    )
    await asyncio.sleep(3 * member.chore_interval_s)
    first = next(i for i, ids in enumerate(history) if x in ids)
    assert all(x in ids for ids in history[first:]), f"lowered: {history}"
    assert replica.sync_set == frozenset({master, x})


async def test_a_lost_lease_fences_at_once_even_if_a_new_one_comes_first(group: Group) -> None:
    master = await _three(group)
    member = group.members[master]
    lease = member.lease
    new_id = await group.observer.grant_lease(TTL_S)
    # What LeaseKeeper does on a loss and on the next grant, with no await between them: the
    # member's loop cannot run, so only the callback itself can fence.
    old_id, lease.lease_id = lease.lease_id, None
    lease.losses += 1
    assert lease.on_lost is not None
    assert lease.on_new_lease is not None
    lease.on_lost()
    lease.lease_id = new_id
    lease._set_valid(lease.clock.monotonic_ms())
    lease.on_new_lease(new_id)
    assert not member.may_acknowledge()
    await eventually(
        lambda: ("step_down", "master lease lost") in group.replicas[master].events,
        what="the loop steps the replica down",
    )
    assert old_id is not None
    await group.observer.revoke(old_id)
    await eventually(lambda: group.masters() == [master], 15.0, what="acting again")
