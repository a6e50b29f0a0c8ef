"""One-line CLI errors that say what to do, and the argument types the verbs share.

The client library raises typed errors with the server's own words ("No topic route info in name
server for the topic: TBW102" is what RocketMQ's name server says when a producer falls back to
the auto-create template topic). At the CLI edge those are turned into what the user can act on:

    TOPIC_NOT_EXIST (17) on a verb with -t  →  topic T does not exist ...: tidemq topic create -t T
    REQUEST_CODE_NOT_SUPPORTED (3) to a name-server request  →  -n ADDR is not a name server
    CONSUMER_NOT_ONLINE (206) on a verb with -g  →  no consumer of group G is online

`with_namesrv` gives a verb that talks to servers -n and the credential and TLS flags.
`time_ms` reads the times the verbs take (`send --deliver-at`, `group reset-offset --to-time`):
ms since the epoch, or an ISO 8601 date-time, local time unless it carries an offset or "Z"
(the tables print local times, so what a user copies from them reads back the same).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, Final

from tidemq.cli.credentials import add_options
from tidemq.cli.tls_options import add_client_flags
from tidemq.errors import BrokerError, QueueError
from tidemq.protocol.codes import RequestCode, ResponseCode

# Requests only a name server answers: a broker (or anything else) refusing one of them with
# REQUEST_CODE_NOT_SUPPORTED means -n does not point at a name server.
_NAMESRV_ONLY: Final = frozenset(
    {
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
    }
)
# The remark RocketMQ's and TideMQ's remoting servers give with REQUEST_CODE_NOT_SUPPORTED.
_NOT_SUPPORTED: Final = re.compile(r"request type (\d+) not supported")
NAMESRV_PORT_DEFAULT: Final = 9876


def explain(error: QueueError, args: argparse.Namespace) -> str:
    """The line to print for `error` raised by the verb `args` ran (without "tidemq: ")."""
    if not isinstance(error, BrokerError):
        return str(error)
    topic = getattr(args, "topic", None)
    if error.response_code == ResponseCode.TOPIC_NOT_EXIST and topic:
        # A producer asks for the auto-create template topic (TBW102) when its own has no
        # route: the server's words then name TBW102, not the topic the user gave.
        why = (
            " (these brokers do not create topics on first send: autoCreateTopicEnable=false)"
            if getattr(args, "verb", None) == "send"
            else ""
        )
        return (
            f"topic {topic} does not exist{why}; create it with:"
            f" tidemq topic create -t {topic} -n {args.namesrv_addr}"
        )
    group = getattr(args, "group", None)
    if error.response_code == ResponseCode.CONSUMER_NOT_ONLINE and group:
        return (
            f"no consumer of group {group} is online (connections, running info and resets"
            f" relayed to clients need one): {error.remark}"
        )
    if error.response_code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
        found = _NOT_SUPPORTED.search(error.remark)
        if found and int(found.group(1)) in _NAMESRV_ONLY:
            request = RequestCode(int(found.group(1))).name
            return (
                f"{args.namesrv_addr} is not a name server: it answered {request} with"
                f" REQUEST_CODE_NOT_SUPPORTED (is it a broker's port?); point -n or"
                f" TIDEMQ_NAMESRV_ADDR at a name server (port {NAMESRV_PORT_DEFAULT} by default)"
            )
    return str(error)


def run_verb(coro: Coroutine[Any, Any, int], args: argparse.Namespace) -> int:
    """Run a verb's coroutine; a refusal from the cluster becomes `fail`'s one line and status."""
    try:
        result: int = asyncio.run(coro)
    except QueueError as error:
        return fail(error, args)
    return result


def fail(error: QueueError, args: argparse.Namespace) -> int:
    """Print `error` as one line on stderr; the exit status of a verb the cluster refused."""
    print_error(explain(error, args))
    return 1


def print_error(line: str) -> None:
    """One "tidemq: ..." line on stderr."""
    print(f"tidemq: {line}", file=sys.stderr)


def with_namesrv(parser: argparse.ArgumentParser, namesrv_default: str) -> argparse.ArgumentParser:
    """Give a verb that talks to servers -n (name servers), the credentials and the TLS flags."""
    parser.add_argument(
        "-n",
        "--namesrv-addr",
        default=namesrv_default,
        help=f"name servers, ';'-separated (default {namesrv_default})",
    )
    add_options(parser)  # --access-key / --secret-key
    add_client_flags(parser, default=argparse.SUPPRESS)  # --tls, --tls-ca, ...
    return parser


def time_ms(text: str) -> int:
    """argparse type: ms since the epoch ("1764064800000") or an ISO date-time
    ("2026-11-25T10:00", "2026-11-25 10:00:30", "2026-11-25T10:00Z", "2026-11-25")."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ms since the epoch nor a date-time such as 2026-11-25T10:00"
            " (local time) or 2026-11-25T10:00Z"
        ) from None
    return int(when.timestamp() * 1000)  # a naive datetime is local time


def property_pair(text: str) -> tuple[str, str]:
    """argparse type: a user property written k=v."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"a property is written key=value, not {text!r}")
    return key.strip(), value
