"""TLS ports under abuse, over real loopback TCP on asyncio and uvloop: required client
certificates cannot be skipped by speaking plaintext, a peer that never answers close_notify
does not hold a server's stop, one address's silent sockets neither exceed its per-address cap
nor evict another address's handshake, the first byte and the handshake share one deadline, a
probe that resets is not logged, and a certificate subject cannot forge an RDN."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from tls_samples import WHO, server_settings, who

from tidemq.broker.config_file import load_broker_config
from tidemq.errors import ConnectionClosedError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import HandlerTable, RemotingClient, RemotingServer, acceptor
from tidemq.remoting.caps import ConnectionLimits
from tidemq.security.tls import (
    ClientAuth,
    TlsClientSettings,
    TlsMode,
    TlsServerSettings,
    client_context,
    server_context,
    subject_text,
)
from tidemq.testing.tls_certs import Pki
from tidemq.testing.wait import eventually

OTHER_HOST = "127.0.0.2"  # another source address on loopback (Linux routes 127.0.0.0/8)


def _settings(
    pki: Pki, mode: TlsMode, client_auth: ClientAuth = ClientAuth.NONE, timeout_ms: int = 60_000
) -> TlsServerSettings:
    return server_settings(pki, mode, client_auth, timeout_ms=timeout_ms)


@asynccontextmanager
async def _server(
    tls: TlsServerSettings, limits: ConnectionLimits | None = None
) -> AsyncIterator[RemotingServer]:
    table = HandlerTable()
    table.register(WHO, who)
    server = RemotingServer(table, "127.0.0.1", 0, name="tls-test", tls=tls, limits=limits)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _ask(server: RemotingServer, context: ssl.SSLContext | None) -> dict[str, str]:
    client = RemotingClient(ssl=context, connect_timeout_ms=3_000)
    try:
        address = f"127.0.0.1:{server.port}"
        response = await client.invoke(address, RemotingCommand(code=WHO), 3_000)
    finally:
        await client.close()
    assert response.code == ResponseCode.SUCCESS
    return response.ext_fields


def _client_context(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    return client_context(
        TlsClientSettings(
            trust_cert_path=pki.ca,
            cert_path=cert[0] if cert else None,
            key_path=cert[1] if cert else None,
        )
    )


async def _silent(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source` that sends nothing."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((source, 0))
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _closed(sock: socket.socket, timeout_s: float = 10) -> bool:
    """Wait until the server closes `sock` (a FIN or a reset)."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 1), timeout_s) == b""
    except ConnectionResetError:
        return True


def _still_open(sock: socket.socket) -> bool:
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


async def test_required_client_certificates_leave_no_plaintext_way_in(pki: Pki) -> None:
    config = load_broker_config(
        None,
        {},
        {
            "tls.server.certPath": str(pki.server_cert),
            "tls.server.keyPath": str(pki.server_key),
            "tls.server.need.client.auth": "require",
            "tls.server.trustCertPath": str(pki.ca),
        },
    )
    settings = config.tls_server_settings
    assert settings.mode is TlsMode.ENFORCING  # no mode set: require implies it
    async with _server(settings) as server:
        with pytest.raises(ConnectionClosedError):
            await _ask(server, None)  # plaintext, no certificate
        known = _client_context(pki, (pki.client_cert, pki.client_key))
        assert (await _ask(server, known))["tls"] == "true"


def _peer_that_never_reads(port: int, context: ssl.SSLContext, release: threading.Event) -> None:
    """Finish a TLS handshake, then neither read nor close until `release`."""
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1"),
    ):
        release.wait(60)


async def test_stop_does_not_wait_for_a_tls_peer_that_never_answers_close_notify(
    pki: Pki,
) -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    server = RemotingServer(HandlerTable(), "127.0.0.1", 0, tls=_settings(pki, TlsMode.ENFORCING))
    await server.start()
    peer = asyncio.ensure_future(
        asyncio.to_thread(_peer_that_never_reads, server.port, _client_context(pki), release)
    )
    try:
        await eventually(lambda: len(server.connections) == 1, what="the TLS peer served")
        started = loop.time()
        await asyncio.wait_for(server.stop(), 20)  # was 30 s: asyncio's close_notify wait
        assert loop.time() - started < 5
        assert not server.connections
    finally:
        release.set()
        await peer


async def test_one_address_cannot_evict_another_address_pending_handshake(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acceptor, "TLS_PENDING_MAX", 3)
    async with _server(_settings(pki, TlsMode.PERMISSIVE)) as server:
        victim = await _silent(server.port, OTHER_HOST)
        flood: list[socket.socket] = []
        try:
            await eventually(lambda: server.pending_connections == 1, what="the victim pending")
            for index in range(6):
                flood.append(await _silent(server.port))
                pending = min(index + 2, 3)
                await eventually(
                    lambda: server.pending_connections == pending,  # noqa: B023 (awaited here)
                    what="accepted, pending",
                )
            # Each newcomer evicted the flooding address's oldest, never the victim's.
            for evicted in flood[:4]:
                assert await _closed(evicted)
            assert _still_open(victim)
            assert all(_still_open(sock) for sock in flood[4:])
            assert server.pending_connections == 3
        finally:
            for sock in (victim, *flood):
                sock.close()


async def test_pending_handshakes_count_against_the_per_address_cap(pki: Pki) -> None:
    limits = ConnectionLimits(connections_per_address_max=2)
    async with _server(_settings(pki, TlsMode.PERMISSIVE), limits) as server:
        client = RemotingClient(ssl=_client_context(pki))
        sockets: list[socket.socket] = []
        try:
            address = f"127.0.0.1:{server.port}"
            await client.invoke(address, RemotingCommand(code=WHO), 3_000)  # one served
            sockets.append(await _silent(server.port))
            await eventually(lambda: server.pending_connections == 1, what="one pending")
            over = await _silent(server.port)  # served + pending = the cap: refused at once
            sockets.append(over)
            assert await _closed(over, 5)
            assert server.pending_connections == 1
            assert _still_open(sockets[0])
            sockets.append(await _silent(server.port, OTHER_HOST))  # another address is fine
            await eventually(lambda: server.pending_connections == 2, what="the other pending")
            assert len(server.connections) == 1
        finally:
            await client.close()
            for sock in sockets:
                sock.close()


async def test_first_byte_and_handshake_share_one_deadline(pki: Pki) -> None:
    loop = asyncio.get_running_loop()
    async with _server(_settings(pki, TlsMode.PERMISSIVE, timeout_ms=3_000)) as server:
        sock = await _silent(server.port)
        try:
            started = loop.time()
            await eventually(lambda: server.pending_connections == 1, what="accepted, pending")
            # A deliberate delay (the test's point): the first byte comes 2 s into the 3 s, and
            # the handshake it starts never finishes. Closed at 3 s, not 2 s + another 3 s.
            await asyncio.sleep(2)
            await loop.sock_sendall(sock, bytes([0x16]))
            assert await _closed(sock)
            assert loop.time() - started < 4.2
        finally:
            sock.close()


async def test_a_probe_that_resets_before_its_first_byte_is_not_logged(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tidemq.remoting")
    async with _server(_settings(pki, TlsMode.PERMISSIVE)) as server:
        probe = await _silent(server.port)
        await eventually(lambda: server.pending_connections == 1, what="the probe pending")
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        probe.close()  # a reset, not a FIN
        await eventually(lambda: "closed before sending anything" in caplog.text, what="dropped")
        assert server.pending_connections == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [message for message in warnings if "TLS" in message], warnings


async def test_a_subject_cannot_forge_an_rdn(pki: Pki) -> None:
    settings = _settings(pki, TlsMode.ENFORCING, ClientAuth.REQUIRE)
    tricky = (pki.path("tricky-client.pem"), pki.path("tricky-client.key"))
    async with _server(settings) as server:
        who = await _ask(server, _client_context(pki, tricky))
    # CN "x,O=Admin" stays one CN: its "," and "=" escaped, no "O=Admin" RDN.
    assert who["subject"] == "CN=x\\,O\\=Admin,O=TideMQ tests"


def test_subject_text_escapes_as_rfc_4514() -> None:
    def subject(*rdns: tuple[tuple[str, str], ...]) -> str | None:
        return subject_text({"subject": rdns})

    assert subject((("commonName", 'a+b;c<d>e"f\\g'),)) == 'CN=a\\+b\\;c\\<d\\>e\\"f\\\\g'
    assert subject((("commonName", "#lead"),)) == "CN=\\#lead"
    assert subject((("commonName", " both "),)) == "CN=\\ both\\ "
    assert subject((("commonName", "in # side"),)) == "CN=in # side"
    # A multi-valued RDN is joined by "+", RDNs by "," (most specific first).
    assert (
        subject((("organizationName", "Org"),), (("commonName", "n"), ("serialNumber", "1")))
        == "CN=n+serialNumber=1,O=Org"
    )
    assert subject_text({}) is None
    assert subject_text(None) is None


def test_server_context_refuses_renegotiation(pki: Pki) -> None:
    context = server_context(_settings(pki, TlsMode.ENFORCING))
    assert context.options & ssl.OP_NO_RENEGOTIATION
