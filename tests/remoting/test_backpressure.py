"""A client that sends requests but never reads the answers cannot make the server queue
responses without bound: once the transport's buffer passes its high-water mark, the server
stops reading that connection, and resumes when the client reads again (review finding 3)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.remoting import Connection, HandlerTable, RemotingServer
from tidemq.testing import eventually

BIG = 2000
RESPONSE_BYTES = 256 * 1024
REQUESTS = 400  # 100 MiB of responses if the server answered them all without the client reading


class Counter:
    def __init__(self) -> None:
        self.handled = 0

    async def big(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.handled += 1
        return cmd.response(ResponseCode.SUCCESS, body=b"x" * RESPONSE_BYTES)


@pytest.fixture
async def served() -> AsyncIterator[tuple[RemotingServer, Counter]]:
    counter = Counter()
    table = HandlerTable()
    table.register(BIG, counter.big)
    server = RemotingServer(table, "127.0.0.1", 0, name="backpressure")
    await server.start()
    yield server, counter
    await server.stop()


async def test_server_stops_reading_a_client_that_does_not_read(
    served: tuple[RemotingServer, Counter],
) -> None:
    server, counter = served
    stream = b"".join(encode(RemotingCommand(code=BIG, opaque=i)) for i in range(REQUESTS))
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setblocking(False)
    try:
        # Write what the kernel takes, never reading; the server must stop reading first.
        sent = 0
        while sent < len(stream):
            try:
                sent += sock.send(stream[sent : sent + 65536])
            except BlockingIOError:
                break
        await eventually(lambda: len(server.connections) == 1, what="connection accepted")
        [connection] = server.connections
        await eventually(lambda: connection.reading_paused, what="server paused reading")
        assert counter.handled < REQUESTS

        # Reading the answers lets the server resume; every request is eventually answered.
        sock.setblocking(True)
        remaining = stream[sent:]
        writer = loop.run_in_executor(None, sock.sendall, remaining)
        decoder = FrameDecoder()
        answered = 0
        while answered < REQUESTS:
            data = await loop.run_in_executor(None, sock.recv, 1 << 20)
            assert data, "server closed the connection"
            answered += len(decoder.feed(data))
        await writer
        assert counter.handled == REQUESTS
    finally:
        sock.close()
