"""The Spark connector's TLS options (no Spark needed: the options are parsed on the driver into
settings that travel to the executors)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tidemq.security.tls import TlsClientSettings
from tidemq.spark.options import parse_sink_options, parse_source_options
from tidemq.testing.tls_certs import KEY_PASSWORD, Pki

BASE = {"nameServer": "127.0.0.1:9876", "topic": "T"}


def test_plaintext_unless_asked() -> None:
    assert parse_sink_options(BASE).tls is None
    assert parse_source_options(BASE, streaming=False).tls is None
    assert parse_sink_options({**BASE, "tls": "false"}).tls is None


def test_tls_options_become_settings_that_travel(pki: Pki) -> None:
    assert parse_sink_options({**BASE, "TLS": "true"}).tls == TlsClientSettings()
    options = {
        **BASE,
        "tlsTrustCertPath": str(pki.ca),  # a path implies tls=true
        "tlsCertPath": str(pki.client_cert),
        "tlsKeyPath": str(pki.client_key),
    }
    settings = parse_source_options(options, streaming=True).tls
    assert settings == TlsClientSettings(
        trust_cert_path=pki.ca, cert_path=pki.client_cert, key_path=pki.client_key
    )
    assert pickle.loads(pickle.dumps(settings)) == settings  # to the executors


def test_bad_tls_options_name_the_option(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    cases = [
        ({"tls": "false", "tlsTrustCertPath": str(pki.ca)}, "tls=false contradicts"),
        ({"tlsTrustCertPath": str(missing)}, "option tlsTrustCertPath='.*': no such file"),
        ({"tlsCertPath": str(pki.client_cert)}, "option tlsCertPath and option tlsKeyPath"),
        ({"tls": "maybe"}, "option tls must be true or false"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            parse_sink_options({**BASE, **extra})
    locked = {
        **BASE,
        "tlsCertPath": str(pki.server_cert),
        "tlsKeyPath": str(pki.server_key_locked),
        "tlsKeyPassword": "wrong-password",
    }
    with pytest.raises(ValueError, match="option tlsKeyPassword is wrong") as failure:
        parse_sink_options(locked)
    assert "wrong-password" not in str(failure.value)
    right = parse_sink_options({**locked, "tlsKeyPassword": KEY_PASSWORD}).tls
    assert right is not None
    assert KEY_PASSWORD not in repr(right)
