"""TLS flags of the command line (security/tls.py).

Servers (`tidemq namesrv`; brokers take broker.conf's tls.* keys, also with --set):

    --tls-mode disabled|permissive|enforcing   default: enforcing with --tls-client-auth require,
                                               else permissive when --tls-cert and --tls-key are
                                               given, else disabled (as the broker)
    --tls-cert PEM --tls-key PEM               the port's certificate and key; an encrypted key's
                                               password from $TIDEMQ_TLS_SERVER_KEY_PASSWORD
    --tls-client-auth none|optional|require    client certificates (mutual TLS) ...
    --tls-ca PEM                               ... verified against these CA certificates

Client verbs (send, consume, topic, ...; before or after the verb):

    --tls                   dial name servers and brokers in TLS (system CA store)
    --tls-ca PEM            verify servers against these CA certificates instead (implies --tls)
    --tls-cert/--tls-key    a client certificate for mutual TLS (implies --tls)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from tidemq.client.tls import TlsOption
from tidemq.security.tls import (
    ClientAuth,
    TlsClientSettings,
    TlsConfigError,
    TlsMode,
    TlsServerSettings,
    client_context,
    default_mode,
    parse_client_auth,
    parse_mode,
)

# As the broker's environment name of tls.server.keyPassword (config_file.py's rule).
SERVER_KEY_PASSWORD_ENV: Final = "TIDEMQ_TLS_SERVER_KEY_PASSWORD"
CLIENT_KEY_PASSWORD_ENV: Final = "TIDEMQ_TLS_CLIENT_KEY_PASSWORD"


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (docs/security.md)")
    group.add_argument(
        "--tls-mode",
        choices=[mode.value for mode in TlsMode],
        help="TLS on the port: permissive serves TLS and plaintext (default when --tls-cert and"
        " --tls-key are given), enforcing TLS only (default with --tls-client-auth require)",
    )
    group.add_argument("--tls-cert", type=Path, metavar="PEM", help="the port's certificate")
    group.add_argument(
        "--tls-key",
        type=Path,
        metavar="PEM",
        help=f"its private key (password, if encrypted: ${SERVER_KEY_PASSWORD_ENV})",
    )
    group.add_argument(
        "--tls-client-auth",
        choices=[auth.value for auth in ClientAuth],
        default=ClientAuth.NONE.value,
        help="client certificates (mutual TLS), verified against --tls-ca",
    )
    group.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA certificates of clients")


def server_settings(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> TlsServerSettings | None:
    """The port's TLS from the server flags; None when TLS is off.

    Raises:
        TlsConfigError: an incomplete combination (the message names the setting).
    """
    client_auth = parse_client_auth(args.tls_client_auth)
    if args.tls_mode is None:
        given = args.tls_cert is not None and args.tls_key is not None
        mode = default_mode(certificate=given, client_auth=client_auth)
    else:
        mode = parse_mode(args.tls_mode)
    settings = TlsServerSettings(
        mode=mode,
        cert_path=args.tls_cert,
        key_path=args.tls_key,
        key_password=environ.get(SERVER_KEY_PASSWORD_ENV, ""),
        client_auth=client_auth,
        trust_cert_path=args.tls_ca,
    )
    return settings if settings.enabled else None


def add_client_flags(parser: argparse.ArgumentParser, *, default: object = None) -> None:
    """The client verbs' flags; `default` as cli/credentials.py (SUPPRESS after the verb)."""
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default if default is not None else False,
        help="dial name servers and brokers in TLS",
    )
    parser.add_argument(
        "--tls-ca", type=Path, default=default, metavar="PEM", help="CA certificates of servers"
    )
    parser.add_argument(
        "--tls-cert", type=Path, default=default, metavar="PEM", help="client certificate"
    )
    parser.add_argument(
        "--tls-key",
        type=Path,
        default=default,
        metavar="PEM",
        help=f"its key (password, if encrypted: ${CLIENT_KEY_PASSWORD_ENV})",
    )


def tls_of(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> TlsOption:
    """A client verb's `tls` option; a usage error (exit 2) naming a bad file."""
    ca, cert, key = (getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))
    if ca is None and cert is None and key is None:
        return bool(getattr(args, "tls", False))
    try:
        return client_context(
            TlsClientSettings(
                trust_cert_path=ca,
                cert_path=cert,
                key_path=key,
                key_password=environ.get(CLIENT_KEY_PASSWORD_ENV, ""),
            )
        )
    except TlsConfigError as error:
        flags = str(error).replace("tls.client.trustCertPath", "--tls-ca")
        flags = flags.replace("tls.client.certPath", "--tls-cert")
        flags = flags.replace("tls.client.keyPath", "--tls-key")
        print(f"tidemq: {flags}", file=sys.stderr)
        raise SystemExit(2) from None
