"""`tidemq` entry point: parses the command line and hands off to one verb module.

tidemq namesrv | broker | dev                  server processes (cli/servers.py)
tidemq topic | cluster | send | consume | message | group    admin verbs (cli/admin.py, lookup.py)
tidemq store verify|dump DIR                   offline store tools (cli/store.py)
tidemq tx list|stats                           transactional messages (cli/tx.py)
tidemq dlq list|resend                         dead letters (cli/dlq.py)
tidemq broker status|config, consumer|producer connection, topic delete, group list|delete,
message resend                                 mqadmin's verbs (cli/ops.py)
tidemq console                                 the web console (cli/console.py)

Every read verb takes --json: one JSON document on stdout (cli/output.py). Long work draws a
progress bar on stderr when it is a terminal (cli/progress.py).

The verbs that talk to servers sign their requests with --access-key / --secret-key (before or
after the verb) or TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY, for brokers with ACL (cli/credentials.py),
and dial in TLS with --tls / --tls-ca / --tls-cert / --tls-key (cli/tls_options.py).

Their name servers are -n, else TIDEMQ_NAMESRV_ADDR, else RocketMQ's NAMESRV_ADDR (so a shell set
up for mqadmin works as it is), else 127.0.0.1:9876.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from tidemq._version import __version__
from tidemq.cli import admin, console, credentials, dlq, servers, store, tls_options, tx

NAMESRV_ADDR_DEFAULT = "127.0.0.1:9876"
# Where -n comes from when it is not given, first found wins (RocketMQ's tools read NAMESRV_ADDR).
NAMESRV_ADDR_VARIABLES = ("TIDEMQ_NAMESRV_ADDR", "NAMESRV_ADDR")


def namesrv_default(environ: Mapping[str, str] = os.environ) -> str:
    """-n when it is not given: the first non-empty NAMESRV_ADDR_VARIABLES, else the default."""
    for name in NAMESRV_ADDR_VARIABLES:
        if value := environ.get(name, "").strip():
            return value
    return NAMESRV_ADDR_DEFAULT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemq", description="TideMQ: a RocketMQ-compatible message queue."
    )
    parser.add_argument("--version", action="version", version=f"tidemq {__version__}")
    parser.add_argument(
        "--log-level", default=os.environ.get("TIDEMQ_LOG_LEVEL", "INFO"), help="logging level"
    )
    credentials.add_global_options(parser)  # the verbs that talk to servers sign with them
    tls_options.add_client_flags(parser)  # ... and dial in TLS with them
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    servers.add_parsers(verbs)
    namesrv = namesrv_default()
    admin.add_parsers(verbs, namesrv_default=namesrv)
    store.add_parsers(verbs)
    dlq.add_parsers(verbs, namesrv_default=namesrv)
    tx.add_parsers(verbs, namesrv_default=namesrv)
    console.add_parsers(verbs, namesrv_default=namesrv)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        result: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
