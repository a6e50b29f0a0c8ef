"""Requests of one read start in growing slices, one slice per loop iteration, in order; reading
resumes once all have started (remoting/connection.py, TURN_BUDGET)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode
from tidemq.remoting import (
    TURN_BUDGET,
    Connection,
    HandlerTable,
    RemotingClient,
    RemotingServer,
)
from tidemq.testing import eventually

STAMP = 1100
REQUESTS = 200  # one write of ~6 KiB: a single read on loopback


class Ticker:
    """Counts event-loop iterations: a callback that reschedules itself once per iteration."""

    def __init__(self) -> None:
        self.tick = 0
        self._running = True
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        if self._running:
            self.tick += 1
            asyncio.get_running_loop().call_soon(self._step)

    def stop(self) -> None:
        self._running = False


class Stamper:
    """A handler that notes the iteration each request started in, by opaque."""

    def __init__(self, ticker: Ticker) -> None:
        self.ticker = ticker
        self.started: list[tuple[int, int]] = []

    def table(self) -> HandlerTable:
        table = HandlerTable()
        table.register(STAMP, self.stamp)
        return table

    async def stamp(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.started.append((cmd.opaque, self.ticker.tick))
        return cmd.response(ResponseCode.SUCCESS)


@pytest.fixture
async def ticker() -> AsyncIterator[Ticker]:
    ticker = Ticker()
    yield ticker
    ticker.stop()


def slice_sizes(started: list[tuple[int, int]]) -> list[int]:
    sizes: dict[int, int] = {}
    for _, tick in started:
        sizes[tick] = sizes.get(tick, 0) + 1
    return [sizes[tick] for tick in sorted(sizes)]


async def serve_one_burst(
    stamper: Stamper, turn_budget: int | None, count: int = REQUESTS, body: bytes = b""
) -> list[int]:
    """Send `count` requests in one write on a raw socket; return the answers' opaques."""
    server = RemotingServer(stamper.table(), "127.0.0.1", 0, name="turns", turn_budget=turn_budget)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"".join(encode(RemotingCommand(code=STAMP, opaque=i, body=body)) for i in range(count))
        )
        await writer.drain()
        decoder = FrameDecoder()
        answered: list[int] = []
        while len(answered) < count:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "server closed the connection"
            answered += [frame.opaque for frame in decoder.feed(data)]
        # Reading resumed after the burst: one more request is served.
        writer.write(encode(RemotingCommand(code=STAMP, opaque=count)))
        frames: list[RemotingCommand] = []
        while not frames:
            frames = decoder.feed(await asyncio.wait_for(reader.read(65536), 5))
        assert [frame.opaque for frame in frames] == [count]
        writer.close()
        await writer.wait_closed()
        return answered
    finally:
        await server.stop()


async def test_a_burst_starts_in_growing_slices_in_order(ticker: Ticker) -> None:
    stamper = Stamper(ticker)
    answered = await serve_one_burst(stamper, TURN_BUDGET)
    assert sorted(answered) == list(range(REQUESTS))
    assert [opaque for opaque, _ in stamper.started] == list(range(REQUESTS + 1))
    burst = stamper.started[:REQUESTS]
    sizes = slice_sizes(burst)
    # 16, 32, 64, then the remaining 88: each slice in an iteration of its own.
    expected = [TURN_BUDGET * 2**k for k in range(3)]
    assert sizes == [*expected, REQUESTS - sum(expected)]
    ticks = [tick for _, tick in burst]
    assert ticks == sorted(ticks)


async def test_no_limit_starts_a_whole_read_at_once(ticker: Ticker) -> None:
    stamper = Stamper(ticker)
    answered = await serve_one_burst(stamper, None)
    assert sorted(answered) == list(range(REQUESTS))
    assert slice_sizes(stamper.started[:REQUESTS]) == [REQUESTS]


async def test_client_side_backlog_of_server_requests_drains(ticker: Ticker) -> None:
    """The client end of a connection (it reads even while its writes are paused) also starts
    a burst of the server's requests in slices, and reads again afterwards."""
    stamper = Stamper(ticker)
    seen: list[Connection] = []
    server = RemotingServer(HandlerTable(), "127.0.0.1", 0, name="turns-server")
    server.add_connection_listener(on_open=seen.append)
    await server.start()
    client = RemotingClient(stamper.table())
    try:
        await client.connection(f"127.0.0.1:{server.port}")
        await eventually(lambda: len(seen) == 1, what="server saw the client")
        server_side = seen[0]
        for _ in range(REQUESTS):
            await server_side.oneway(RemotingCommand(code=STAMP, flag=FLAG_ONEWAY))
        await eventually(lambda: len(stamper.started) == REQUESTS, what="all requests started")
        opaques = [opaque for opaque, _ in stamper.started]
        assert opaques == sorted(opaques)
        assert max(slice_sizes(stamper.started)) < REQUESTS
        await server_side.oneway(RemotingCommand(code=STAMP, flag=FLAG_ONEWAY))
        await eventually(lambda: len(stamper.started) == REQUESTS + 1, what="read resumed")
    finally:
        await client.close()
        await server.stop()


async def test_bodies_count_against_the_budget(ticker: Ticker) -> None:
    """8 KiB bodies cost 5 each: at most 4 start in the first iteration instead of 16."""
    stamper = Stamper(ticker)
    answered = await serve_one_burst(stamper, TURN_BUDGET, count=24, body=b"b" * 8192)
    assert sorted(answered) == list(range(24))
    assert [opaque for opaque, _ in stamper.started] == list(range(25))
    assert 1 <= slice_sizes(stamper.started[:24])[0] <= 4


async def test_a_body_over_the_budget_still_starts(ticker: Ticker) -> None:
    """A request worth more than a whole budget starts alone, one per iteration at first."""
    stamper = Stamper(ticker)
    answered = await serve_one_burst(stamper, TURN_BUDGET, count=4, body=b"b" * 65536)
    assert sorted(answered) == list(range(4))
    assert slice_sizes(stamper.started[:4])[0] == 1
