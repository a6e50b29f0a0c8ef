"""The slave's reconnect pace: a connection that breaks right after its OK verdict keeps backing
off (no 2 Hz storm), bytes the store refuses are a refusal at the slow pace with the cause in
`refused_reason`, and a healthy connection restarts the back-off at its minimum."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from ha_harness import CLOCK, SECRET, caught_up, open_store, put_traffic, running_pair, settings

from tidemq.broker.ha import HASlave
from tidemq.broker.ha import slave as slave_module
from tidemq.broker.ha.slave import BACKOFF_S_MAX, BACKOFF_S_MIN, REFUSED_RETRY_S
from tidemq.protocol import ha
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration

RETRIES = 6


class Delays:
    """Stands in for the slave's reconnect wait: records each delay, waits a few ms instead."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    async def wait_woken(self, wake: asyncio.Event, timeout_s: float) -> None:
        self.seen.append(timeout_s)
        await asyncio.sleep(0.01)


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> Delays:
    recorder = Delays()
    monkeypatch.setattr(slave_module, "wait_woken", recorder.wait_woken)
    return recorder


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def fake_master(handler: Handler) -> AsyncIterator[str]:
    """A hand-written master on loopback; yields its address."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def _verdict_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    session = ha.MasterSession(SECRET, bytes(16))
    writer.write(session.data_to_send())
    session.receive(await reader.readexactly(ha.AUTH.size))
    session.send_verdict(ha.VerdictStatus.OK, 0, 0)
    writer.write(session.data_to_send())
    await writer.drain()


async def test_a_link_that_breaks_right_after_the_verdict_keeps_backing_off(
    tmp_path: Path, delays: Delays
) -> None:
    async def verdict_then_close(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _verdict_ok(reader, w)
        w.close()

    store = open_store(tmp_path / "slave", replica=True)
    slave = HASlave(store, settings(), CLOCK)
    try:
        async with fake_master(verdict_then_close) as addr:
            slave.set_master(addr)
            await eventually(lambda: len(delays.seen) >= RETRIES, what="retries")
    finally:
        await slave.stop()
        store.shutdown()
    want = [min(BACKOFF_S_MIN * 2**i, BACKOFF_S_MAX) for i in range(RETRIES)]
    assert delays.seen[:RETRIES] == want  # 0.5, 1, 2, 4, 5, 5: not 0.5 for ever
    assert slave.state().refused_reason is None  # a broken link, not a refusal


async def test_a_link_that_lasts_a_heartbeat_restarts_the_back_off(
    tmp_path: Path, delays: Delays
) -> None:
    async def verdict_then_mute(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _verdict_ok(reader, w)
        await reader.read()  # no frame: the slave drops it after housekeeping_interval_ms

    store = open_store(tmp_path / "slave", replica=True)
    quick = settings(heartbeat_interval_ms=50, housekeeping_interval_ms=200)
    slave = HASlave(store, quick, CLOCK)
    try:
        async with fake_master(verdict_then_mute) as addr:
            slave.set_master(addr)
            await eventually(lambda: len(delays.seen) >= 3, what="retries")
    finally:
        await slave.stop()
        store.shutdown()
    assert delays.seen[:3] == [BACKOFF_S_MIN] * 3


async def test_bytes_the_store_refuses_are_a_refusal_at_the_slow_pace(
    tmp_path: Path, delays: Delays, caplog: pytest.LogCaptureFixture
) -> None:
    """Master and slave with different mappedFileSizeCommitLog: the master's blank marker does
    not end the slave's segment, every retry stops there."""
    caplog.set_level(logging.WARNING)
    async with running_pair(tmp_path, follow=False) as pair:
        await pair.slave.stop()
        pair.slave_store.shutdown()
        pair.slave_store = open_store(
            tmp_path / "big", replica=True, commit_log_file_size=128 << 10
        )
        pair.slave = HASlave(pair.slave_store, settings(), CLOCK)
        rng = random.Random(21)
        while pair.master_store.max_physical_offset < 70 << 10:  # past the first segment
            put_traffic(pair.master_store, rng, 20)
        pair.slave.set_master(pair.address)
        await eventually(lambda: len(delays.seen) >= 4, what="retries")
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("ReplicaCorruptError: ")
        assert "mappedFileSizeCommitLog" in reason
        assert delays.seen[:4] == [REFUSED_RETRY_S] * 4
        assert 0 < pair.slave_store.max_physical_offset < 64 << 10  # the valid prefix
    lines = [r for r in caplog.records if "stream refused" in r.getMessage()]
    assert len(lines) == 1  # one line says what to check, not one per retry
    assert lines[0].levelno == logging.ERROR


async def test_a_healthy_link_clears_a_stream_refusal(tmp_path: Path) -> None:
    async with running_pair(tmp_path) as pair:
        put_traffic(pair.master_store, random.Random(22), 10)
        await caught_up(pair.master_store, pair.slave_store)
        pair.slave.refused_reason = "ReplicaCorruptError: a past fault"
        pair.slave._stream_fault = True
        put_traffic(pair.master_store, random.Random(23), 3)  # appended: the fault is over
        await eventually(lambda: pair.slave.state().refused_reason is None)
        assert pair.slave.state().connected


async def test_a_stream_that_does_not_continue_the_log_is_a_refusal(
    tmp_path: Path, delays: Delays
) -> None:
    """An empty slave with 128 KiB segments, a master whose first retained 64 KiB segment
    starts at an odd multiple of 64 KiB: no segment of the slave can start there."""
    rng = random.Random(24)
    async with running_pair(tmp_path, follow=False) as pair:
        await pair.slave.stop()
        pair.slave_store.shutdown()
        pair.slave_store = open_store(
            tmp_path / "big", replica=True, commit_log_file_size=128 << 10
        )
        pair.slave = HASlave(pair.slave_store, settings(), CLOCK)
        store = pair.master_store
        while store.min_physical_offset == 0 or store.min_physical_offset // (64 << 10) % 2 == 0:
            put_traffic(store, rng, 20)
            store.clean_expired_files(CLOCK.now_ms() + 10**12, force=True)
        pair.slave.set_master(pair.address)
        await eventually(lambda: len(delays.seen) >= 2, what="retries")
        reason = pair.slave.state().refused_reason
        assert reason is not None
        assert reason.startswith("ReplicaOffsetError: ")
        assert "mappedFileSizeCommitLog" in reason
        assert delays.seen[:2] == [REFUSED_RETRY_S] * 2
        assert pair.slave_store.max_physical_offset == 0
