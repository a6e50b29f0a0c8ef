"""GroupMember against a real etcd: three members of one group, each with a recording Replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from tidemq.clock import SystemClock
from tidemq.controller.etcd import EtcdSession
from tidemq.controller.lease import LeaseKeeper
from tidemq.controller.member import GroupMember, Role
from tidemq.controller.state import Addrs, GroupState, alive_key, state_key
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
    """The Replica protocol, recording each call; the test sets offsets, lag and catch-up."""

    id: int
    offset: int = 0
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

    async def stop_replicating(self) -> int:
        self.events.append(("stop_replicating", self.offset))
        return self.offset

    async def become_master(self, state: GroupState) -> None:
        self.events.append(("master", state.epoch))

    async def become_slave(self, state: GroupState) -> None:
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

    async def start(self, replica_id: int, offset: int = 0) -> GroupMember:
        session = EtcdSession([self.etcd.endpoint], call_timeout_s=1.0)
        self._sessions.append(session)
        clock = SystemClock()
        replica = RecordingReplica(replica_id, offset)
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
    await group.start(master, offset=100 * master)
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
