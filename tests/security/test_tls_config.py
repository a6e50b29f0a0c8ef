"""The broker's TLS keys (upstream's names in broker.conf): defaults, the environment's names,
the mode chosen when unset, redaction, and what the broker builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.broker.replication import ha_settings
from tidemq.broker.tls_setup import check_tls_files, outbound_ssl
from tidemq.security.tls import ClientAuth, TlsConfigError, TlsMode
from tidemq.testing.tls_certs import KEY_PASSWORD, Pki

HA_SECRET = {"haSecret": "0123456789abcdef"}  # the HA settings need one


def test_defaults_are_plaintext_both_ways() -> None:
    config = load_broker_config(None, {}, HA_SECRET)
    assert config.tls_server_settings.mode is TlsMode.DISABLED
    assert config.tls_client_settings is None
    assert outbound_ssl(config) is None
    ha = ha_settings(config)
    assert ha.tls is not None
    assert not ha.tls.enabled
    assert ha.client_ssl is None


def test_a_certificate_and_key_make_the_port_permissive(pki: Pki) -> None:
    config = load_broker_config(
        None,
        {"TIDEMQ_TLS_SERVER_KEY_PASSWORD": KEY_PASSWORD},  # tls.server.keyPassword
        {
            "tls.server.certPath": str(pki.server_cert),
            "tls.server.keyPath": str(pki.server_key_locked),
            "tls.server.need.client.auth": "OPTIONAL",
            "tls.server.trustCertPath": str(pki.ca),
            "tls.enable": "true",
            "tls.client.trustCertPath": str(pki.ca),
            **HA_SECRET,
        },
    )
    server = config.tls_server_settings
    assert server.mode is TlsMode.PERMISSIVE
    assert server.client_auth is ClientAuth.OPTIONAL
    assert server.key_password == KEY_PASSWORD
    check_tls_files(config)  # every file reads, the locked key opens
    assert outbound_ssl(config) is not None
    ha = ha_settings(config)  # the HA port speaks what the client ports speak
    assert ha.tls == server
    assert ha.client_ssl is not None
    rendered = render_config(config)
    assert KEY_PASSWORD not in rendered
    assert "tls.server.keyPassword=<redacted>" in rendered
    assert "tls.server.mode=\n" in rendered  # unset: chosen as above


def test_required_client_certificates_make_the_port_enforcing(pki: Pki) -> None:
    settings = {
        "tls.server.certPath": str(pki.server_cert),
        "tls.server.keyPath": str(pki.server_key),
        "tls.server.trustCertPath": str(pki.ca),
    }
    required = load_broker_config(None, {}, {**settings, "tls.server.need.client.auth": "require"})
    assert required.tls_server_settings.mode is TlsMode.ENFORCING
    optional = load_broker_config(None, {}, {**settings, "tls.server.need.client.auth": "optional"})
    assert optional.tls_server_settings.mode is TlsMode.PERMISSIVE
    # Without a certificate, require asks for one rather than leaving the port plaintext.
    with pytest.raises(
        ValueError, match=r"tls\.server\.mode=enforcing needs tls\.server\.certPath"
    ):
        load_broker_config(None, {}, {"tls.server.need.client.auth": "require"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tls.server.mode": "enforcing"}, "tls.server.mode=enforcing needs tls.server.certPath"),
        ({"tls.server.mode": "on"}, "tls.server.mode='on': must be disabled"),
        ({"tls.server.need.client.auth": "always"}, "tls.server.need.client.auth='always'"),
        ({"tls.enable": "true", "tls.client.certPath": "c.pem"}, "go together"),
        (
            {
                "tls.server.mode": "permissive",
                "tls.server.certPath": "c.pem",
                "tls.server.keyPath": "k.pem",
                "tls.server.need.client.auth": "require",
                "tls.server.trustCertPath": "ca.pem",
            },
            "tls.server.mode=permissive with tls.server.need.client.auth=require: a plaintext",
        ),
        (
            {"tls.server.mode": "disabled", "tls.server.need.client.auth": "require"},
            "tls.server.mode=disabled with tls.server.need.client.auth=require",
        ),
    ],
)
def test_incomplete_settings_are_refused_when_loaded(
    overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_broker_config(None, {}, overrides)


def test_unreadable_files_are_refused_before_start(pki: Pki, tmp_path: Path) -> None:
    config = load_broker_config(
        None,
        {},
        {"tls.enable": "true", "tls.client.trustCertPath": str(tmp_path / "nope.pem")},
    )
    with pytest.raises(TlsConfigError, match=r"tls\.client\.trustCertPath=.*no such file"):
        check_tls_files(config)
