"""What the HA master and slave refuse or drop: a wrong secret, a slave ahead of or diverged
from its master, silent peers, reports that go back or beyond what was sent, raw garbage."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest
from ha_harness import (
    CLOCK,
    SECRET,
    caught_up,
    log_files,
    open_store,
    put_traffic,
    raw_slave,
    running_pair,
    settings,
)

from tidemq.broker.ha import HAMaster, HASlave
from tidemq.broker.ha import master as master_module
from tidemq.broker.ha.master import (
    HANDSHAKE_TIMEOUT_MS,
    PENDING_CONNECTIONS_MAX,
    handshake_timeout_ms,
)
from tidemq.protocol import ha
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration


async def _eof(reader: asyncio.StreamReader) -> bytes:
    """What the peer still sends before it closes (it must close within the test's timeout)."""
    return await asyncio.wait_for(reader.read(), 10)


async def test_a_slave_with_another_secret_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_pair(tmp_path, slave_settings=settings(secret=b"not the secret")) as pair:
        put_traffic(pair.master_store, random.Random(1), 10)
        await eventually(lambda: pair.slave.state().refused_reason is not None)
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("BAD_SECRET")
        assert pair.master.slaves() == []
        assert pair.slave_store.max_physical_offset == 0
        assert not pair.slave.state().connected
    assert any(
        "BAD_SECRET" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records
    )
    assert any("refused: BAD_SECRET" in r.getMessage() for r in caplog.records)  # the master's


async def test_an_unauthenticated_peer_gets_the_hello_a_bare_status_and_a_close(
    tmp_path: Path,
) -> None:
    async with running_pair(tmp_path, follow=False) as pair:
        put_traffic(pair.master_store, random.Random(2), 10)
        peer = await raw_slave(pair.master.port, secret=b"a guess")
        assert peer.verdict == ha.Verdict(ha.VerdictStatus.BAD_SECRET, bytes(32), 0, 0)
        assert await _eof(peer.reader) == b""  # no frame, no offset
        await peer.close()
        # Garbage instead of an AUTH: the HELLO, then a close without a verdict.
        reader, writer = await asyncio.open_connection("127.0.0.1", pair.master.port)
        assert len(await reader.readexactly(ha.HELLO.size)) == ha.HELLO.size
        writer.write(b"GET / HTTP/1.1\r\n" * 5)
        assert await _eof(reader) == b""
        writer.close()
        assert pair.master.slaves() == []


async def test_a_peer_that_never_authenticates_is_dropped(tmp_path: Path) -> None:
    quick = settings(heartbeat_interval_ms=50, housekeeping_interval_ms=300)
    async with running_pair(tmp_path, master_settings=quick, follow=False) as pair:
        reader, writer = await asyncio.open_connection("127.0.0.1", pair.master.port)
        assert len(await _eof(reader)) == ha.HELLO.size
        writer.close()


async def test_a_slave_ahead_of_its_master_is_refused(tmp_path: Path) -> None:
    rng = random.Random(3)
    ahead = open_store(tmp_path / "slave")  # written before it became a slave
    put_traffic(ahead, rng, 30)
    ahead.shutdown()
    async with running_pair(tmp_path, follow=False) as pair:
        put_traffic(pair.master_store, rng, 5)
        before = log_files(pair.slave_store)
        assert pair.slave_store.max_physical_offset > pair.master_store.max_physical_offset
        pair.slave.set_master(pair.address)
        await eventually(lambda: pair.slave.state().refused_reason is not None)
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("AHEAD")
        assert pair.slave.state().master_max == pair.master_store.max_physical_offset
        assert log_files(pair.slave_store) == before  # never truncated


async def test_a_diverged_slave_is_refused(tmp_path: Path) -> None:
    rng = random.Random(4)
    other = open_store(tmp_path / "slave")  # another history, shorter than the master's
    put_traffic(other, rng, 5)
    other.shutdown()
    async with running_pair(tmp_path, follow=False) as pair:
        put_traffic(pair.master_store, rng, 40)
        assert 0 < pair.slave_store.max_physical_offset < pair.master_store.max_physical_offset
        pair.slave.set_master(pair.address)
        await eventually(lambda: pair.slave.state().refused_reason is not None)
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("DIVERGED")
        assert pair.master.slaves() == []


async def test_a_slave_behind_the_masters_retention_is_refused(tmp_path: Path) -> None:
    """The master's first segment is gone; a slave that ends inside it cannot continue."""
    rng = random.Random(5)
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, rng, 20)
        await caught_up(pair.master_store, pair.slave_store)
        await pair.slave.stop()
        while pair.master_store.max_physical_offset < 4 * 64 * 1024:
            put_traffic(pair.master_store, rng, 20)
        assert pair.master_store.clean_expired_files(CLOCK.now_ms() + 10**12, force=True) > 0
        assert pair.master_store.min_physical_offset > pair.slave_store.max_physical_offset
        pair.slave = HASlave(pair.slave_store, settings(), CLOCK)
        pair.slave.set_master(pair.address)
        await eventually(lambda: pair.slave.state().refused_reason is not None)
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("BEHIND_RETENTION")


async def test_an_empty_slave_gets_the_whole_retained_history(tmp_path: Path) -> None:
    rng = random.Random(6)
    async with running_pair(tmp_path, follow=False) as pair:
        while pair.master_store.max_physical_offset < 4 * 64 * 1024:
            put_traffic(pair.master_store, rng, 20)
        assert pair.master_store.clean_expired_files(CLOCK.now_ms() + 10**12, force=True) > 0
        first = pair.master_store.min_physical_offset
        assert first > 0
        pair.slave.set_master(pair.address)
        await caught_up(pair.master_store, pair.slave_store)
        assert pair.slave_store.min_physical_offset == first
        assert log_files(pair.slave_store) == log_files(pair.master_store)


async def test_reports_below_an_earlier_one_or_beyond_the_end_drop_the_slave(
    tmp_path: Path,
) -> None:
    async with running_pair(tmp_path, follow=False) as pair:
        end = put_traffic(pair.master_store, random.Random(7), 10)[-1]
        peer = await raw_slave(pair.master.port)
        assert peer.verdict.status is ha.VerdictStatus.OK
        assert (peer.verdict.start_offset, peer.verdict.master_max) == (0, end)
        await eventually(lambda: len(pair.master.slaves()) == 1)
        peer.writer.write(ha.encode_report(end + 1))  # a fake acknowledgement
        await eventually(lambda: pair.master.slaves() == [], what="the liar dropped")
        await peer.close()

        peer = await raw_slave(pair.master.port)
        await eventually(lambda: pair.master.acked_offset == 0 and bool(pair.master.slaves()))
        payload = await peer.reader.readexactly(ha.FRAME_HEADER.size + 100)
        assert ha.FRAME_HEADER.unpack(payload[: ha.FRAME_HEADER.size])[0] == 0
        peer.writer.write(ha.encode_report(100) + ha.encode_report(50))
        await eventually(lambda: pair.master.slaves() == [], what="the slave going back dropped")
        await peer.close()


async def test_a_silent_slave_is_dropped(tmp_path: Path) -> None:
    quick = settings(heartbeat_interval_ms=50, housekeeping_interval_ms=300)
    async with running_pair(tmp_path, master_settings=quick, follow=False) as pair:
        peer = await raw_slave(pair.master.port)
        await eventually(lambda: len(pair.master.slaves()) == 1)
        frames = await _eof(peer.reader)  # heartbeats only, then the close
        assert frames
        assert len(frames) % ha.FRAME_HEADER.size == 0
        assert all(size == 0 for _, size in ha.FRAME_HEADER.iter_unpack(frames))
        assert pair.master.slaves() == []
        await peer.close()


async def test_a_silent_master_is_dropped_and_the_slave_reconnects(tmp_path: Path) -> None:
    connections: list[asyncio.StreamWriter] = []

    async def mute_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        session = ha.MasterSession(SECRET, bytes(16))
        writer.write(session.data_to_send())
        session.receive(await reader.readexactly(ha.AUTH.size))
        session.send_verdict(ha.VerdictStatus.OK, 0, 0)
        writer.write(session.data_to_send())
        await reader.read()  # then nothing, not even heartbeats

    server = await asyncio.start_server(mute_master, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = open_store(tmp_path / "slave", replica=True)
    slave = HASlave(store, settings(heartbeat_interval_ms=50, housekeeping_interval_ms=300), CLOCK)
    slave.set_master(f"127.0.0.1:{port}")
    try:
        await eventually(lambda: slave.state().connected)
        await eventually(lambda: len(connections) == 2, what="a second connection")
    finally:
        await slave.stop()
        server.close()
        for writer in connections:
            writer.close()
        await server.wait_closed()
        store.shutdown()


async def test_a_newcomer_past_the_pending_limit_evicts_the_oldest_handshake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle sockets filling the pending set cannot lock the slave out: it evicts the oldest."""
    monkeypatch.setattr(master_module, "HANDSHAKE_TIMEOUT_MS", 60_000)  # no timeout meanwhile
    slow = settings(housekeeping_interval_ms=60_000)
    async with running_pair(tmp_path, master_settings=slow, follow=False) as pair:
        idle = [
            await asyncio.open_connection("127.0.0.1", pair.master.port)
            for _ in range(PENDING_CONNECTIONS_MAX)
        ]
        for reader, _ in idle:
            await reader.readexactly(ha.HELLO.size)
        put_traffic(pair.master_store, random.Random(10), 5)
        pair.slave.set_master(pair.address)
        await caught_up(pair.master_store, pair.slave_store, timeout_s=10)
        assert len(pair.master.slaves()) == 1
        assert await _eof(idle[0][0]) == b""  # the oldest idle socket made room
        pending = [link for link in pair.master._links if not link.streaming]
        assert len(pending) == PENDING_CONNECTIONS_MAX - 1  # the others still wait
        for _, writer in idle:
            writer.close()


async def test_a_handshake_gets_seconds_not_the_housekeeping_interval(tmp_path: Path) -> None:
    slow = settings(housekeeping_interval_ms=60_000)
    async with running_pair(tmp_path, master_settings=slow, follow=False) as pair:
        assert handshake_timeout_ms(pair.master.settings) == HANDSHAKE_TIMEOUT_MS <= 3_000
        reader, writer = await asyncio.open_connection("127.0.0.1", pair.master.port)
        # The HELLO, then the close at HANDSHAKE_TIMEOUT_MS (well before the 60 s interval).
        assert len(await asyncio.wait_for(reader.read(), 20)) == ha.HELLO.size
        writer.close()


async def test_master_stop_closes_pending_handshakes(tmp_path: Path) -> None:
    store = open_store(tmp_path / "master")
    master = HAMaster(store, settings(), CLOCK)
    await master.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
    await reader.readexactly(ha.HELLO.size)
    await master.stop()
    assert await _eof(reader) == b""
    writer.close()
    store.shutdown()


async def test_the_window_bounds_what_an_unacknowledging_slave_is_sent(tmp_path: Path) -> None:
    async with running_pair(tmp_path, follow=False) as pair:
        await pair.master.stop()  # one whose window is 4 MiB + a 64 KiB message's record
        pair.master = HAMaster(pair.master_store, settings(), CLOCK, message_size_max=64 * 1024)
        await pair.master.start()
        window = pair.master.window
        assert window < 4.2 * 1024 * 1024
        rng = random.Random(9)
        while pair.master_store.max_physical_offset < window + 100_000:
            put_traffic(pair.master_store, rng, 50)
        peer = await raw_slave(pair.master.port)  # reads, never reports
        received = 0
        while received < window:
            offset, size = ha.FRAME_HEADER.unpack(
                await peer.reader.readexactly(ha.FRAME_HEADER.size)
            )
            assert offset == received
            await peer.reader.readexactly(size)
            received += size
        assert received == window < pair.master_store.max_physical_offset
        header = await peer.reader.readexactly(ha.FRAME_HEADER.size)
        assert ha.FRAME_HEADER.unpack(header) == (window, 0)  # a heartbeat: the window is full
        peer.writer.write(ha.encode_report(1000))  # the window moves by 1000 bytes
        header = await peer.reader.readexactly(ha.FRAME_HEADER.size)
        assert ha.FRAME_HEADER.unpack(header) == (window, 1000)
        await peer.close()
