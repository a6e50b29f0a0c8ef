"""Real loopback server and client on port 0: pairing, concurrency, oneway, errors, closes."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest

from tidemq.errors import ClientClosedError, ConnectionClosedError, RequestTimeoutError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    encode,
)
from tidemq.remoting import (
    Connection,
    HandlerTable,
    RemotingClient,
    RemotingServer,
    normalise_host,
    parse_address,
)

ECHO = 1000
BLOCK = 1001
FAIL = 1002
SILENT = 1003
CLOSE = 1004
RECORD = 1005
DEFER = 1006
TIMEOUT_MS = 2_000


class Harness:
    """Handlers whose behaviour the tests steer."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.blocked = asyncio.Event()
        self.entered: asyncio.Queue[None] = asyncio.Queue()
        self.recorded: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.deferred: asyncio.Queue[tuple[Connection, RemotingCommand]] = asyncio.Queue()

    def table(self) -> HandlerTable:
        table = HandlerTable()
        table.register(ECHO, self.echo)
        table.register(BLOCK, self.block)
        table.register(FAIL, self.fail)
        table.register(SILENT, self.silent)
        table.register(CLOSE, self.close)
        table.register(RECORD, self.record)
        table.register(DEFER, self.defer)
        return table

    async def echo(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, dict(cmd.ext_fields), cmd.body)

    async def block(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.blocked.set()
        self.entered.put_nowait(None)
        await self.release.wait()
        return cmd.response(ResponseCode.SUCCESS, {"which": "blocked"})

    async def fail(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("disk on fire")

    async def silent(self, conn: Connection, cmd: RemotingCommand) -> None:
        await self.recorded.put(cmd)
        return None

    async def close(self, conn: Connection, cmd: RemotingCommand) -> None:
        conn.abort()
        return None

    async def defer(self, conn: Connection, cmd: RemotingCommand) -> None:
        conn.defer(cmd)
        self.deferred.put_nowait((conn, cmd))
        return None

    async def record(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await self.recorded.put(cmd)
        return cmd.response(ResponseCode.SUCCESS)


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
async def server(harness: Harness) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="test")
    await server.start()
    yield server
    harness.release.set()
    await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    client = RemotingClient()
    yield client
    await client.close()


def addr(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.port}"


async def test_request_response(server: RemotingServer, client: RemotingClient) -> None:
    request = RemotingCommand(code=ECHO, ext_fields={"topic": "T"}, body=b"hello")
    response = await client.invoke(addr(server), request, TIMEOUT_MS)
    assert response.code == ResponseCode.SUCCESS
    assert response.opaque == request.opaque
    assert response.is_response
    assert response.ext_fields == {"topic": "T"}
    assert response.body == b"hello"


async def test_binary_request_answered_in_binary(
    server: RemotingServer, client: RemotingClient
) -> None:
    request = RemotingCommand(
        code=ECHO, ext_fields={"a": "1"}, serialize_type=SerializeType.ROCKETMQ
    )
    response = await client.invoke(addr(server), request, TIMEOUT_MS)
    assert response.serialize_type is SerializeType.ROCKETMQ
    assert response.ext_fields == {"a": "1"}


async def test_blocked_request_does_not_block_others(
    harness: Harness, server: RemotingServer, client: RemotingClient
) -> None:
    held = asyncio.create_task(client.invoke(addr(server), RemotingCommand(code=BLOCK), 5_000))
    await harness.blocked.wait()
    echoes = [
        client.invoke(addr(server), RemotingCommand(code=ECHO, ext_fields={"i": str(i)}), 5_000)
        for i in range(200)
    ]
    responses = await asyncio.gather(*echoes)
    assert [r.ext_fields["i"] for r in responses] == [str(i) for i in range(200)]
    assert not held.done()
    assert len(client.connections) == 1
    harness.release.set()
    assert (await held).ext_fields == {"which": "blocked"}


async def _read_frames(reader: asyncio.StreamReader) -> list[RemotingCommand]:
    """The frames of a raw socket's reads, from the first read that completes one."""
    decoder = FrameDecoder()
    frames: list[RemotingCommand] = []
    while not frames:
        frames += decoder.feed(await reader.read(65536))
    return frames


async def test_oneway_gets_no_response(
    harness: Harness, server: RemotingServer, client: RemotingClient
) -> None:
    await client.invoke_oneway(addr(server), RemotingCommand(code=RECORD, ext_fields={"n": "1"}))
    received = await asyncio.wait_for(harness.recorded.get(), 2)
    assert received.is_oneway
    # A response to the oneway would be dropped by the client; check the wire with a raw socket.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode(RemotingCommand(code=RECORD, opaque=7, flag=FLAG_ONEWAY)))
    writer.write(encode(RemotingCommand(code=ECHO, opaque=8)))
    await writer.drain()
    assert [f.opaque for f in await _read_frames(reader)] == [8]
    writer.close()
    await writer.wait_closed()


async def test_timeout(harness: Harness, server: RemotingServer, client: RemotingClient) -> None:
    with pytest.raises(RequestTimeoutError):
        await client.invoke(addr(server), RemotingCommand(code=BLOCK), 50)
    # The connection survives a timeout, and a late response is dropped.
    harness.release.set()
    response = await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    assert response.code == ResponseCode.SUCCESS


async def test_handler_returning_none_sends_nothing(
    harness: Harness, server: RemotingServer, client: RemotingClient
) -> None:
    connection = await client.connection(addr(server))
    with pytest.raises(RequestTimeoutError):
        await connection.request(RemotingCommand(code=SILENT), 100)
    await harness.recorded.get()
    # Deferred answer: the handler's side may answer later with send_response.
    (server_side,) = server.connections
    late = RemotingCommand(code=ECHO)
    waiting = asyncio.create_task(connection.request(late, TIMEOUT_MS))
    await asyncio.sleep(0)
    await server_side.send_response(late.response(ResponseCode.SUCCESS, {"late": "yes"}))
    assert (await waiting).ext_fields == {"late": "yes"}


async def test_deferred_answers_stay_in_flight_until_sent(
    harness: Harness, server: RemotingServer, client: RemotingClient
) -> None:
    connection = await client.connection(addr(server))
    waiting = [
        asyncio.create_task(connection.request(RemotingCommand(code=DEFER), TIMEOUT_MS))
        for _ in range(3)
    ]
    held = [await harness.deferred.get() for _ in range(3)]
    (server_side,) = server.connections
    assert server_side.in_flight == 3  # the handlers returned; their requests are not answered
    for n, (conn, request) in enumerate(reversed(held)):
        conn.respond(request, request.response(ResponseCode.SUCCESS, {"n": str(n)}))
    assert server_side.in_flight == 0
    answers = await asyncio.gather(*waiting)
    assert [a.ext_fields["n"] for a in answers] == ["2", "1", "0"]
    # A deferred oneway request is answered with nothing (seen on the wire).
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode(RemotingCommand(code=DEFER, opaque=7, flag=FLAG_ONEWAY)))
    writer.write(encode(RemotingCommand(code=DEFER, opaque=8)))
    for _ in range(2):
        conn, request = await harness.deferred.get()
        conn.respond(request, request.response(ResponseCode.SUCCESS))
    assert [f.opaque for f in await _read_frames(reader)] == [8]
    writer.close()
    await writer.wait_closed()
    # A closed connection drops the answer.
    pending = asyncio.create_task(connection.request(RemotingCommand(code=DEFER), TIMEOUT_MS))
    conn, request = await harness.deferred.get()
    connection.abort()
    with pytest.raises(ConnectionClosedError):
        await pending
    await conn.wait_closed()
    conn.respond(request, request.response(ResponseCode.SUCCESS))
    assert conn.in_flight == 0


async def test_unknown_code(server: RemotingServer, client: RemotingClient) -> None:
    response = await client.invoke(addr(server), RemotingCommand(code=9999), TIMEOUT_MS)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert response.remark == " request type 9999 not supported"


async def test_handler_exception(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="tidemq.remoting"):
        response = await client.invoke(addr(server), RemotingCommand(code=FAIL), TIMEOUT_MS)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "disk on fire"
    assert any("handler for code 1002" in r.getMessage() for r in caplog.records)
    again = await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    assert again.code == ResponseCode.SUCCESS


async def test_request_hook_answers_instead(harness: Harness) -> None:
    def hook(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.ext_fields.get("AccessKey") == "bad":
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="No accessKey is configured")
        return None

    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="hooked", request_hook=hook)
    await server.start()
    client = RemotingClient()
    try:
        denied = await client.invoke(
            addr(server), RemotingCommand(code=ECHO, ext_fields={"AccessKey": "bad"}), TIMEOUT_MS
        )
        allowed = await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    finally:
        await client.close()
        await server.stop()
    assert denied.code == ResponseCode.SYSTEM_ERROR
    assert denied.remark == "No accessKey is configured"
    assert allowed.code == ResponseCode.SUCCESS


async def test_server_to_client_request(server: RemotingServer) -> None:
    async def check_state(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, {"state": "commit"})

    handlers = HandlerTable()
    handlers.register(RequestCode.CHECK_TRANSACTION_STATE, check_state)
    client = RemotingClient(handlers)
    try:
        await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
        (server_side,) = server.connections
        answer = await server_side.request(
            RemotingCommand(code=RequestCode.CHECK_TRANSACTION_STATE), TIMEOUT_MS
        )
        assert answer.ext_fields == {"state": "commit"}
        unknown = await server_side.request(RemotingCommand(code=4242), TIMEOUT_MS)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    finally:
        await client.close()


async def test_malformed_frame_closes_only_that_connection(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    header = b"{not json"
    writer.write(struct.pack(">II", 4 + len(header), len(header)) + header)
    with caplog.at_level(logging.WARNING, logger="tidemq.remoting"):
        assert await asyncio.wait_for(reader.read(), 2) == b""
    assert any("header is not JSON" in r.getMessage() for r in caplog.records)
    writer.close()
    response = await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    assert response.code == ResponseCode.SUCCESS
    assert len(server.connections) == 1


async def test_oversized_length_closes_connection(harness: Harness) -> None:
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="small", frame_size_max=1024)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">I", 1025))
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
        # A frame at the limit is still served.
        client = RemotingClient()
        try:
            response = await client.invoke(
                f"127.0.0.1:{server.port}", RemotingCommand(code=ECHO, body=b"x" * 800), TIMEOUT_MS
            )
            assert response.body == b"x" * 800
        finally:
            await client.close()
    finally:
        await server.stop()


async def test_peer_vanishing_fails_pending_request(
    harness: Harness, server: RemotingServer, client: RemotingClient
) -> None:
    held = asyncio.create_task(client.invoke(addr(server), RemotingCommand(code=BLOCK), 60_000))
    await harness.blocked.wait()
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(client.invoke(addr(server), RemotingCommand(code=CLOSE), 60_000), 2)
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(held, 2)
    # The pool reconnects lazily.
    response = await client.invoke(addr(server), RemotingCommand(code=ECHO), TIMEOUT_MS)
    assert response.code == ResponseCode.SUCCESS


async def test_server_stop_fails_client_requests(harness: Harness) -> None:
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="stopping")
    await server.start()
    client = RemotingClient()
    try:
        held = asyncio.create_task(
            client.invoke(f"127.0.0.1:{server.port}", RemotingCommand(code=BLOCK), 60_000)
        )
        await harness.blocked.wait()
        await server.stop()
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(held, 2)
    finally:
        await client.close()


async def test_connect_refused_and_shared_connect(server: RemotingServer) -> None:
    client = RemotingClient(connect_timeout_ms=1_000)
    try:
        with pytest.raises(ConnectionClosedError):
            await client.invoke("127.0.0.1:1", RemotingCommand(code=ECHO), TIMEOUT_MS)
        first = await asyncio.gather(*(client.connection(addr(server)) for _ in range(10)))
        assert len({id(c) for c in first}) == 1
        assert len(server.connections) == 1
    finally:
        await client.close()
    with pytest.raises(ClientClosedError):
        await client.connection(addr(server))


async def test_in_flight_limit_answers_system_busy(harness: Harness) -> None:
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="busy")
    await server.start()
    client = RemotingClient()
    try:
        connection = await client.connection(f"127.0.0.1:{server.port}")
        await connection.request(RemotingCommand(code=ECHO), TIMEOUT_MS)
        (server_side,) = server.connections
        server_side._in_flight_max = 2  # the limit of 4096 is slow to reach in a test
        held = [
            asyncio.create_task(connection.request(RemotingCommand(code=BLOCK), TIMEOUT_MS))
            for _ in range(2)
        ]
        for _ in held:
            await harness.entered.get()
        assert server_side.in_flight == 2
        busy = await connection.request(RemotingCommand(code=ECHO), TIMEOUT_MS)
        assert busy.code == ResponseCode.SYSTEM_BUSY
        harness.release.set()
        assert all(r.code == ResponseCode.SUCCESS for r in await asyncio.gather(*held))
        assert (await connection.request(RemotingCommand(code=ECHO), TIMEOUT_MS)).code == 0
    finally:
        await client.close()
        await server.stop()


async def test_idle_connection_closed(harness: Harness) -> None:
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="idle", idle_timeout_ms=200)
    await server.start()
    client = RemotingClient()
    try:
        connection = await client.connection(f"127.0.0.1:{server.port}")
        await asyncio.wait_for(connection.wait_closed(), 2)
        assert not server.connections
    finally:
        await client.close()
        await server.stop()


async def test_extra_ports_and_listeners(harness: Harness) -> None:
    opened: list[Connection] = []
    closed: asyncio.Queue[Connection] = asyncio.Queue()
    server = RemotingServer(harness.table(), "127.0.0.1", 0, name="two", extra_ports=[0])
    server.add_connection_listener(opened.append, closed.put_nowait)
    await server.start()
    client = RemotingClient()
    try:
        assert len(server.ports) == 2
        assert server.ports[0] != server.ports[1]
        for port in server.ports:
            response = await client.invoke(
                f"127.0.0.1:{port}", RemotingCommand(code=ECHO), TIMEOUT_MS
            )
            assert response.code == ResponseCode.SUCCESS
        assert len(opened) == 2
        assert opened[0].peer[0] == "127.0.0.1"
        assert opened[0].local[1] == server.ports[0]
        await client.close()
        assert {await closed.get(), await closed.get()} == set(opened)
    finally:
        await client.close()
        await server.stop()


async def test_close_listener_and_response_to_unknown_opaque(
    server: RemotingServer, client: RemotingClient
) -> None:
    connection = await client.connection(addr(server))
    seen: list[Connection] = []
    connection.add_close_listener(seen.append)
    (server_side,) = server.connections
    # A stray response is dropped; the connection keeps working.
    await server_side.send_response(RemotingCommand(code=0, opaque=123456, flag=FLAG_RESPONSE))
    assert (await connection.request(RemotingCommand(code=ECHO), TIMEOUT_MS)).code == 0
    connection.close()
    await connection.wait_closed()
    assert seen == [connection]
    with pytest.raises(ConnectionClosedError):
        await connection.request(RemotingCommand(code=ECHO), TIMEOUT_MS)


def test_handler_table() -> None:
    async def handler(conn: Connection, cmd: RemotingCommand) -> None:
        return None

    table = HandlerTable()
    table.register(RequestCode.PULL_MESSAGE, handler)
    table.register(10, handler)
    assert table.codes() == [10, 11]
    assert table.get(11) is handler
    assert table.get(12) is None
    with pytest.raises(ValueError, match="already"):
        table.register(10, handler)


def test_addresses() -> None:
    assert parse_address("10.0.0.1:9876") == ("10.0.0.1", 9876)
    assert parse_address("[::1]:10911") == ("::1", 10911)
    for bad in ("nohost", ":9876", "h:0", "h:x"):
        with pytest.raises(ValueError):
            parse_address(bad)
    assert normalise_host("::1") == "127.0.0.1"
    assert normalise_host("::ffff:10.1.2.3") == "10.1.2.3"
    assert normalise_host("fe80::1") == "fe80::1"


async def test_large_bodies_under_backpressure(
    server: RemotingServer, client: RemotingClient
) -> None:
    bodies = [bytes([i]) * (3 * 1024 * 1024) for i in range(4)]
    responses = await asyncio.gather(
        *(
            client.invoke(addr(server), RemotingCommand(code=ECHO, body=body), 10_000)
            for body in bodies
        )
    )
    assert [r.body for r in responses] == bodies
