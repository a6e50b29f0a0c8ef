"""Headers over FRAME_HEADER_SIZE_MAX over real loopback TCP, decoded no further than their
answer needs: a binary request whose fields are not even well-formed is answered from its
fixed part and the connection goes on; an oversized binary response reaches its waiter as a
SYSTEM_ERROR saying why, never as a response stripped of its fields."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from tidemq.limits import FRAME_HEADER_SIZE_MAX
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import (
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    encode,
)
from tidemq.remoting import Connection, HandlerTable, RemotingClient, RemotingServer

ECHO = 2001
TIMEOUT_MS = 5_000


def binary_frame(code: int, opaque: int, flag: int, fields_part: bytes) -> bytes:
    header = struct.pack(">hBhiii", code, 0, 401, opaque, flag, 0) + fields_part
    return struct.pack(">II", 4 + len(header), (SerializeType.ROCKETMQ << 24) | len(header)) + (
        header
    )


def one_field(key: bytes, value: bytes) -> bytes:
    pair = struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value
    return struct.pack(">i", len(pair)) + pair


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS)


@pytest.fixture
async def server() -> AsyncIterator[RemotingServer]:
    table = HandlerTable()
    table.register(ECHO, echo)
    table.register(RequestCode.SEND_MESSAGE_V2, echo)
    server = RemotingServer(table, "127.0.0.1", 0, name="oversized")
    await server.start()
    yield server
    await server.stop()


async def test_a_binary_request_is_answered_without_walking_its_fields(
    server: RemotingServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    garbage = b"\x7f" * (FRAME_HEADER_SIZE_MAX + 1)  # no valid field list
    writer.write(binary_frame(RequestCode.SEND_MESSAGE_V2, 1, 0, garbage))
    writer.write(encode(RemotingCommand(code=ECHO, opaque=2)))
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    while len(got) < 2:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert data, "connection closed"
        got += decoder.feed(data)
    by_opaque = {a.opaque: a for a in got}
    assert by_opaque[1].code == ResponseCode.MESSAGE_ILLEGAL
    assert "exceeds the limit of 1048576 bytes" in (by_opaque[1].remark or "")
    assert by_opaque[2].code == ResponseCode.SUCCESS
    writer.close()


async def test_an_oversized_binary_response_reaches_its_waiter_as_an_error() -> None:
    served = asyncio.Event()

    async def answer_at_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A peer answering the first request with a response whose header (one valid
        field) is over the limit."""
        try:
            decoder = FrameDecoder()
            while not (requests := decoder.feed(await reader.read(1 << 16))):
                pass
            fields = one_field(b"k", b"v" * (FRAME_HEADER_SIZE_MAX + 1))
            opaque = requests[0].opaque
            writer.write(binary_frame(ResponseCode.SUCCESS, opaque, FLAG_RESPONSE, fields))
            await writer.drain()
            await reader.read()  # until the client closes
        finally:
            writer.close()
            served.set()

    peer = await asyncio.start_server(answer_at_length, "127.0.0.1", 0)
    port = peer.sockets[0].getsockname()[1]
    client = RemotingClient()
    try:
        answer = await client.invoke(f"127.0.0.1:{port}", RemotingCommand(code=ECHO), TIMEOUT_MS)
    finally:
        await client.close()
        await asyncio.wait_for(served.wait(), 10)
        peer.close()
        await peer.wait_closed()
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert answer.remark is not None
    assert answer.remark.startswith("the response header of ")
