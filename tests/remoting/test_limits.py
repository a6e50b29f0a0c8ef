"""Limits with answers (issue 15 item 4), on a real server over loopback TCP:

- connections over the total or the per-address cap are closed at accept, with a log line;
- the body bytes of one connection's requests in flight are bounded by pausing its reading, and
  every request is still answered;
- a request whose header is over FRAME_HEADER_SIZE_MAX (inside a well-formed frame) is answered
  with a code and a remark and the connection goes on; a frame over the frame limit still closes;
- a send that waited in its connection's backlog beyond the send-queue wait is answered
  SYSTEM_BUSY in upstream's words; other requests in the same backlog are served.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from tidemq.limits import FRAME_HEADER_SIZE_MAX, FRAME_SIZE_MAX, KIB, MIB
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.remoting import Connection, HandlerTable, RemotingServer
from tidemq.remoting.caps import ConnectionLimits
from tidemq.testing import eventually

ECHO = 2001
HOLD = 2002
DEFER = 2003
Start = Callable[[ConnectionLimits], Awaitable[RemotingServer]]


class Held:
    """HOLD's handler: counts the requests it holds until `release` is set."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.release = asyncio.Event()

    async def hold(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.now += 1
        self.most = max(self.most, self.now)
        await self.release.wait()
        self.now -= 1
        return cmd.response(ResponseCode.SUCCESS)


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS)


class Deferred:
    """DEFER's handler: answers later, as the broker's send coalescer does."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Connection, RemotingCommand]] = []
        self.most = 0

    async def defer(self, conn: Connection, cmd: RemotingCommand) -> None:
        conn.defer(cmd)
        self.waiting.append((conn, cmd))
        self.most = max(self.most, len(self.waiting))

    def answer_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for conn, cmd in waiting:
            conn.respond(cmd, cmd.response(ResponseCode.SUCCESS))


@pytest.fixture
async def held() -> Held:
    return Held()


@pytest.fixture
async def deferred() -> Deferred:
    return Deferred()


@pytest.fixture
async def start(held: Held, deferred: Deferred) -> AsyncIterator[Start]:
    """start(limits) → a started server with ECHO, HOLD and an echoing SEND_MESSAGE_V2."""
    servers: list[RemotingServer] = []

    async def _start(limits: ConnectionLimits) -> RemotingServer:
        table = HandlerTable()
        table.register(ECHO, echo)
        table.register(RequestCode.SEND_MESSAGE_V2, echo)
        table.register(HOLD, held.hold)
        table.register(DEFER, deferred.defer)
        server = RemotingServer(table, "127.0.0.1", 0, name="limits", limits=limits)
        await server.start()
        servers.append(server)
        return server

    yield _start
    held.release.set()
    for server in servers:
        await server.stop()


def raw_frame(
    code: int, ext_fields: dict[str, str], *, opaque: int = 1, body: bytes = b""
) -> bytes:
    """A JSON-header request frame built by hand: our encoder refuses headers over the limit."""
    header = orjson.dumps(
        {"code": code, "extFields": ext_fields, "flag": 0, "language": "JAVA",
         "opaque": opaque, "serializeTypeCurrentRPC": "JSON", "version": 401}
    )  # fmt: skip
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


async def answers(reader: asyncio.StreamReader, count: int) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    while len(got) < count:
        data = await asyncio.wait_for(reader.read(1 << 20), 10)
        assert data, f"connection closed after {len(got)} of {count} answers"
        got += decoder.feed(data)
    return got


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionResetError:
        return True


# -- connection caps ------------------------------------------------------------------------


async def test_a_connection_over_the_total_cap_is_closed_and_logged(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start(ConnectionLimits(connections_max=3, connections_per_address_max=0))
    caplog.set_level(logging.WARNING, "tidemq.remoting.caps")
    opened = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
    await eventually(lambda: len(server.connections) == 3, what="three served")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await closed_by_server(reader)
    writer.close()
    assert len(server.connections) == 3
    assert server.caps.refused == 1
    assert any(
        "127.0.0.1" in r.getMessage() and "maxConnections" in r.getMessage() for r in caplog.records
    )
    # The served ones still work, and a freed place is taken again.
    reader0, writer0 = opened[0]
    writer0.write(encode(RemotingCommand(code=ECHO, opaque=7)))
    [answer] = await answers(reader0, 1)
    assert (answer.code, answer.opaque) == (ResponseCode.SUCCESS, 7)
    writer0.close()
    await eventually(lambda: len(server.connections) == 2, what="one closed")
    reader4, writer4 = await asyncio.open_connection("127.0.0.1", server.port)
    writer4.write(encode(RemotingCommand(code=ECHO, opaque=8)))
    assert (await answers(reader4, 1))[0].code == ResponseCode.SUCCESS
    for _, writer in [*opened[1:], (reader4, writer4)]:
        writer.close()


async def test_the_per_address_cap_counts_each_remote_address_apart(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start(ConnectionLimits(connections_max=0, connections_per_address_max=2))
    caplog.set_level(logging.WARNING, "tidemq.remoting.caps")
    first = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    await eventually(lambda: len(server.connections) == 2, what="two served")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await closed_by_server(reader)
    writer.close()
    assert any("maxConnectionsPerAddress" in r.getMessage() for r in caplog.records)
    # Another source address (all of 127/8 is this host) has its own two places.
    other = [
        await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
        for _ in range(2)
    ]
    await eventually(lambda: len(server.connections) == 4, what="two more from 127.0.0.2")
    assert server.caps.from_address("127.0.0.2") == 2
    assert server.caps.refused == 1
    for _, writer in [*first, *other]:
        writer.close()
    await eventually(lambda: server.caps.total == 0, what="all released")


# -- in-flight bytes --------------------------------------------------------------------------


async def test_in_flight_bytes_pause_reading_and_every_request_is_answered(
    start: Start, held: Held
) -> None:
    body = b"b" * (64 * KIB)
    server = await start(ConnectionLimits(in_flight_bytes_max=256 * KIB))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    requests = 20
    writer.write(b"".join(
        encode(RemotingCommand(code=HOLD, opaque=i, body=body)) for i in range(requests)
    ))  # fmt: skip
    await eventually(lambda: held.now == 4, what="four requests held")
    [connection] = server.connections
    await eventually(lambda: connection.reading_paused, what="reading paused")
    await asyncio.sleep(0.05)  # the loop turns: nothing more may start while paused
    assert held.most == 4  # 4 x 64 KiB reach the 256 KiB bound; the fifth waits
    held.release.set()
    got = await answers(reader, requests)
    assert sorted(a.opaque for a in got) == list(range(requests))
    assert {a.code for a in got} == {ResponseCode.SUCCESS}
    assert not connection.closed
    writer.close()


async def test_deferred_requests_count_until_they_are_answered(
    start: Start, deferred: Deferred
) -> None:
    body = b"d" * (64 * KIB)
    server = await start(ConnectionLimits(in_flight_bytes_max=256 * KIB))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    requests = 12
    writer.write(b"".join(
        encode(RemotingCommand(code=DEFER, opaque=i, body=body)) for i in range(requests)
    ))  # fmt: skip
    answered: list[RemotingCommand] = []
    decoder = FrameDecoder()
    while len(answered) < requests:
        # Four deferred requests of 64 KiB reach the bound; answering them lets the next in.
        await eventually(lambda: len(deferred.waiting) == 4, what="four deferred")
        deferred.answer_all()
        want = len(answered) + 4
        while len(answered) < want:
            data = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert data, "connection closed"
            answered += decoder.feed(data)
    assert deferred.most == 4
    assert sorted(a.opaque for a in answered) == list(range(requests))
    writer.close()


# -- answered limits inside a well-formed frame ---------------------------------------------


async def test_a_send_whose_properties_overflow_the_header_limit_is_answered(
    start: Start,
) -> None:
    server = await start(ConnectionLimits())
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    keys = "k" * MIB
    properties = f"KEYS\x01{keys}\x02"  # as the C++ client sends a 1 MiB KEYS property
    writer.write(raw_frame(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "T", "i": properties}))
    writer.write(raw_frame(ECHO, {"x": "y" * (FRAME_HEADER_SIZE_MAX + 1)}, opaque=2))
    writer.write(encode(RemotingCommand(code=ECHO, opaque=3)))
    by_opaque = {a.opaque: a for a in await answers(reader, 3)}
    send, other, after = by_opaque[1], by_opaque[2], by_opaque[3]
    assert send.code == ResponseCode.MESSAGE_ILLEGAL
    size = len(properties)
    assert f"properties (keys, tags and user properties) of {size} bytes" in (send.remark or "")
    assert "limit of 32767 bytes" in (send.remark or "")
    assert other.code == ResponseCode.SYSTEM_ERROR
    assert re.search(r"header of \d+ bytes exceeds the limit of 1048576", other.remark or "")
    assert after.code == ResponseCode.SUCCESS  # the connection goes on
    assert len(server.connections) == 1
    writer.close()


async def test_a_frame_over_the_frame_limit_still_closes(start: Start) -> None:
    server = await start(ConnectionLimits())
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(struct.pack(">II", FRAME_SIZE_MAX + 1, 100))
    assert await closed_by_server(reader)
    writer.close()


# -- SYSTEM_BUSY from the send queue ----------------------------------------------------------


async def test_sends_that_waited_in_the_backlog_are_answered_system_busy(
    start: Start,
) -> None:
    # A wait of 0: every send that had to wait in the backlog at all is refused.
    server = await start(ConnectionLimits(send_wait_ms_max=0))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    body = b"m" * (2 * KIB)  # each costs 2 of the turn budget of 16: a backlog after 8
    frames = []
    for i in range(64):
        code = ECHO if i % 8 == 7 else RequestCode.SEND_MESSAGE_V2
        frames.append(encode(RemotingCommand(code=code, opaque=i, body=body)))
    writer.write(b"".join(frames))
    got = {a.opaque: a for a in await answers(reader, 64)}
    busy = [i for i, a in got.items() if a.code == ResponseCode.SYSTEM_BUSY]
    assert busy, "no send waited"
    assert all(got[i].code == ResponseCode.SUCCESS for i in range(8))  # started at once
    for i in busy:
        assert i % 8 != 7, "only sends are refused"
        assert re.fullmatch(
            r"\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control for a while, "
            r"period in queue: \d+ms, size of queue: \d+",
            got[i].remark or "",
        )
    assert all(got[i].code == ResponseCode.SUCCESS for i in range(7, 64, 8))
    writer.close()


async def test_without_a_send_wait_nothing_is_refused(start: Start) -> None:
    server = await start(ConnectionLimits(send_wait_ms_max=None))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    body = b"m" * (2 * KIB)
    writer.write(b"".join(
        encode(RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=i, body=body))
        for i in range(64)
    ))  # fmt: skip
    got = await answers(reader, 64)
    assert {a.code for a in got} == {ResponseCode.SUCCESS}
    writer.close()
