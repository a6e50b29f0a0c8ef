"""What incomplete frames may hold is bounded across a server's connections, and a frame that does
not complete in time closes its connection (issue 11, item 7).

Before the fix, 40 connections each announcing a ~16 MiB frame and sending 15 MiB of it took a
broker from 130 to 730 MB: the frame limit bounded one connection, nothing bounded them all, and
a stalled frame was held until the idle timeout (which a byte now and then defeats). Real
servers on loopback; limits scaled down (1 MiB frames, a 4 MiB bound) so the test moves little.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator

import pytest

from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import Connection, HandlerTable, RemotingClient, RemotingServer
from tidemq.testing import eventually

ECHO = 1
FRAME_SIZE_MAX = 1024 * 1024
BOUND = 4 * FRAME_SIZE_MAX
HOSTILE = 16
PARTIAL = 600 * 1024  # of each hostile frame: 16 of them hold 9.4 MiB, over twice the bound
TIMEOUT_MS = 300


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, body=cmd.body)


async def start_server(
    *,
    incomplete_frame_bytes_max: int = BOUND,
    frame_completion_timeout_ms: int = 30_000,
) -> RemotingServer:
    table = HandlerTable()
    table.register(ECHO, echo)
    server = RemotingServer(
        table,
        "127.0.0.1",
        0,
        name="frames",
        frame_size_max=FRAME_SIZE_MAX,
        incomplete_frame_bytes_max=incomplete_frame_bytes_max,
        frame_completion_timeout_ms=frame_completion_timeout_ms,
    )
    await server.start()
    return server


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    remoting = RemotingClient()
    yield remoting
    await remoting.close()


async def open_partial_frame(port: int, sent: int) -> socket.socket:
    """A raw connection that announced a maximal frame and sent `sent` bytes of it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, struct.pack(">I", FRAME_SIZE_MAX) + b"\0" * (sent - 4))
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed `sock` (EOF or reset); False while it is open."""
    try:
        data = sock.recv(1)
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return data == b""


async def test_incomplete_frames_are_bounded_across_connections(
    client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_server(incomplete_frame_bytes_max=BOUND)
    budget = server.frame_budget
    address = f"127.0.0.1:{server.port}"
    caplog.set_level(logging.WARNING, logger="tidemq.remoting")
    hostile: list[socket.socket] = []
    try:
        for _ in range(HOSTILE):
            hostile.append(await open_partial_frame(server.port, PARTIAL))
            assert budget.buffered_bytes <= BOUND

        # Settled: each hostile connection is closed, or the server holds all it sent.
        def still_open() -> list[socket.socket]:
            return [sock for sock in hostile if not closed_by_server(sock)]

        await eventually(
            lambda: budget.buffered_bytes == len(still_open()) * PARTIAL,
            what="every hostile frame read or its connection closed",
        )
        assert budget.buffered_bytes_peak <= BOUND
        assert len(still_open()) == budget.holders <= BOUND // PARTIAL
        assert budget.evictions == HOSTILE - budget.holders

        # A well-behaved client still works, with a frame larger than one read.
        body = b"b" * (FRAME_SIZE_MAX // 2)
        answer = await client.invoke(address, RemotingCommand(code=ECHO, body=body), 5000)
        assert answer.code == ResponseCode.SUCCESS
        assert answer.body == body
        assert budget.buffered_bytes_peak <= BOUND

        evictions = [r for r in caplog.records if "incomplete frames hold" in r.getMessage()]
        assert 1 <= len(evictions) <= 3  # rate-limited: one line per eviction at most
        assert all(r.exc_info is None for r in caplog.records)
    finally:
        for sock in hostile:
            sock.close()
        await eventually(lambda: budget.buffered_bytes == 0, what="held bytes released")
        await server.stop()


async def test_a_stalled_frame_is_closed_after_the_timeout(
    client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_server(frame_completion_timeout_ms=TIMEOUT_MS)
    address = f"127.0.0.1:{server.port}"
    caplog.set_level(logging.WARNING, logger="tidemq.remoting")
    loop = asyncio.get_running_loop()
    # Before the frames begin, on the server's clock (time.monotonic; uvloop's loop.time() is
    # cached per iteration): the bound below then holds however long the steps between take.
    started = time.monotonic()
    stalled = await open_partial_frame(server.port, 1000)
    trickle = await open_partial_frame(server.port, 1000)
    try:
        # A byte now and then keeps a connection active, but does not complete its frame.
        async def trickle_bytes() -> None:
            while not closed_by_server(trickle):
                try:
                    await loop.sock_sendall(trickle, b"\0")
                except OSError:
                    return  # closed by the server between the check and the send
                await asyncio.sleep(TIMEOUT_MS / 10 / 1000)

        trickler = asyncio.create_task(trickle_bytes())
        # A client between frames is not touched: the idle timeout is far away.
        await client.invoke(address, RemotingCommand(code=ECHO), 5000)
        await eventually(
            lambda: not server.frame_budget.holders, what="both incomplete frames closed"
        )
        # Not before the timeout (the sweep may come up to a quarter of it late).
        assert time.monotonic() - started >= TIMEOUT_MS / 1000
        # The client between frames was not touched.
        await eventually(lambda: len(server.connections) == 1, what="only the client left")
        assert closed_by_server(stalled)
        await asyncio.wait_for(trickler, 5)
        closes = [r for r in caplog.records if "a frame incomplete for" in r.getMessage()]
        assert len(closes) == 2
        answer = await client.invoke(address, RemotingCommand(code=ECHO, body=b"x"), 5000)
        assert answer.body == b"x"
    finally:
        stalled.close()
        trickle.close()
        await server.stop()


async def test_name_server_applies_its_configured_timeout(client: RemotingClient) -> None:
    config = NamesrvConfig(listen_port=0, frame_completion_timeout_ms=TIMEOUT_MS)
    app = NamesrvApp(config, SystemClock(), host="127.0.0.1")
    await app.start()
    stalled = await open_partial_frame(app.port, 1000)
    try:
        await eventually(lambda: app.server.frame_budget.holders == 1, what="frame held")
        await eventually(lambda: not app.server.connections, what="stalled frame closed")
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "absent"}
        )
        answer = await client.invoke(f"127.0.0.1:{app.port}", request, 5000)
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        stalled.close()
        await app.stop()


async def test_closing_releases_what_was_held() -> None:
    server = await start_server()
    try:
        sock = await open_partial_frame(server.port, PARTIAL)
        await eventually(
            lambda: server.frame_budget.buffered_bytes == PARTIAL, what="partial frame held"
        )
        sock.close()
        await eventually(lambda: server.frame_budget.buffered_bytes == 0, what="released")
        assert server.frame_budget.holders == 0
    finally:
        await server.stop()
