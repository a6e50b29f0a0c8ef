"""The clients' `tls` option: how a ClientInstance (and so a Producer or consumer) dials name
servers and brokers.

    tls=False                 plaintext (the default)
    tls=True                  TLS, the server's certificate verified against the system's CA
                              store and its name or IP address checked against the one dialled
    tls=<ssl.SSLContext>      TLS with this context: a private CA, a client certificate
                              (mutual TLS), e.g. ssl.create_default_context(cafile="ca.pem"),
                              or tidemq.security.tls.client_context(TlsClientSettings(...))

Brokers are dialled at the address name servers publish (brokerIP1), so a broker's certificate
names that IP address (subjectAltName) unless the context skips the name check.
"""

from __future__ import annotations

import ssl

from tidemq.security.tls import TlsClientSettings, client_context

TlsOption = bool | ssl.SSLContext


def client_ssl(tls: TlsOption) -> ssl.SSLContext | None:
    """The context a `tls` option means; None for plaintext."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    return client_context(TlsClientSettings()) if tls else None
