"""TLS on the remoting port, each mode with our client over real loopback TCP, on asyncio and
uvloop: disabled, permissive (TLS and plaintext on one port), enforcing, mutual TLS (optional,
require), an untrusted server, a silent socket, and the settings' errors."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from tls_samples import WHO, server_settings, who

from tidemq.errors import ConnectFailedError, ConnectionClosedError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import HandlerTable, RemotingClient, RemotingServer, acceptor
from tidemq.security.tls import (
    ClientAuth,
    TlsClientSettings,
    TlsConfigError,
    TlsMode,
    TlsServerSettings,
    client_context,
    parse_client_auth,
    parse_mode,
    server_context,
)
from tidemq.testing.tls_certs import CLIENT_COMMON_NAME, KEY_PASSWORD, Pki
from tidemq.testing.wait import eventually

TIMEOUT_MS = 3_000


def _table() -> HandlerTable:
    table = HandlerTable()
    table.register(WHO, who)
    return table


def _settings(
    pki: Pki, mode: TlsMode, client_auth: ClientAuth = ClientAuth.NONE, timeout_ms: int = 10_000
) -> TlsServerSettings:
    return server_settings(pki, mode, client_auth, timeout_ms=timeout_ms)


@asynccontextmanager
async def _server(tls: TlsServerSettings | None) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(_table(), "127.0.0.1", 0, name="tls-test", tls=tls)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def _client(
    pki: Pki, *, tls: bool = True, cert: tuple[Path, Path] | None = None, ca: Path | None = None
) -> AsyncIterator[RemotingClient]:
    context = None
    if tls:
        settings = TlsClientSettings(
            trust_cert_path=ca or pki.ca,
            cert_path=cert[0] if cert else None,
            key_path=cert[1] if cert else None,
        )
        context = client_context(settings)
    client = RemotingClient(ssl=context, connect_timeout_ms=TIMEOUT_MS)
    try:
        yield client
    finally:
        await client.close()


async def _ask(client: RemotingClient, server: RemotingServer) -> dict[str, str]:
    response = await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand(code=WHO), 3_000)
    assert response.code == ResponseCode.SUCCESS
    return response.ext_fields


async def test_disabled_serves_plaintext_and_a_tls_client_fails_cleanly(pki: Pki) -> None:
    async with _server(None) as server:
        async with _client(pki, tls=False) as plain:
            assert (await _ask(plain, server))["tls"] == "false"
        async with _client(pki) as tls:
            with pytest.raises(ConnectFailedError, match=r"TLS connect to 127\.0\.0\.1:"):
                await _ask(tls, server)
        async with _client(pki, tls=False) as plain:  # the server is unharmed
            assert (await _ask(plain, server))["tls"] == "false"


async def test_permissive_serves_tls_and_plaintext_on_one_port(pki: Pki) -> None:
    async with _server(_settings(pki, TlsMode.PERMISSIVE)) as server:
        async with _client(pki) as tls, _client(pki, tls=False) as plain:
            over_tls = await _ask(tls, server)
            over_plain = await _ask(plain, server)
            (tls_connection,) = tls.connections.values()
            (plain_connection,) = plain.connections.values()
        assert over_tls["tls"] == "true"
        assert over_plain["tls"] == "false"
        # The server sees the real peer of each (the TLS transport keeps the socket's address).
        assert over_tls["peer"] == "{}:{}".format(*tls_connection.local)
        assert over_plain["peer"] == "{}:{}".format(*plain_connection.local)
        assert tls_connection.tls
        assert not plain_connection.tls


async def test_enforcing_closes_plaintext_and_serves_tls(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq.remoting")
    async with _server(_settings(pki, TlsMode.ENFORCING)) as server:
        async with _client(pki, tls=False) as plain:
            with pytest.raises(ConnectionClosedError):
                await _ask(plain, server)
        async with _client(pki) as tls:
            assert (await _ask(tls, server))["tls"] == "true"
        await eventually(lambda: "TLS handshake" in caplog.text, what="the failure logged")
    failures = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert len(failures) == 1, caplog.text
    assert failures[0].exc_info is None  # one line, no traceback


async def test_mutual_tls_required(pki: Pki) -> None:
    settings = _settings(pki, TlsMode.ENFORCING, ClientAuth.REQUIRE)
    async with _server(settings) as server:
        async with _client(pki) as anonymous:
            with pytest.raises(ConnectionClosedError):
                await _ask(anonymous, server)
        async with _client(pki, cert=(pki.other_client_cert, pki.other_client_key)) as stranger:
            with pytest.raises(ConnectionClosedError):
                await _ask(stranger, server)
        async with _client(pki, cert=(pki.client_cert, pki.client_key)) as known:
            who = await _ask(known, server)
            # Checked while the client is connected: the one connection served is TLS.
            (served,) = server.connections
            assert served.tls
            assert served.peer_cert_subject == f"CN={CLIENT_COMMON_NAME},O=TideMQ tests"
        assert who["tls"] == "true"
        assert who["subject"] == f"CN={CLIENT_COMMON_NAME},O=TideMQ tests"


async def test_mutual_tls_optional(pki: Pki) -> None:
    settings = _settings(pki, TlsMode.PERMISSIVE, ClientAuth.OPTIONAL)
    async with _server(settings) as server:
        async with _client(pki) as anonymous:
            assert (await _ask(anonymous, server))["subject"] == ""
        async with _client(pki, cert=(pki.client_cert, pki.client_key)) as known:
            assert CLIENT_COMMON_NAME in (await _ask(known, server))["subject"]
        async with _client(pki, cert=(pki.other_client_cert, pki.other_client_key)) as stranger:
            with pytest.raises(ConnectionClosedError):
                await _ask(stranger, server)
        async with _client(pki, tls=False) as plain:
            assert (await _ask(plain, server))["tls"] == "false"


async def test_untrusted_server_certificate_is_a_clear_client_error(pki: Pki) -> None:
    async with _server(_settings(pki, TlsMode.ENFORCING)) as server:
        async with _client(pki, ca=pki.other_ca) as client:
            with pytest.raises(ConnectFailedError) as failure:
                await _ask(client, server)
        message = str(failure.value)
        assert "certificate did not verify" in message
        assert "unable to get local issuer certificate" in message


async def test_server_certificate_must_name_the_host_checked(pki: Pki) -> None:
    async with _server(_settings(pki, TlsMode.ENFORCING)) as server:
        context = client_context(TlsClientSettings(trust_cert_path=pki.ca))
        client = RemotingClient(ssl=context, server_hostname="broker.example.com")
        try:
            with pytest.raises(ConnectFailedError, match="Hostname mismatch"):
                await _ask(client, server)
        finally:
            await client.close()
        unchecked = TlsClientSettings(trust_cert_path=pki.ca, check_hostname=False)
        client = RemotingClient(ssl=client_context(unchecked), server_hostname="example.com")
        try:
            assert (await _ask(client, server))["tls"] == "true"
        finally:
            await client.close()


async def _closed_by_server(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    return await loop.sock_recv(sock, 1)


@pytest.mark.parametrize("mode", [TlsMode.PERMISSIVE, TlsMode.ENFORCING])
async def test_silent_socket_closed_after_the_handshake_timeout(pki: Pki, mode: TlsMode) -> None:
    async with _server(_settings(pki, mode, timeout_ms=300)) as server:
        loop = asyncio.get_running_loop()
        with socket.socket() as silent:
            silent.setblocking(False)
            await loop.sock_connect(silent, ("127.0.0.1", server.port))
            await eventually(lambda: server.pending_connections == 1, what="accepted, pending")
            started = loop.time()
            assert await asyncio.wait_for(_closed_by_server(silent), 5) == b""
            assert loop.time() - started < 3
        await eventually(lambda: server.pending_connections == 0, what="nothing pending")
        assert not server.connections
        async with _client(pki) as client:  # still serving
            assert (await _ask(client, server))["tls"] == "true"


async def test_silent_sockets_beyond_the_pending_cap_evict_the_oldest(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acceptor, "TLS_PENDING_MAX", 2)
    async with _server(_settings(pki, TlsMode.PERMISSIVE, timeout_ms=60_000)) as server:
        loop = asyncio.get_running_loop()
        sockets = [socket.socket() for _ in range(3)]
        try:
            for index, silent in enumerate(sockets):
                silent.setblocking(False)
                await loop.sock_connect(silent, ("127.0.0.1", server.port))
                pending = min(index + 1, 2)
                await eventually(
                    lambda: server.pending_connections == pending,  # noqa: B023 (awaited here)
                    what="accepted, pending",
                )
            assert await asyncio.wait_for(_closed_by_server(sockets[0]), 5) == b""
            assert server.pending_connections == 2
            async with _client(pki) as client:  # a real client still gets in
                assert (await _ask(client, server))["tls"] == "true"
        finally:
            for silent in sockets:
                silent.close()


async def test_stop_does_not_wait_for_a_silent_socket(pki: Pki) -> None:
    server = RemotingServer(
        _table(), "127.0.0.1", 0, tls=_settings(pki, TlsMode.PERMISSIVE, timeout_ms=60_000)
    )
    await server.start()
    loop = asyncio.get_running_loop()
    with socket.socket() as silent:
        silent.setblocking(False)
        await loop.sock_connect(silent, ("127.0.0.1", server.port))
        await eventually(lambda: server.pending_connections == 1, what="accepted, pending")
        await asyncio.wait_for(server.stop(), 5)
        assert await asyncio.wait_for(_closed_by_server(silent), 5) == b""


async def test_a_peer_closing_before_its_first_byte_is_dropped_quietly(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq.remoting")
    async with _server(_settings(pki, TlsMode.PERMISSIVE)) as server:
        loop = asyncio.get_running_loop()
        with socket.socket() as probe:
            probe.setblocking(False)
            await loop.sock_connect(probe, ("127.0.0.1", server.port))
        await eventually(lambda: server.pending_connections == 0, what="the probe dropped")
        async with _client(pki, tls=False) as plain:
            assert (await _ask(plain, server))["tls"] == "false"
    assert "TLS" not in caplog.text


def test_settings_name_the_bad_setting_and_path(pki: Pki, tmp_path: Path) -> None:
    def server(**kwargs: object) -> Callable[[], object]:
        fields: dict[str, object] = {
            "mode": TlsMode.ENFORCING,
            "cert_path": pki.server_cert,
            "key_path": pki.server_key,
        }
        fields.update(kwargs)
        return lambda: server_context(TlsServerSettings(**fields))  # type: ignore[arg-type]

    missing = tmp_path / "missing.pem"
    cases: list[tuple[Callable[[], object], str]] = [
        (server(cert_path=missing), f"tls.server.certPath='{missing}': no such file"),
        (server(key_path=pki.ca), "tls.server.keyPath=.*no PEM private key"),
        (server(cert_path=pki.server_key), "tls.server.certPath=.*no PEM certificate"),
        (server(key_path=pki.other_server_key), "not the private key of tls.server.certPath"),
        (server(key_path=pki.server_key_locked), "tls.server.keyPassword is not set"),
        (
            server(key_path=pki.server_key_locked, key_password="nope"),
            "tls.server.keyPassword is wrong",
        ),
        (server(cert_path=None), "needs tls.server.certPath"),
        (server(client_auth=ClientAuth.REQUIRE), "needs tls.server.trustCertPath"),
        (
            server(client_auth=ClientAuth.REQUIRE, trust_cert_path=pki.server_key),
            "tls.server.trustCertPath=.*not PEM CA certificates",
        ),
        (
            lambda: client_context(TlsClientSettings(trust_cert_path=missing)),
            "tls.client.trustCertPath=.*no such file",
        ),
        (
            lambda: client_context(TlsClientSettings(cert_path=pki.client_cert)),
            "tls.client.certPath and tls.client.keyPath go together",
        ),
        (lambda: parse_mode("strict"), "tls.server.mode='strict': must be disabled"),
        (lambda: parse_client_auth("yes"), "tls.server.need.client.auth='yes'"),
    ]
    for build, message in cases:
        with pytest.raises(TlsConfigError, match=message):
            build()
    # A right password opens the locked key; the key password never shows in the settings' repr.
    locked = TlsServerSettings(
        mode=TlsMode.ENFORCING,
        cert_path=pki.server_cert,
        key_path=pki.server_key_locked,
        key_password=KEY_PASSWORD,
    )
    server_context(locked)
    assert KEY_PASSWORD not in repr(locked)
    assert parse_mode(" Enforcing ") is TlsMode.ENFORCING
    assert parse_client_auth("REQUIRE") is ClientAuth.REQUIRE
