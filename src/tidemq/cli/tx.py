"""`tidemq tx list|stats`: what the brokers' transaction feature holds and has done.

    tidemq tx list  [-n NAMESRV | -b BROKER] [--limit N]
        BROKER  TOPIC  GROUP  STATE  AGE  CHECKS  KEY      one line per in-flight half message
    tidemq tx stats [-n NAMESRV | -b BROKER]
        BROKER  PREPARED  COMMITTED  ROLLED_BACK  CHECKED  NO_PRODUCER  DISCARDED  IN_FLIGHT

Asks every master broker the name servers know (or the one given) with the TideMQ-private
requests TIDEMQ_TX_LIST (10001) and TIDEMQ_TX_STATS (10002); see broker/transaction/admin.py.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson

from tidemq.cli.credentials import add_options, credentials_of
from tidemq.cli.hints import fail
from tidemq.cli.output import add_json_flag, emit_json, wants_json
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import add_client_flags, tls_of
from tidemq.client.admin import Admin
from tidemq.errors import QueueError, error_for_code
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand

STATS_COLUMNS = (
    ("PREPARED", "prepared"),
    ("COMMITTED", "committed"),
    ("ROLLED_BACK", "rolled_back"),
    ("CHECKED", "checked"),
    ("NO_PRODUCER", "check_no_producer"),
    ("DISCARDED", "discarded"),
    ("IN_FLIGHT", "in_flight"),
)


def add_parsers(verbs: Any, *, namesrv_default: str) -> None:
    tx: argparse.ArgumentParser = verbs.add_parser("tx", help="transactional messages")
    actions = tx.add_subparsers(dest="action", required=True)
    for name, help_text, run in (
        ("list", "in-flight half messages", run_tx_list),
        ("stats", "transaction counters per broker", run_tx_stats),
    ):
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument(
            "-n", "--namesrv-addr", default=namesrv_default, help="name servers, ';'-separated"
        )
        parser.add_argument("-b", "--broker-addr", help="ask only this broker (host:port)")
        add_options(parser)  # --access-key / --secret-key
        add_client_flags(parser, default=argparse.SUPPRESS)  # --tls, --tls-ca, ...
        if name == "list":
            parser.add_argument("--limit", type=int, default=100, help="rows per broker")
        add_json_flag(parser).set_defaults(run=run)


async def _ask(args: argparse.Namespace, code: int, fields: dict[str, str]) -> list[Any]:
    """[(broker address, decoded JSON body)] from every master, or the one broker asked."""
    async with Admin(
        args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
    ) as admin:
        addrs = [args.broker_addr] if args.broker_addr else await admin.master_addresses()
        answers = []
        for addr in addrs:
            cmd = RemotingCommand(code=code, ext_fields=dict(fields))
            response = await admin.instance.remoting.invoke(addr, cmd, admin.timeout_ms)
            if response.code != ResponseCode.SUCCESS:
                raise error_for_code(response.code, f"{addr}: {response.remark}")
            answers.append((addr, orjson.loads(response.body)))
        return answers


def _age(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def run_tx_list(args: argparse.Namespace) -> int:
    try:
        answers = asyncio.run(_ask(args, RequestCode.TIDEMQ_TX_LIST, {"limit": str(args.limit)}))
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):  # the brokers' own answers, each under its address
        emit_json({"brokers": [{"addr": addr, **body} for addr, body in answers]})
        return 0
    rows = [["BROKER", "TOPIC", "GROUP", "STATE", "AGE", "CHECKS", "KEY"]]
    shown = total = 0
    for addr, body in answers:
        total += int(body["inFlight"])
        for tx in body["transactions"]:
            shown += 1
            rows.append(
                [
                    addr,
                    tx["topic"],
                    tx["producerGroup"],
                    tx["state"],
                    _age(int(tx["ageMs"])),
                    str(tx["checkTimes"]),
                    tx["key"],
                ]
            )
    print_table(rows)
    print(f"{total} in flight" + (f" ({shown} shown)" if shown < total else ""))
    return 0


def run_tx_stats(args: argparse.Namespace) -> int:
    try:
        answers = asyncio.run(_ask(args, RequestCode.TIDEMQ_TX_STATS, {}))
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):
        emit_json({"brokers": [{"addr": addr, **body} for addr, body in answers]})
        return 0
    rows = [["BROKER", *(title for title, _ in STATS_COLUMNS)]]
    for addr, body in answers:
        rows.append([addr, *(str(body.get(key, 0)) for _, key in STATS_COLUMNS)])
    print_table(rows)
    return 0
