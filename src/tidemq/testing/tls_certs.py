"""Certificates for TLS tests and benchmarks, made fresh in each run (no key is ever committed).

`make_pki(directory)` writes, as PEM files:

    ca.pem / ca.key              a CA ("TideMQ Test CA")
    server.pem / server.key      signed by it, for 127.0.0.1, ::1 and localhost
    client.pem / client.key      signed by it, CN=tidemq-test-client (mutual TLS)
    tricky-client.pem / .key     signed by it, CN="x,O=Admin" (subject escaping)
    other-ca.pem                 a second, unrelated CA
    other-server.pem / .key      signed by the other CA (a server the client must not trust)
    other-client.pem / .key      signed by the other CA (a client the server must refuse)
    server-locked.key            server.key encrypted with `KEY_PASSWORD`

EC P-256 keys: quick to make and to handshake with. Needs the `cryptography` package (the test
extra).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD: Final = "test-key-password"
CLIENT_COMMON_NAME: Final = "tidemq-test-client"
# A client certificate (of the test CA) whose CN looks like more RDNs when not escaped:
# pki.path("tricky-client.pem") and "tricky-client.key".
TRICKY_COMMON_NAME: Final = "x,O=Admin"
_VALIDITY: Final = datetime.timedelta(days=2)


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of the files `make_pki` wrote."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.directory / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def server_key_locked(self) -> Path:
        return self.directory / "server-locked.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def other_server_cert(self) -> Path:
        return self.directory / "other-server.pem"

    @property
    def other_server_key(self) -> Path:
        return self.directory / "other-server.key"

    @property
    def other_client_cert(self) -> Path:
        return self.directory / "other-client.pem"

    @property
    def other_client_key(self) -> Path:
        return self.directory / "other-client.key"


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "TideMQ tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: str | None = None) -> None:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], common_name: str, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """Write a CA, server and client certificates (and another CA's) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("TideMQ Test CA")
    other = _ca("Some Other CA")
    _write_cert(directory / "ca.pem", ca[1])
    _write_key(directory / "ca.key", ca[0])
    _write_cert(directory / "other-ca.pem", other[1])
    for stem, issuer, common_name, server in (
        ("server", ca, "tidemq-test-server", True),
        ("client", ca, CLIENT_COMMON_NAME, False),
        ("tricky-client", ca, TRICKY_COMMON_NAME, False),
        ("other-server", other, "tidemq-other-server", True),
        ("other-client", other, "tidemq-other-client", False),
    ):
        key, cert = _leaf(issuer, common_name, server=server)
        _write_cert(directory / f"{stem}.pem", cert)
        _write_key(directory / f"{stem}.key", key)
        if stem == "server":
            _write_key(directory / "server-locked.key", key, KEY_PASSWORD)
    return Pki(directory)
