"""SYNC_MASTER acknowledgements: released by a real slave's reports, refused without one,
timed out behind a slave that stopped reading."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from ha_harness import caught_up, put_traffic, running_pair, settings

from tidemq.protocol.codes import ResponseCode
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration


async def test_waiters_are_released_by_the_slaves_reports(tmp_path: Path) -> None:
    rng = random.Random(11)
    async with running_pair(tmp_path) as pair:
        await eventually(lambda: bool(pair.master.slaves()), what="a slave streaming")
        codes: list[int] = []
        waiters = 0
        for _ in range(30):
            for end in put_traffic(pair.master_store, rng, rng.randint(1, 6)):
                pair.master.on_acked(end, codes.append)  # waiters released in groups
                waiters += 1
            await asyncio.sleep(rng.choice([0, 0.001]))
        end = pair.master_store.max_physical_offset
        assert await pair.master.wait_acked(end) == ResponseCode.SUCCESS
        assert len(codes) == waiters
        assert set(codes) == {ResponseCode.SUCCESS}
        assert pair.master.waiting == 0
        # Already acknowledged: answered at once.
        answered: list[int] = []
        pair.master.on_acked(1, answered.append)
        assert answered == [ResponseCode.SUCCESS]


async def test_without_a_slave_the_answer_is_slave_not_available(tmp_path: Path) -> None:
    async with running_pair(tmp_path, follow=False) as pair:
        end = put_traffic(pair.master_store, random.Random(1), 3)[-1]
        assert await pair.master.wait_acked(end) == ResponseCode.SLAVE_NOT_AVAILABLE
        assert pair.master.waiting == 0


async def test_a_slave_too_far_behind_is_not_available(tmp_path: Path) -> None:
    async with running_pair(tmp_path, master_settings=settings(max_gap_not_in_sync=1000)) as pair:
        await eventually(lambda: bool(pair.master.slaves()), what="a slave streaming")
        acked = pair.master.acked_offset
        end = put_traffic(pair.master_store, random.Random(2), 10)[-1]
        assert end - acked > 1000
        # At once: the slave cannot have reported yet (no await since the put).
        assert await pair.master.wait_acked(end) == ResponseCode.SLAVE_NOT_AVAILABLE
        await caught_up(pair.master_store, pair.slave_store)
        await eventually(lambda: pair.master.acked_offset == end, what="the slave's report")
        assert await pair.master.wait_acked(end) == ResponseCode.SUCCESS


async def test_a_paused_slave_times_the_wait_out(tmp_path: Path) -> None:
    rng = random.Random(12)
    async with running_pair(tmp_path, master_settings=settings(sync_timeout_ms=300)) as pair:
        put_traffic(pair.master_store, rng, 10)
        await caught_up(pair.master_store, pair.slave_store)
        link = pair.slave._link
        assert link is not None
        assert link.transport is not None
        link.transport.pause_reading()  # the slave stops reading: no more appends or acks
        end = put_traffic(pair.master_store, rng, 5)[-1]
        started = time.monotonic()
        assert await pair.master.wait_acked(end) == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert 0.25 <= time.monotonic() - started < 10  # 0.3 s, and a loaded box
        assert pair.master.waiting == 0
        link.transport.resume_reading()
        await caught_up(pair.master_store, pair.slave_store)
        assert await pair.master.wait_acked(end) == ResponseCode.SUCCESS


async def test_stop_answers_the_waiters_left(tmp_path: Path) -> None:
    codes: list[int] = []
    async with running_pair(tmp_path) as pair:
        await eventually(lambda: bool(pair.master.slaves()), what="a slave streaming")
        link = pair.slave._link
        assert link is not None
        assert link.transport is not None
        link.transport.pause_reading()
        end = put_traffic(pair.master_store, random.Random(3), 2)[-1]
        pair.master.on_acked(end, codes.append)
        assert pair.master.waiting == 1
        await pair.master.stop()
        assert codes == [ResponseCode.SLAVE_NOT_AVAILABLE]


async def test_a_dropped_slave_stops_counting_before_its_connection_is_lost(
    tmp_path: Path,
) -> None:
    """Between a link's drop and its connection_lost (a loop turn or more), a SYNC send must
    not wait on it: no slave streams, SLAVE_NOT_AVAILABLE at once."""
    async with running_pair(tmp_path) as pair:
        await eventually(lambda: bool(pair.master.slaves()), what="a slave streaming")
        (link,) = [link for link in pair.master._links if link.streaming]
        link.drop("dropped by the test")
        assert link in pair.master._links  # connection_lost has not run yet
        end = put_traffic(pair.master_store, random.Random(14), 3)[-1]
        answered: list[int] = []
        pair.master.on_acked(end, answered.append)
        assert answered == [ResponseCode.SLAVE_NOT_AVAILABLE]
        assert pair.master.slaves() == []
        assert pair.master.acked_offset == 0
        assert pair.master.waiting == 0


async def test_the_ack_round_trip_on_loopback(tmp_path: Path) -> None:
    """A measured figure, not a timed assertion: one put and its ack, over and over."""
    rng = random.Random(13)
    async with running_pair(tmp_path) as pair:
        await eventually(lambda: bool(pair.master.slaves()), what="a slave streaming")
        times = []
        for i in range(200):
            started = time.perf_counter()
            end = put_traffic(pair.master_store, rng, 1, first=i)[-1]
            assert await pair.master.wait_acked(end) == ResponseCode.SUCCESS
            times.append(time.perf_counter() - started)
        times.sort()
        print(f"put + SYNC ack: median {times[100] * 1e6:.0f} us, p99 {times[198] * 1e6:.0f} us")
        await asyncio.sleep(0)
