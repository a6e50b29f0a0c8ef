"""A real HAMaster and HASlave over loopback copy a real store's log byte for byte.

Stores sit in tmp_path on 64 KiB segments, so every run crosses many rollovers and blank
markers; the traffic is random (batches, single sends, transaction records) and seeded.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from ha_harness import (
    CLOCK,
    SECRET,
    assert_same_log,
    assert_same_queues,
    caught_up,
    open_store,
    put_traffic,
    running_pair,
    settings,
)

from tidemq.broker.ha import HAMaster, HASlave
from tidemq.protocol import ha
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", [1, 2])
async def test_history_then_live_traffic_are_copied_byte_for_byte(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    async with running_pair(tmp_path, follow=False) as pair:
        put_traffic(pair.master_store, rng, 150)  # history before the slave comes
        assert pair.master_store.max_physical_offset > 4 * 64 * 1024
        pair.slave.set_master(pair.address)
        for _ in range(20):  # live traffic while it catches up and after
            put_traffic(pair.master_store, rng, rng.randint(1, 15))
            await asyncio.sleep(rng.choice([0, 0, 0.005]))
        await caught_up(pair.master_store, pair.slave_store)
        assert_same_log(pair.master_store, pair.slave_store)
        assert_same_queues(pair.master_store, pair.slave_store)
        end = pair.master_store.max_physical_offset
        await eventually(lambda: pair.master.acked_offset == end, what="the slave's last report")
        (info,) = pair.master.slaves()
        assert (info.broker_id, info.acked_offset, info.lag_bytes, info.lag_ms) == (1, end, 0, 0)
        state = pair.slave.state()
        assert state.connected
        assert state.replica_offset == state.master_max == pair.master_store.max_physical_offset
        assert state.refused_reason is None
        assert state.last_frame_ms > 0


async def test_keys_are_found_on_the_slave(tmp_path: Path) -> None:
    rng = random.Random(5)
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, rng, 60)
        await caught_up(pair.master_store, pair.slave_store)
        for i in range(0, 60, 7):
            args = ("A", f"k{i}", 10, 0, 2**62)
            assert pair.slave_store.query_by_key(*args) == pair.master_store.query_by_key(*args)


async def test_a_restarted_slave_resumes_from_its_own_end(tmp_path: Path) -> None:
    rng = random.Random(3)
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, rng, 80)
        await caught_up(pair.master_store, pair.slave_store)
        await pair.slave.stop()
        pair.slave_store.shutdown()
        slave_end = pair.slave_store.max_physical_offset
        put_traffic(pair.master_store, rng, 80)  # while the slave is down

        slave_store = pair.slave_store = open_store(tmp_path / "slave", replica=True)
        assert slave_store.max_physical_offset == slave_end
        appended_at: list[int] = []
        append = slave_store.append_replica

        def spy(offset: int, data: bytes | memoryview) -> int:
            appended_at.append(offset)
            return append(offset, data)

        slave_store.append_replica = spy  # type: ignore[method-assign]
        pair.slave = HASlave(slave_store, settings(), CLOCK)
        pair.slave.set_master(pair.address)
        await caught_up(pair.master_store, slave_store)
        assert appended_at[0] == slave_end  # nothing sent again
        assert_same_log(pair.master_store, slave_store)
        assert_same_queues(pair.master_store, slave_store)


async def test_a_slave_follows_a_restarted_master(tmp_path: Path) -> None:
    rng = random.Random(4)
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, rng, 40)
        await caught_up(pair.master_store, pair.slave_store)
        port = pair.master.port
        await pair.master.stop()
        await eventually(lambda: not pair.slave.state().connected)
        put_traffic(pair.master_store, rng, 40)
        pair.master = HAMaster(pair.master_store, settings(listen_port=port), CLOCK)
        await pair.master.start()  # the slave's back-off finds it again
        await caught_up(pair.master_store, pair.slave_store)
        assert_same_log(pair.master_store, pair.slave_store)


async def test_a_master_killed_mid_frame_leaves_a_valid_prefix(tmp_path: Path) -> None:
    """A fake master sends half a frame and closes: the slave keeps the whole records of the
    half, restarts onto them, and the real master then completes the copy."""
    rng = random.Random(6)
    source = open_store(tmp_path / "master")
    put_traffic(source, rng, 40)
    frame_size = 30_000
    data = source.read_replica(0, frame_size)
    assert len(data) == frame_size

    async def half_a_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = ha.MasterSession(SECRET, bytes(16))
        writer.write(session.data_to_send())
        for event in session.receive(await reader.readexactly(ha.AUTH.size)):
            assert isinstance(event, ha.AuthReceived)
            session.send_verdict(ha.VerdictStatus.OK, 0, source.max_physical_offset)
        writer.write(session.data_to_send())
        writer.write(ha.encode_frame_header(0, frame_size) + data[: frame_size // 2])
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(half_a_frame, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    slave_store = open_store(tmp_path / "slave", replica=True)
    slave = HASlave(slave_store, settings(), CLOCK)
    slave.set_master(f"127.0.0.1:{port}")
    await eventually(lambda: slave_store.max_physical_offset > 0, what="a prefix appended")
    await slave.stop()
    server.close()
    await server.wait_closed()
    prefix = slave_store.max_physical_offset
    assert 0 < prefix <= frame_size // 2
    assert slave_store.read_replica(0, prefix) == data[:prefix]
    slave_store.shutdown()

    slave_store = open_store(tmp_path / "slave", replica=True)  # recovery keeps the prefix
    assert slave_store.max_physical_offset == prefix
    master = HAMaster(source, settings(), CLOCK)
    await master.start()
    slave = HASlave(slave_store, settings(), CLOCK)
    slave.set_master(f"127.0.0.1:{master.port}")
    try:
        await caught_up(source, slave_store)
        assert_same_log(source, slave_store)
        assert_same_queues(source, slave_store)
    finally:
        await slave.stop()
        await master.stop()
        slave_store.shutdown()
        source.shutdown()


async def test_stop_leaves_no_task_and_no_connection(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, random.Random(8), 30)
        await caught_up(pair.master_store, pair.slave_store)
        assert len(asyncio.all_tasks()) > len(before)
    assert asyncio.all_tasks() == before
    assert pair.master.slaves() == []
    assert not pair.slave.state().connected


async def test_set_master_none_disconnects_and_a_new_address_reconnects(tmp_path: Path) -> None:
    rng = random.Random(9)
    async with running_pair(tmp_path) as pair:
        await eventually(lambda: pair.slave.state().connected)
        pair.slave.set_master(None)
        await eventually(lambda: pair.master.slaves() == [], what="the master sees it go")
        assert pair.slave.state().master_addr is None
        assert not pair.slave.state().connected
        put_traffic(pair.master_store, rng, 20)
        pair.slave.set_master(pair.address)  # a new address skips the back-off
        await caught_up(pair.master_store, pair.slave_store)
        assert_same_log(pair.master_store, pair.slave_store)
