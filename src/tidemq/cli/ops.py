"""mqadmin's everyday verbs, on top of client/admin.py's Admin:

    tidemq broker status --broker ADDR              runtime info        (mqadmin brokerStatus)
    tidemq broker config get --broker ADDR [-k K]   the broker's config (getBrokerConfig)
    tidemq broker config set (--broker ADDR | -c CLUSTER) KEY=VALUE ...   (updateBrokerConfig)
    tidemq topic delete -t TOPIC [-c CLUSTER] [--yes]                     (deleteTopic)
    tidemq group list                               every group, all brokers
    tidemq group delete -g GROUP [-c CLUSTER] [--clean-offset] [--yes]    (deleteSubGroup)
    tidemq consumer connection -g GROUP             who consumes, what    (consumerConnection)
    tidemq producer connection -g GROUP -t TOPIC                          (producerConnection)
    tidemq message resend --id ID -g GROUP          to one group only     (resendMessage...)

`broker status` and `broker config` hang off the `broker` verb that runs a broker: `tidemq broker
-c broker.conf` still starts one, and a word after `broker` picks an admin action instead.

The answers for connections are relayed as the client decodes them: the tables are drawn from
their fields (output.records_rows), so a field the brokers add shows up without a change here.
Every read verb takes --json (cli/output.py). The deletes ask first on a terminal, and without
one refuse unless --yes: a script that deletes says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from tidemq.cli.credentials import credentials_of
from tidemq.cli.hints import print_error, property_pair, run_verb, with_namesrv
from tidemq.cli.output import add_json_flag, emit_json, jsonable, records_rows, wants_json
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import tls_of
from tidemq.client.admin import Admin
from tidemq.protocol import message as pm

Verb = Callable[[Admin, argparse.Namespace], Coroutine[Any, Any, int]]


def add_parsers(verbs: Any, *, namesrv_default: str) -> None:
    """`consumer` and `producer`, and `status`/`config` under the `broker` verb when present."""
    consumer = _connection_parser(
        verbs, "consumer", "clients, subscriptions and consume settings of a group", namesrv_default
    )
    _reads(consumer, _consumer_connection)
    producer = _connection_parser(
        verbs, "producer", "clients of a producer group sending to a topic", namesrv_default
    )
    producer.add_argument("-t", "--topic", required=True)
    _reads(producer, _producer_connection)
    broker = verbs.choices.get("broker")
    if broker is not None:
        _add_broker_actions(broker, namesrv_default)


def _connection_parser(
    verbs: Any, role: str, help_text: str, namesrv_default: str
) -> argparse.ArgumentParser:
    """`tidemq ROLE connection -g GROUP` (consumer, producer)."""
    parent = verbs.add_parser(role, help=f"a {role} group's live clients")
    connection = with_namesrv(
        parent.add_subparsers(dest="action", required=True).add_parser(
            "connection", help=help_text
        ),
        namesrv_default,
    )
    connection.add_argument("-g", "--group", required=True)
    return connection


def _add_broker_actions(broker: argparse.ArgumentParser, namesrv_default: str) -> None:
    # Not required: `tidemq broker -c broker.conf` (no action) runs a broker as before.
    actions = broker.add_subparsers(dest="action", metavar="{status,config}")
    status = with_namesrv(
        actions.add_parser("status", help="a broker's runtime info"), namesrv_default
    )
    status.add_argument("-b", "--broker", required=True, metavar="ADDR", help="host:port")
    _reads(status, _broker_status)
    config = actions.add_parser("config", help="read or change a broker's config")
    config_actions = config.add_subparsers(dest="config_action", required=True)
    get = with_namesrv(
        config_actions.add_parser("get", help="the broker's settings"), namesrv_default
    )
    get.add_argument("-b", "--broker", required=True, metavar="ADDR", help="host:port")
    get.add_argument("-k", "--key", action="append", default=[], help="only this key (repeat)")
    _reads(get, _broker_config_get)
    set_ = with_namesrv(
        config_actions.add_parser("set", help="change settings at run time"), namesrv_default
    )
    where = set_.add_mutually_exclusive_group(required=True)
    where.add_argument("-b", "--broker", metavar="ADDR", help="this broker (host:port)")
    where.add_argument("-c", "--cluster", help="every master of this cluster")
    set_.add_argument("changes", nargs="+", type=property_pair, metavar="KEY=VALUE")
    _writes(set_, _broker_config_set)


def add_topic_actions(actions: Any, namesrv_default: str) -> None:
    """`tidemq topic delete`, added to cli/admin.py's `topic` verb."""
    delete = with_namesrv(
        actions.add_parser("delete", help="delete a topic on its brokers and name servers"),
        namesrv_default,
    )
    delete.add_argument("-t", "--topic", required=True)
    delete.add_argument("-c", "--cluster", help="only on this cluster's brokers")
    _deletes(delete, _topic_delete, lambda args: f"topic {args.topic}")


def add_group_actions(actions: Any, namesrv_default: str) -> None:
    """`tidemq group list|delete`, added to cli/admin.py's `group` verb."""
    listing = with_namesrv(
        actions.add_parser("list", help="every subscription group and online consumer group"),
        namesrv_default,
    )
    _reads(listing, _group_list)
    delete = with_namesrv(
        actions.add_parser("delete", help="delete a subscription group on every master"),
        namesrv_default,
    )
    delete.add_argument("-g", "--group", required=True)
    delete.add_argument("-c", "--cluster", help="only on this cluster's masters")
    delete.add_argument(
        "-r",
        "--clean-offset",
        action="store_true",
        help="remove the group's consumer offsets too (mqadmin's -r; off by default as upstream)",
    )
    _deletes(delete, _group_delete, lambda args: f"group {args.group}")


def add_message_actions(actions: Any, namesrv_default: str) -> None:
    """`tidemq message resend`, added to cli/admin.py's `message` verb."""
    resend = with_namesrv(
        actions.add_parser(
            "resend",
            help="deliver one stored message again to one consumer group only (also from DLQ)",
        ),
        namesrv_default,
    )
    resend.add_argument(
        "-i", "--id", required=True, help="offsetMsgId, or msgId (UNIQ_KEY) with -t"
    )
    resend.add_argument(
        "-t", "--topic", help="the topic holding a msgId (%%DLQ%%GROUP for a dead letter)"
    )
    resend.add_argument("-g", "--group", required=True, help="the consumer group to deliver to")
    _writes(resend, _message_resend)


def _reads(parser: argparse.ArgumentParser, verb: Verb) -> None:
    add_json_flag(parser).set_defaults(run=lambda args: _run(verb, args))


def _writes(parser: argparse.ArgumentParser, verb: Verb) -> None:
    parser.set_defaults(run=lambda args: _run(verb, args))


def _deletes(
    parser: argparse.ArgumentParser, verb: Verb, what: Callable[[argparse.Namespace], str]
) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help="delete without asking")

    def run(args: argparse.Namespace) -> int:
        return _run(verb, args) if _confirmed(what(args), args) else 1

    parser.set_defaults(run=run)


def _confirmed(what: str, args: argparse.Namespace) -> bool:
    """--yes, or a "y" typed on a terminal; without a terminal (a script) --yes is needed."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print_error(f"not deleting {what}: no terminal to confirm on; pass --yes")
        return False
    answer = input(f"delete {what}? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        print_error(f"{what} not deleted")
        return False
    return True


def _run(verb: Verb, args: argparse.Namespace) -> int:
    async def with_admin() -> int:
        async with Admin(
            args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
        ) as admin:
            return await verb(admin, args)

    return run_verb(with_admin(), args)


# -- the verbs ------------------------------------------------------------------------------


def _print_pairs(pairs: dict[str, str], args: argparse.Namespace, what: dict[str, Any]) -> int:
    """A KEY VALUE table sorted by key, or {**what, "values": pairs} with --json."""
    if wants_json(args):
        emit_json({**what, "values": dict(sorted(pairs.items()))})
        return 0
    print_table([["KEY", "VALUE"], *([key, pairs[key]] for key in sorted(pairs))])
    return 0


async def _broker_status(admin: Admin, args: argparse.Namespace) -> int:
    info = await admin.broker_runtime_info(args.broker)
    return _print_pairs(info, args, {"broker": args.broker})


async def _broker_config_get(admin: Admin, args: argparse.Namespace) -> int:
    config = await admin.broker_config(args.broker)
    if args.key:
        missing = [key for key in args.key if key not in config]
        if missing:
            print_error(f"broker {args.broker} has no setting {', '.join(missing)}")
            return 1
        config = {key: config[key] for key in args.key}
    return _print_pairs(config, args, {"broker": args.broker})


async def _broker_config_set(admin: Admin, args: argparse.Namespace) -> int:
    changes = dict(args.changes)
    addrs = [args.broker] if args.broker else await admin.master_addresses(args.cluster)
    if not addrs:
        print_error(f"cluster {args.cluster} has no master registered")
        return 1
    for addr in addrs:
        await admin.update_broker_config(addr, changes)
        print(f"broker {addr}: " + " ".join(f"{k}={v}" for k, v in changes.items()))
    return 0


async def _topic_delete(admin: Admin, args: argparse.Namespace) -> int:
    await admin.delete_topic(args.topic, cluster=args.cluster)
    print(f"topic {args.topic} deleted")
    return 0


async def _group_list(admin: Admin, args: argparse.Namespace) -> int:
    groups = sorted(await admin.groups())
    if wants_json(args):
        emit_json({"groups": groups})
    else:
        for group in groups:
            print(group)
    return 0


async def _group_delete(admin: Admin, args: argparse.Namespace) -> int:
    await admin.delete_group(args.group, cluster=args.cluster, remove_offset=args.clean_offset)
    print(f"group {args.group} deleted" + (" with its offsets" if args.clean_offset else ""))
    return 0


async def _consumer_connection(admin: Admin, args: argparse.Namespace) -> int:
    answer = jsonable(await admin.consumer_connections(args.group))
    return _print_answer({"group": args.group, **answer}, args)


async def _producer_connection(admin: Admin, args: argparse.Namespace) -> int:
    answer = jsonable(await admin.producer_connections(args.group, args.topic))
    return _print_answer({"group": args.group, "topic": args.topic, **answer}, args)


async def _message_resend(admin: Admin, args: argparse.Namespace) -> int:
    message = await admin.resend_message(args.id.strip().upper(), args.group, topic=args.topic)
    print(
        f"message {message.msg_id} of {message.topic} resent to group {args.group}"
        f" (stored in {pm.retry_topic(args.group)})"
    )
    return 0


# -- relaying answers -----------------------------------------------------------------------


def _print_answer(document: dict[str, Any], args: argparse.Namespace) -> int:
    """--json: the document. Else scalars as "key: value" lines, then one table per list of
    records (connections, subscriptions), titled by its key."""
    if wants_json(args):
        emit_json(document)
        return 0
    for key, value in document.items():
        if not isinstance(value, list | dict):
            print(f"{key}: {value}")
    for key, value in document.items():
        records = list(value.values()) if isinstance(value, dict) else value
        if isinstance(value, list | dict) and all(isinstance(r, dict) for r in records):
            title = key.replace("_", " ")
            print(f"{title}:" if records else f"{title}: none")
            print_table(records_rows(records))
    return 0
