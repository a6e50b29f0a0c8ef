"""TLS settings and the ssl.SSLContexts built from them (spec security.md §2).

RocketMQ serves TLS and plaintext on one port and decides per connection by the first byte the
client sends: a TLS connection starts with a handshake record, content type 0x16; a remoting
frame starts with the high byte of its length, which is 0x00 for any frame under 16 MiB.

    mode         the server's port                     a client that speaks
    disabled     plaintext only (TLS clients fail)      plaintext
    permissive   both, by the first byte                either
    enforcing    TLS only (plaintext is closed)         TLS

Client certificates (mutual TLS) are `ClientAuth`: none, optional (a certificate sent is
verified against the trust file; none is fine), require (a connection without a verified one is
refused in the handshake). Require needs every connection in TLS: it makes the mode enforcing
when none is set (`default_mode`), and a permissive or disabled port with it is refused (a
plaintext client would skip the certificate check it asks for).

The settings are upstream's keys (tls.server.mode, tls.server.certPath, ...). A file that is
missing, unreadable or does not fit (a key that is not the certificate's, a wrong password) is a
TlsConfigError naming the setting and the path, raised when the context is built: at start, not
at the first connection. Protocols are TLS 1.2 and later.

Pure: builds contexts, opens no socket (remoting/acceptor.py sniffs and wraps connections).
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.errors import QueueError

# The first byte of a TLS connection: the record type of its ClientHello (RFC 8446 §5.1).
TLS_HANDSHAKE_RECORD: Final = 0x16
# How long an accepted connection has to send its first byte (permissive mode) and to finish
# its TLS handshake; a silent socket holds a descriptor until then. As asyncio's default
# ssl_handshake_timeout is 60 s; 10 s is ample on the networks a broker serves.
TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: Final = 10_000
TLS_MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2


class TlsConfigError(QueueError, ValueError):
    """A TLS setting the process cannot run with; the message names the setting and its path."""


class TlsMode(enum.Enum):
    """tls.server.mode."""

    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.Enum):
    """tls.server.need.client.auth."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


def parse_mode(text: str) -> TlsMode:
    """tls.server.mode from its text (case-insensitive)."""
    try:
        return TlsMode(text.strip().lower())
    except ValueError:
        choices = " | ".join(m.value for m in TlsMode)
        raise TlsConfigError(f"tls.server.mode={text!r}: must be {choices}") from None


def default_mode(*, certificate: bool, client_auth: ClientAuth) -> TlsMode:
    """tls.server.mode when it is not set: enforcing with client_auth require (a certificate
    is required of every client, so no plaintext client), else permissive when a certificate
    and its key are given (`certificate`), else disabled."""
    if client_auth is ClientAuth.REQUIRE:
        return TlsMode.ENFORCING
    return TlsMode.PERMISSIVE if certificate else TlsMode.DISABLED


def parse_client_auth(text: str) -> ClientAuth:
    """tls.server.need.client.auth from its text (case-insensitive)."""
    try:
        return ClientAuth(text.strip().lower())
    except ValueError:
        choices = " | ".join(a.value for a in ClientAuth)
        raise TlsConfigError(f"tls.server.need.client.auth={text!r}: must be {choices}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsServerSettings:
    """What a server's port speaks (tls.server.*). Mode other than disabled needs a certificate
    and its key; client_auth other than none needs the trust file the client certificates are
    verified against."""

    mode: TlsMode = TlsMode.DISABLED
    cert_path: Path | None = None
    key_path: Path | None = None
    key_password: str = field(default="", repr=False)
    client_auth: ClientAuth = ClientAuth.NONE
    trust_cert_path: Path | None = None
    handshake_timeout_ms: int = TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT

    def __post_init__(self) -> None:
        if self.handshake_timeout_ms <= 0:
            raise TlsConfigError(f"TLS handshake timeout {self.handshake_timeout_ms} ms: > 0")
        if self.client_auth is ClientAuth.REQUIRE and self.mode is not TlsMode.ENFORCING:
            raise TlsConfigError(
                f"tls.server.mode={self.mode.value} with tls.server.need.client.auth=require: a"
                " plaintext client would be served without a certificate; set"
                " tls.server.mode=enforcing (the default with require) or need.client.auth"
                " optional"
            )
        if self.mode is TlsMode.DISABLED:
            return
        if self.cert_path is None:
            raise TlsConfigError(f"tls.server.mode={self.mode.value} needs tls.server.certPath")
        if self.key_path is None:
            raise TlsConfigError(f"tls.server.mode={self.mode.value} needs tls.server.keyPath")
        if self.client_auth is not ClientAuth.NONE and self.trust_cert_path is None:
            raise TlsConfigError(
                f"tls.server.need.client.auth={self.client_auth.value} needs "
                "tls.server.trustCertPath (the CA certificates client certificates are checked "
                "against)"
            )

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsClientSettings:
    """How a client speaks TLS (tls.client.*): the server's certificate is verified against
    `trust_cert_path` (None: the system's CA store) unless `verify_server` is false
    (tls.client.authServer=false; only for tests and closed networks), and its name or IP
    address is checked against the address dialled when `check_hostname`. A client
    certificate is sent when the server asks and `cert_path` is set."""

    trust_cert_path: Path | None = None
    cert_path: Path | None = None
    key_path: Path | None = None
    key_password: str = field(default="", repr=False)
    verify_server: bool = True
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_path is None) != (self.key_path is None):
            raise TlsConfigError(
                "tls.client.certPath and tls.client.keyPath go together (a client certificate "
                "and its private key)"
            )


def server_context(settings: TlsServerSettings) -> ssl.SSLContext:
    """The context a server wraps accepted connections in.

    Raises:
        TlsConfigError: TLS is disabled, or a file is missing, unreadable or does not fit.
    """
    if not settings.enabled:
        raise TlsConfigError("tls.server.mode=disabled: no TLS context to build")
    assert settings.cert_path is not None
    assert settings.key_path is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_MINIMUM_VERSION
    # A client may not restart the handshake (TLS 1.2; 1.3 has none): each renegotiation costs
    # the server a handshake's CPU on a connection already admitted.
    context.options |= ssl.OP_NO_RENEGOTIATION
    _load_chain(
        context,
        ("tls.server.certPath", settings.cert_path),
        ("tls.server.keyPath", settings.key_path),
        settings.key_password,
    )
    if settings.client_auth is not ClientAuth.NONE:
        assert settings.trust_cert_path is not None
        _load_trust(context, "tls.server.trustCertPath", settings.trust_cert_path)
        context.verify_mode = (
            ssl.CERT_REQUIRED if settings.client_auth is ClientAuth.REQUIRE else ssl.CERT_OPTIONAL
        )
    return context


def client_context(settings: TlsClientSettings) -> ssl.SSLContext:
    """The context a client dials TLS servers with.

    Raises:
        TlsConfigError: a file is missing, unreadable or does not fit.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_MINIMUM_VERSION
    if settings.verify_server:
        context.check_hostname = settings.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        if settings.trust_cert_path is not None:
            _load_trust(context, "tls.client.trustCertPath", settings.trust_cert_path)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.cert_path is not None:
        assert settings.key_path is not None
        _load_chain(
            context,
            ("tls.client.certPath", settings.cert_path),
            ("tls.client.keyPath", settings.key_path),
            settings.key_password,
        )
    return context


def subject_text(peer_cert: object) -> str | None:
    """A verified peer certificate's subject as "CN=client,O=Example" (RFC 4514: most specific
    first, a multi-valued RDN joined by "+", values escaped so that a CN "x,O=Admin" reads
    "CN=x\\,O\\=Admin", never as an O), from `SSLObject.getpeercert()`; None without one."""
    if not isinstance(peer_cert, dict):
        return None
    subject = peer_cert.get("subject")
    if not subject:
        return None
    rdns = [
        "+".join(f"{_SHORT_NAMES.get(key, key)}={_rfc4514_value(value)}" for key, value in rdn)
        for rdn in subject
    ]
    return ",".join(reversed(rdns))


def _rfc4514_value(value: object) -> str:
    """An attribute value escaped as RFC 4514 §2.4 says (and "=", which it allows escaping)."""
    text = str(value)
    last = len(text) - 1
    escaped = []
    for index, char in enumerate(text):
        if char == "\0":
            escaped.append("\\00")
        elif (
            char in _RFC4514_SPECIAL
            or (index == 0 and char in "# ")
            or (index == last and char == " ")
        ):
            escaped.append("\\" + char)
        else:
            escaped.append(char)
    return "".join(escaped)


_RFC4514_SPECIAL: Final = frozenset(',+"\\<>;=')


_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
}


def _read(setting: str, path: Path) -> bytes:
    """The file's bytes; TlsConfigError naming `setting` when it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsConfigError(f"{setting}={str(path)!r}: no such file") from None
    except OSError as exc:
        raise TlsConfigError(f"{setting}={str(path)!r}: cannot read: {exc.strerror}") from None


def _load_chain(
    context: ssl.SSLContext,
    cert: tuple[str, Path],
    key: tuple[str, Path],
    password: str,
) -> None:
    """Load a certificate (chain) and its key; say which of them is wrong and why."""
    (cert_setting, cert_path), (key_setting, key_path) = cert, key
    if b"-----BEGIN CERTIFICATE-----" not in _read(cert_setting, cert_path):
        raise TlsConfigError(f"{cert_setting}={str(cert_path)!r}: no PEM certificate in it")
    key_text = _read(key_setting, key_path)
    if b"PRIVATE KEY-----" not in key_text:
        raise TlsConfigError(f"{key_setting}={str(key_path)!r}: no PEM private key in it")
    encrypted = b"ENCRYPTED" in key_text
    password_setting = key_setting.replace("keyPath", "keyPassword")
    try:
        # Always a password (empty when none is set): without one OpenSSL would prompt on the
        # terminal for an encrypted key.
        context.load_cert_chain(cert_path, key_path, password=password.encode())
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            why = f"not the private key of {cert_setting}={str(cert_path)!r}"
        elif encrypted:
            why = f"cannot decrypt it: {password_setting} is {'wrong' if password else 'not set'}"
        else:
            why = f"cannot load it with {cert_setting}={str(cert_path)!r}: {_ssl_reason(exc)}"
        raise TlsConfigError(f"{key_setting}={str(key_path)!r}: {why}") from None


def _load_trust(context: ssl.SSLContext, setting: str, path: Path) -> None:
    _read(setting, path)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"{setting}={str(path)!r}: not PEM CA certificates ({_ssl_reason(exc)})"
        ) from None


def _ssl_reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).replace("_", " ").lower()
