"""Controller-mode acknowledgement (in_sync.py): a real HAMaster and two real HASlaves on
loopback. Waiters need every member of the sync set; a shrink releases them at once; the
confirm offset, `lagging` and `caught_up` follow the slaves; with no set the 4.x rule holds.
Joining: a slave outside the set joins under steady appends, a joiner that goes stops holding
acks, and (the bookkeeping alone, randomized) no replica is offered that lacks an acknowledged
message."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from ha_harness import CLOCK, caught_up, open_store, put_traffic, settings

from tidemq.broker.ha import HAMaster, HASettings, HASlave
from tidemq.broker.ha.in_sync import JOIN_DROP_GAPS, InSync
from tidemq.protocol.codes import ResponseCode
from tidemq.store import FileMessageStore
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration

ALL = frozenset({0, 1, 2})


@dataclass
class Group:
    master_store: FileMessageStore
    master: HAMaster
    stores: dict[int, FileMessageStore]
    slaves: dict[int, HASlave]
    slave_settings: HASettings

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.master.port}"

    def follow(self, replica: int) -> None:
        slave = HASlave(self.stores[replica], self.slave_settings, CLOCK, broker_id=replica)
        self.slaves[replica] = slave
        slave.set_master(self.address)

    def acked(self, replica: int) -> int:
        return max(
            (s.acked_offset for s in self.master.slaves() if s.broker_id == replica), default=-1
        )

    async def all_acked(self, *replicas: int) -> None:
        end = self.master_store.max_physical_offset
        for replica in replicas:
            await caught_up(self.master_store, self.stores[replica])

            def reported(replica: int = replica) -> bool:
                return self.acked(replica) == end

            await eventually(reported, what=f"{replica}'s report")


@asynccontextmanager
async def running_group(
    tmp_path: Path, master_settings: HASettings | None = None, *, quiet: bool = False
) -> AsyncIterator[Group]:
    """A master (replica 0) and slaves 1 and 2 following it, all stopped and closed at exit.
    `quiet`: heartbeats (the master's and the slaves' reports) 5 s apart, so that nothing but
    what the test does reaches the master meanwhile."""
    master_store = open_store(tmp_path / "master")
    stores = {r: open_store(tmp_path / f"slave{r}", replica=True) for r in (1, 2)}
    quiet_settings = settings(heartbeat_interval_ms=5_000, sync_timeout_ms=60_000)
    master_settings = quiet_settings if quiet else master_settings or settings()
    slave_settings = quiet_settings if quiet else settings()
    master = HAMaster(master_store, master_settings, CLOCK)
    group = Group(master_store, master, stores, {}, slave_settings)
    try:
        await group.master.start()
        for replica in stores:
            group.follow(replica)
        await eventually(lambda: len(group.master.slaves()) == 2, what="two slaves streaming")
        yield group
    finally:
        for slave in group.slaves.values():
            await slave.stop()
        await group.master.stop()
        for store in (master_store, *stores.values()):
            store.shutdown()


async def test_a_waiter_needs_every_member_of_the_set(tmp_path: Path) -> None:
    rng = random.Random(21)
    async with running_group(tmp_path) as group:
        confirms: list[int] = []
        group.master.add_confirm_listener(confirms.append)
        group.master.set_sync_set(ALL, 0)
        put_traffic(group.master_store, rng, 5)
        await group.all_acked(1, 2)
        link = group.slaves[2]._link
        assert link is not None
        assert link.transport is not None
        link.transport.pause_reading()  # slave 2 stops: no appends, no reports
        held_at = group.acked(2)
        end = put_traffic(group.master_store, rng, 20)[-1]
        codes: list[int] = []
        group.master.on_acked(end, codes.append)
        await group.all_acked(1)
        assert codes == []  # slave 1 has it, slave 2 not
        assert 0 < group.master.confirm_offset == held_at < end
        assert confirms[-1] == held_at
        link.transport.resume_reading()
        await group.all_acked(2)
        assert codes == [ResponseCode.SUCCESS]
        assert group.master.confirm_offset == end
        assert confirms[-1] == end
        assert confirms == sorted(set(confirms))  # only advances, each once
        assert group.master.waiting == 0


async def test_a_shrink_releases_the_waiters_of_a_stopped_member(tmp_path: Path) -> None:
    rng = random.Random(22)
    async with running_group(tmp_path) as group:
        group.master.set_sync_set(ALL, 0)
        put_traffic(group.master_store, rng, 5)
        await group.all_acked(1, 2)
        assert group.master.lagging(10) == frozenset()
        await group.slaves[2].stop()
        await eventually(lambda: len(group.master.slaves()) == 1, what="slave 2 gone")
        end = put_traffic(group.master_store, rng, 10)[-1]
        codes: list[int] = []
        group.master.on_acked(end, codes.append)
        await group.all_acked(1)
        assert codes == []  # waited for, not refused: no SLAVE_NOT_AVAILABLE shortcut
        assert group.master.confirm_offset < end  # slave 2's last report
        await eventually(lambda: group.master.lagging(50) == {2}, what="slave 2 lagging")
        group.master.set_sync_set(frozenset({0, 1}), 0)
        assert codes == [ResponseCode.SUCCESS]  # at once
        assert group.master.confirm_offset == end
        assert group.master.lagging(0) == frozenset()
        assert group.master.caught_up() == frozenset()
        group.master.lagging(60_000)  # the controller's lagging time, also a joiner's limit
        group.follow(2)  # back, outside the set: caught up once it has the confirmed log
        await group.all_acked(2)
        assert group.master.caught_up() == {2}
        group.master.set_sync_set(ALL, 0)
        assert group.master.caught_up() == frozenset()


async def test_an_idle_member_is_not_lagging(tmp_path: Path) -> None:
    """Slaves report once per heartbeat when idle: a caught-up member must not look late."""
    async with running_group(tmp_path, settings(heartbeat_interval_ms=5_000)) as group:
        put_traffic(group.master_store, random.Random(23), 5)
        group.master.set_sync_set(ALL, 0)
        await group.all_acked(1, 2)
        await asyncio.sleep(0.1)  # the time passing is the point: 100 ms without a report
        assert group.master.lagging(20) == frozenset()


async def test_the_master_alone_acknowledges_at_once(tmp_path: Path) -> None:
    master_store = open_store(tmp_path / "master")
    master = HAMaster(master_store, settings(), CLOCK)
    try:
        await master.start()
        confirms: list[int] = []
        master.add_confirm_listener(confirms.append)
        master.set_sync_set(frozenset({3}), 3)
        end = put_traffic(master_store, random.Random(24), 4)[-1]
        codes: list[int] = []
        master.on_acked(end, codes.append)
        assert codes == [ResponseCode.SUCCESS]
        assert master.confirm_offset == end
        assert confirms[-1] == end  # told by the append, with no report
    finally:
        await master.stop()
        master_store.shutdown()


async def test_a_missing_member_times_out_and_none_restores_the_4x_rule(tmp_path: Path) -> None:
    master_store = open_store(tmp_path / "master")
    master = HAMaster(master_store, settings(sync_timeout_ms=200), CLOCK)
    try:
        await master.start()
        master.set_sync_set(frozenset({0, 1}), 0)
        end = put_traffic(master_store, random.Random(25), 3)[-1]
        assert master.confirm_offset == 0  # member 1 never reported
        assert await master.wait_acked(end) == ResponseCode.FLUSH_SLAVE_TIMEOUT
        master.set_sync_set(None, 0)
        assert await master.wait_acked(end) == ResponseCode.SLAVE_NOT_AVAILABLE
        assert master.confirm_offset == end
        assert master.lagging(0) == master.caught_up() == frozenset()
    finally:
        await master.stop()
        master_store.shutdown()


# --- the bookkeeping alone, on a hand-driven clock ----------------------------------------------


def test_catch_up_clocks() -> None:
    in_sync = InSync(0, 1_000, join_gap=100)
    in_sync.change(ALL, 0, {1: 1_000}, now_ms=0)
    assert in_sync.lagging({1: 1_000}, 1_000, 3_000, now_ms=10_000) == {2}  # 2 never came
    in_sync.appended({1: 1_000}, 2_000, now_ms=10_000)  # 1 had it all until now
    assert in_sync.lagging({1: 1_000}, 2_000, 3_000, now_ms=12_999) == {2}
    assert in_sync.lagging({1: 1_000}, 2_000, 3_000, now_ms=13_001) == {1, 2}
    in_sync.reported(1, 2_000, now_ms=13_002)
    assert in_sync.lagging({}, 2_000, 3_000, now_ms=16_000) == {2}  # link gone since 13_002
    assert in_sync.confirm({}, 2_000) == 0  # 2 never reported
    in_sync.change(frozenset({0, 1}), 0, {}, now_ms=16_000)
    assert in_sync.confirm({}, 2_000) == 2_000  # 1's last report
    assert in_sync.floor({}) == -1  # but no live link acknowledges anything
    in_sync.change(frozenset({0}), 0, {}, now_ms=16_000)
    assert in_sync.floor({}) > 1 << 62


def test_a_joiner_is_caught_up_at_its_floor_only() -> None:
    in_sync = InSync(0, 5_000, join_gap=1_000)
    in_sync.change(frozenset({0}), 0, {}, now_ms=0)
    in_sync.join({1: 3_500, 2: 4_000}, 5_000, confirmed=4_800, now_ms=0)
    assert set(in_sync.joining) == {2}  # 1 is 1_500 behind: more than the gap
    assert in_sync.floor({2: 4_000}) == 4_000  # counted for acks like a member
    assert in_sync.confirm({2: 4_000}, 5_000) == 4_000
    assert in_sync.caught_up({2: 4_799}) == frozenset()  # below what was acknowledged
    assert in_sync.caught_up({2: 4_800}) == {2}
    in_sync.change(frozenset({0, 1}), 0, {}, now_ms=10)  # a set without it: still joining
    assert set(in_sync.joining) == {2}
    in_sync.change(frozenset({0, 2}), 0, {2: 4_800}, now_ms=20)  # CASed in: a member
    assert in_sync.joining == {}
    assert in_sync.others == {2}


@pytest.mark.parametrize(
    ("acks", "now_ms", "dropped"),
    [
        ({}, 10, True),  # disconnected
        ({2: 10_000 - JOIN_DROP_GAPS * 1_000}, 10, False),
        ({2: 10_000 - JOIN_DROP_GAPS * 1_000 - 1}, 10, True),  # too far behind
        ({2: 10_000}, 2_999, False),
        ({2: 10_000}, 3_000, True),  # joining for the lagging time without a CAS
    ],
)
def test_a_joiner_is_dropped(acks: dict[int, int], now_ms: float, dropped: bool) -> None:
    in_sync = InSync(0, 9_500, join_gap=1_000)
    in_sync.change(frozenset({0}), 0, {}, now_ms=0)
    in_sync.lagging({}, 9_500, 3_000, now_ms=0)
    in_sync.join({2: 9_500}, 9_500, confirmed=9_000, now_ms=0)
    assert set(in_sync.joining) == {2}
    in_sync.prune(acks, 10_000, now_ms)
    assert (2 not in in_sync.joining) == dropped
    if dropped:
        assert in_sync.floor(acks) > 1 << 62  # the master alone again: acks are not held
    else:
        assert in_sync.floor(acks) == acks[2]


def test_a_dropped_joiner_rejoins_only_past_its_drop_or_holding_the_whole_log() -> None:
    in_sync = InSync(0, 9_500, join_gap=1_000)
    in_sync.change(frozenset({0}), 0, {}, now_ms=0)
    in_sync.lagging({}, 9_500, 3_000, now_ms=0)
    in_sync.join({2: 9_000}, 9_500, confirmed=9_000, now_ms=0)
    in_sync.prune({2: 9_000}, 9_500, now_ms=3_000)  # its CAS never came: dropped at 9_000
    assert in_sync.joining == {}
    in_sync.join({2: 9_000}, 9_500, confirmed=9_000, now_ms=3_001)
    assert in_sync.joining == {}  # stuck where it was dropped: it would hold acks again
    in_sync.join({2: 9_000}, 9_000, confirmed=9_000, now_ms=3_002)
    assert set(in_sync.joining) == {2}  # an idle log it holds whole: it may join again


def test_no_replica_is_offered_without_every_acknowledged_message() -> None:
    """Random reports, appends, reconnects (a slave that comes back lower), set changes and
    lost CASes, driven in HAMaster's order (prune, join, release on the floor, confirm): each
    replica caught_up() offers, and each member, holds every end ever acknowledged."""
    for seed in range(40):
        rng = random.Random(seed)
        gap = 500
        end = 1_000
        in_sync = InSync(0, end, join_gap=gap)
        in_sync.change(frozenset({0}), 0, {}, now_ms=0)
        held = {1: rng.randrange(end + 1), 2: rng.randrange(end + 1)}  # what each replica has
        live: dict[int, int] = {}  # replica → acked of its link
        acknowledged = confirmed = 0
        for step in range(400):
            now_ms = step * 10.0
            action = rng.random()
            if action < 0.3:
                end += rng.randint(1, 400)
            elif action < 0.6:
                replica = rng.choice([1, 2])
                if replica in live:  # it appends some of what it lacks and reports
                    held[replica] = min(end, held[replica] + rng.randint(0, 600))
                    live[replica] = held[replica]
            elif action < 0.7:
                replica = rng.choice([1, 2])
                if live.pop(replica, None) is None:
                    live[replica] = held[replica]  # (re)connects at what it has
            in_sync.appended(live, end, now_ms)
            in_sync.prune(live, end, now_ms)
            in_sync.join(live, end, confirmed, now_ms)
            acknowledged = max(acknowledged, min(in_sync.floor(live), end))
            confirmed = max(confirmed, in_sync.confirm(live, end))
            offered = in_sync.caught_up(live)
            for replica in offered | in_sync.others:
                assert held[replica] >= acknowledged, (seed, step, replica)
            if offered and rng.random() < 0.5:
                members = in_sync.others | offered | {0}
                in_sync.change(members, 0, live, now_ms)
                if rng.random() < 0.3:  # the CAS was lost: back to the set before
                    in_sync.change(members - offered, 0, live, now_ms)
            late = in_sync.lagging(live, end, 200, now_ms)
            if late:  # shrunk (after its CAS): acks no longer wait for them
                in_sync.change(in_sync.others - late | {0}, 0, live, now_ms)
        assert acknowledged > 1_000  # the run did acknowledge (the check was not vacuous)


async def _append_until(
    group: Group, rng: random.Random, done: asyncio.Event, acked_ends: list[int]
) -> None:
    """Steady load: one put pass after another, each asking for the group's acknowledgement;
    `done` once caught_up(), asked right after a pass (confirm = the log end then, so the old
    acked >= confirm rule never holds), offers slave 1."""
    i = 0
    while not done.is_set():
        end = put_traffic(group.master_store, rng, 1, first=i)[-1]
        i += 1

        def answer(code: int, end: int = end) -> None:
            if code == ResponseCode.SUCCESS:
                acked_ends.append(end)

        group.master.on_acked(end, answer)
        if 1 in group.master.caught_up():
            assert max(acked_ends, default=0) <= group.acked(1)  # it has all acknowledged
            done.set()
        await asyncio.sleep(0.002)


async def test_a_slave_outside_the_set_joins_under_steady_appends(tmp_path: Path) -> None:
    async with running_group(tmp_path) as group:
        await group.slaves[2].stop()
        group.master.set_sync_set(frozenset({0}), 0)
        done = asyncio.Event()
        acked_ends: list[int] = []
        appender = asyncio.create_task(_append_until(group, random.Random(26), done, acked_ends))
        try:
            await asyncio.wait_for(done.wait(), 10)
        finally:
            done.set()
            await appender
        assert acked_ends  # acks went on while it joined
        group.master.set_sync_set(frozenset({0, 1}), 0)  # the controller CASed it in
        assert group.master.caught_up() == frozenset()
        end = put_traffic(group.master_store, random.Random(27), 3, first=10_000)[-1]
        codes: list[int] = []
        group.master.on_acked(end, codes.append)
        await group.all_acked(1)
        await eventually(lambda: codes == [ResponseCode.SUCCESS], what="acked by member 1")


async def test_a_joiner_that_stops_no_longer_holds_acks(tmp_path: Path) -> None:
    """Released when its link goes, not at the next report."""
    async with running_group(tmp_path, quiet=True) as group:
        put_traffic(group.master_store, random.Random(28), 5)
        await group.all_acked(1, 2)
        group.master.set_sync_set(frozenset({0}), 0)
        group.master.lagging(60_000)  # no drop by time in this test
        in_sync = group.master._in_sync
        assert in_sync is not None
        assert set(in_sync.joining) == {1, 2}
        link = group.slaves[2]._link
        assert link is not None
        assert link.transport is not None
        link.transport.pause_reading()  # slave 2 stops reporting
        end = put_traffic(group.master_store, random.Random(29), 5, first=100)[-1]
        codes: list[int] = []
        group.master.on_acked(end, codes.append)
        await group.all_acked(1)
        assert codes == []  # joiner 2 holds it
        await group.slaves[2].stop()
        await eventually(lambda: codes == [ResponseCode.SUCCESS], 3, what="released without 2")
        assert set(in_sync.joining) == {1}


async def test_a_joiner_silent_past_the_lagging_time_is_dropped(tmp_path: Path) -> None:
    """No report, no append: the master's own timer ends the join."""
    async with running_group(tmp_path, quiet=True) as group:
        await group.slaves[1].stop()
        await eventually(lambda: len(group.master.slaves()) == 1, what="slave 1 gone")
        link = group.slaves[2]._link
        assert link is not None
        assert link.transport is not None
        link.transport.pause_reading()  # slave 2 stops reporting
        end = put_traffic(group.master_store, random.Random(30), 5)[-1]
        group.master.set_sync_set(frozenset({0}), 0)
        codes: list[int] = []
        group.master.on_acked(end, codes.append)
        assert codes == []  # joiner 2 holds it
        group.master.lagging(200)
        await eventually(lambda: codes == [ResponseCode.SUCCESS], 2, what="released by time")
        assert group.master.caught_up() == frozenset()
