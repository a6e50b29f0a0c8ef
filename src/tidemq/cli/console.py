"""`tidemq console`: the web console (tidemq.console) served by uvicorn.

    tidemq console [-n|--namesrv HOST:PORT] [--host 127.0.0.1] [--port 8080]
                   [--allowed-host NAME ...]

It binds to the loopback address unless told otherwise: the console can reset offsets, delete
groups and resend messages, and has no login of its own (put it behind a proxy that
authenticates before binding it elsewhere; it warns when bound beyond loopback). It answers
only requests whose Host is localhost, 127.0.0.1, --host or an --allowed-host (DNS rebinding),
and takes a write only from its own confirm form (Origin and a per-process form token). Its
requests to the cluster are signed with --access-key / --secret-key like the other verbs'.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from tidemq.cli.credentials import add_options, credentials_of
from tidemq.cli.tls_options import add_client_flags, tls_of

HOST_DEFAULT = "127.0.0.1"
PORT_DEFAULT = 8080


def add_parsers(verbs: Any, *, namesrv_default: str) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "console",
        help="serve the web console",
        description="Serve the web console for the cluster of NAMESRV_ADDR. It listens on "
        "127.0.0.1 unless --host says otherwise: it can reset offsets, delete groups and resend "
        "messages, and has no login of its own.",
    )
    parser.add_argument(
        "-n",
        "--namesrv",
        "--namesrv-addr",
        dest="namesrv_addr",
        default=namesrv_default,
        help="name servers, ';'-separated",
    )
    parser.add_argument("--host", default=HOST_DEFAULT, help="address to listen on")
    parser.add_argument("--port", type=int, default=PORT_DEFAULT, help="port to listen on")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another Host name the console answers (repeatable; e.g. a proxy's name); "
        "localhost, 127.0.0.1 and --host are always allowed",
    )
    add_options(parser)  # --access-key / --secret-key
    add_client_flags(parser, default=argparse.SUPPRESS)  # --tls, --tls-ca, ...
    parser.set_defaults(run=run_console)


def run_console(args: argparse.Namespace) -> int:
    import uvicorn  # the console's server; only this verb needs it

    from tidemq.console.app import create_app
    from tidemq.console.guard import exposure_warning

    if (warning := exposure_warning(args.host)) is not None:
        print(f"WARNING: {warning}", file=sys.stderr)
    app = create_app(
        args.namesrv_addr,
        bind_host=args.host,
        allowed_hosts=args.allowed_host,
        credentials=credentials_of(args),
        tls=tls_of(args),
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
    asyncio.run(uvicorn.Server(config).serve())
    return 0
