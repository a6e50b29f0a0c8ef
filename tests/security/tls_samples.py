"""What the TLS tests share: a handler that says how a connection came, and server settings
made from the test PKI."""

from __future__ import annotations

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import Connection
from tidemq.security.tls import ClientAuth, TlsMode, TlsServerSettings
from tidemq.testing.tls_certs import Pki

WHO = 1000  # answers how the connection came: tls, the client certificate's subject, the peer


async def who(connection: Connection, cmd: RemotingCommand) -> RemotingCommand:
    fields = {
        "tls": str(connection.tls).lower(),
        "subject": connection.peer_cert_subject or "",
        "peer": connection.peer_text,
    }
    return cmd.response(ResponseCode.SUCCESS, fields)


def server_settings(
    pki: Pki, mode: TlsMode, client_auth: ClientAuth = ClientAuth.NONE, *, timeout_ms: int
) -> TlsServerSettings:
    """The test server certificate; client certificates checked against the test CA when
    `client_auth` asks for them."""
    return TlsServerSettings(
        mode=mode,
        cert_path=pki.server_cert,
        key_path=pki.server_key,
        client_auth=client_auth,
        trust_cert_path=pki.ca if client_auth is not ClientAuth.NONE else None,
        handshake_timeout_ms=timeout_ms,
    )
