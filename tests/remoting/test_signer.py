"""A RemotingClient made with a signer signs every request it sends (request and oneway) as the
fields leave; the answers it gives a server are not signed, nor is what a server sends. Checked on
the receiving side of a real loopback connection, over the fields as they arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import pytest

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import Connection, HandlerTable, RemotingClient, RemotingServer
from tidemq.security.signing import (
    ACCESS_KEY,
    SIGNATURE,
    Credentials,
    sign,
    signature_matches,
)

RECORD = 1005
ASK_CLIENT = 1010
TIMEOUT_MS = 2_000
ACCOUNT = Credentials("AK-remoting", "secret-remoting")


class Recorder:
    """A server that records every request as received and answers whether it verified."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    def table(self) -> HandlerTable:
        table = HandlerTable()
        table.register(RECORD, self.record)
        return table

    async def record(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.received.put_nowait(cmd)
        valid = signature_matches(ACCOUNT.secret_key, cmd.ext_fields, cmd.body)
        return cmd.response(ResponseCode.SUCCESS, {"valid": str(valid).lower()})


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def server(recorder: Recorder) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(recorder.table(), "127.0.0.1", 0, name="signed")
    await server.start()
    yield server
    await server.stop()


def client_handlers(answered: list[RemotingCommand]) -> HandlerTable:
    """What the client serves: a request from the server, answered with a field."""

    async def answer(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        answered.append(cmd)
        return cmd.response(ResponseCode.SUCCESS, {"from": "client"})

    table = HandlerTable()
    table.register(ASK_CLIENT, answer)
    return table


def addr(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.port}"


async def test_requests_and_oneways_are_signed_as_they_leave(
    server: RemotingServer, recorder: Recorder
) -> None:
    client = RemotingClient(signer=partial(sign, credentials=ACCOUNT))
    try:
        request = RemotingCommand(code=RECORD, ext_fields={"topic": "T", "b": "x"}, body=b"hi")
        response = await client.invoke(addr(server), request, TIMEOUT_MS)
        assert response.ext_fields["valid"] == "true"
        # The same command again with a field changed (a retry that edits its header): the
        # signature is computed afresh over what leaves, not kept from the first send.
        request.ext_fields["topic"] = "U"
        response = await client.invoke(addr(server), request, TIMEOUT_MS)
        assert response.ext_fields["valid"] == "true"
        await client.invoke_oneway(addr(server), RemotingCommand(code=RECORD, body=b"one-way"))
        first, second, oneway = [await recorder.received.get() for _ in range(3)]
    finally:
        await client.close()
    assert second.ext_fields["topic"] == "U"
    assert oneway.is_oneway
    for cmd in (first, second, oneway):
        assert cmd.ext_fields[ACCESS_KEY] == "AK-remoting"
        assert signature_matches("secret-remoting", cmd.ext_fields, cmd.body)
        assert not signature_matches("another-secret", cmd.ext_fields, cmd.body)
        tampered = dict(cmd.ext_fields, extra="1")
        assert not signature_matches("secret-remoting", tampered, cmd.body)
    assert not signature_matches("secret-remoting", oneway.ext_fields, b"other body")


async def test_without_a_signer_nothing_is_added(
    server: RemotingServer, recorder: Recorder
) -> None:
    client = RemotingClient()
    try:
        request = RemotingCommand(code=RECORD, ext_fields={"topic": "T"}, body=b"hi")
        response = await client.invoke(addr(server), request, TIMEOUT_MS)
    finally:
        await client.close()
    assert response.ext_fields["valid"] == "false"
    received = await recorder.received.get()
    assert received.ext_fields == {"topic": "T"}


async def test_answers_and_the_servers_own_requests_are_not_signed(server: RemotingServer) -> None:
    answered: list[RemotingCommand] = []
    client = RemotingClient(client_handlers(answered), signer=partial(sign, credentials=ACCOUNT))
    try:
        await client.invoke(addr(server), RemotingCommand(code=RECORD), TIMEOUT_MS)
        (server_side,) = server.connections
        answer = await server_side.request(
            RemotingCommand(code=ASK_CLIENT, ext_fields={"q": "1"}), TIMEOUT_MS
        )
    finally:
        await client.close()
    assert answer.code == ResponseCode.SUCCESS
    assert answer.ext_fields == {"from": "client"}  # the client's answer: no AccessKey/Signature
    (asked,) = answered
    assert asked.ext_fields == {"q": "1"}  # the server's request: its connection has no signer
    assert SIGNATURE not in asked.ext_fields
