"""The broker's TLS from its settings (security/tls.py): what its ports speak and how it dials.

    listenPort, VIP port   tls.server.*  (RemotingServer: disabled | permissive | enforcing)
    HA port (master)       tls.server.*, the same certificate and modes
    name servers, master   tls.client.* when tls.enable=true (registration, a slave's metadata
    (remoting and HA)      copies and its HA link)

Contexts are built when the broker is constructed, before the store recovers: a missing or
mismatched file stops the start with the setting's name, not the first connection.
"""

from __future__ import annotations

import ssl

from tidemq.broker.config import BrokerConfig
from tidemq.security.tls import client_context, server_context


def outbound_ssl(config: BrokerConfig) -> ssl.SSLContext | None:
    """The context of the broker's own connections; None unless tls.enable.

    Raises:
        TlsConfigError: a tls.client.* file is missing or does not fit.
    """
    settings = config.tls_client_settings
    return client_context(settings) if settings is not None else None


def check_tls_files(config: BrokerConfig) -> None:
    """Read every TLS file the broker will use, now.

    Raises:
        TlsConfigError: naming the setting and the path of the first bad one.
    """
    if config.tls_server_settings.enabled:
        server_context(config.tls_server_settings)
    outbound_ssl(config)
