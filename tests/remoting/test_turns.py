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
from tidemq.remoting import turns as turns_module
from tidemq.testing import eventually

STAMP = 1100
REQUESTS = 200  # one write of ~24 KiB: a single read on loopback


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


def burst(first: int, count: int, body: bytes = b"") -> bytes:
    """`count` STAMP requests, opaques from `first`, as one write."""
    return b"".join(
        encode(RemotingCommand(code=STAMP, opaque=first + i, body=body)) for i in range(count)
    )


async def read_answers(
    reader: asyncio.StreamReader, decoder: FrameDecoder, count: int
) -> list[int]:
    answered: list[int] = []
    while len(answered) < count:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "server closed the connection"
        answered += [frame.opaque for frame in decoder.feed(data)]
    return answered


async def serve_one_burst(
    stamper: Stamper,
    turn_budget: int | None,
    count: int = REQUESTS,
    body: bytes = b"",
    bursts: int = 1,
) -> list[int]:
    """Send `bursts` times `count` requests, each burst in one write once the one before is
    answered, on a raw socket; then one more request. Returns the bursts' answers' opaques."""
    server = RemotingServer(stamper.table(), "127.0.0.1", 0, name="turns", turn_budget=turn_budget)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        decoder = FrameDecoder()
        answered: list[int] = []
        for index in range(bursts):
            writer.write(burst(index * count, count, body))
            answered += await read_answers(reader, decoder, count)
        # Reading resumed after the burst: one more request is served.
        writer.write(burst(bursts * count, 1))
        assert await read_answers(reader, decoder, 1) == [bursts * count]
        writer.close()
        await writer.wait_closed()
        return answered
    finally:
        await server.stop()


async def test_a_burst_starts_in_growing_slices_in_order(ticker: Ticker) -> None:
    stamper = Stamper(ticker)
    answered = await serve_one_burst(stamper, TURN_BUDGET, bursts=2)
    assert sorted(answered) == list(range(2 * REQUESTS))
    assert [opaque for opaque, _ in stamper.started] == list(range(2 * REQUESTS + 1))
    # 16, 32, 64, then the remaining 88: each slice in an iteration of its own. The second
    # burst starts from TURN_BUDGET again (the doubled limit is reset once a backlog drains).
    expected = [TURN_BUDGET * 2**k for k in range(3)]
    for index in range(2):
        started = stamper.started[index * REQUESTS : (index + 1) * REQUESTS]
        assert slice_sizes(started) == [*expected, REQUESTS - sum(expected)]


async def test_a_read_arriving_during_a_drain_waits_for_it(ticker: Ticker) -> None:
    """Reading stays paused while a backlog drains: a second burst, on the wire while the first
    one's backlog is being started, is read after it and starts in slices of its own."""
    writers: list[asyncio.StreamWriter] = []

    class Triggering(Stamper):
        async def stamp(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            if cmd.opaque == 0:  # the first slice of the first burst: its backlog is queued
                writers[0].write(burst(REQUESTS, REQUESTS))
            return await super().stamp(conn, cmd)

    stamper = Triggering(ticker)
    server = RemotingServer(stamper.table(), "127.0.0.1", 0, name="turns")
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writers.append(writer)
        writer.write(burst(0, REQUESTS))
        answered = await read_answers(reader, FrameDecoder(), 2 * REQUESTS)
        writer.close()
        await writer.wait_closed()
    finally:
        await server.stop()
    assert sorted(answered) == list(range(2 * REQUESTS))
    first, second = stamper.started[:REQUESTS], stamper.started[REQUESTS:]
    assert [opaque for opaque, _ in stamper.started] == list(range(2 * REQUESTS))
    assert max(tick for _, tick in first) <= min(tick for _, tick in second)
    expected = [TURN_BUDGET * 2**k for k in range(3)]
    assert slice_sizes(second) == [*expected, REQUESTS - sum(expected)]


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


async def test_reading_resumes_after_a_drain_that_left_the_buffer_over_its_cap(
    ticker: Ticker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last backlogged request's answer takes the write buffer over its cap while the
    transport is not paused (the cap lowered to 1 KiB here; at 8 MiB the kernel would have to
    take all but 64 KiB of it at once): reading must still resume once the buffer is written."""
    monkeypatch.setattr(turns_module, "WRITE_BUFFER_BYTES_MAX", 1024)
    big = b"b" * 2048

    class Sized(Stamper):
        async def stamp(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            self.started.append((cmd.opaque, self.ticker.tick))
            return cmd.response(
                ResponseCode.SUCCESS, body=big if cmd.opaque == TURN_BUDGET else b""
            )

    stamper = Sized(ticker)
    # TURN_BUDGET requests start at once; the one after them is the backlog, answered with 2 KiB.
    answered = await serve_one_burst(stamper, TURN_BUDGET, count=TURN_BUDGET + 1)
    assert sorted(answered) == list(range(TURN_BUDGET + 1))
