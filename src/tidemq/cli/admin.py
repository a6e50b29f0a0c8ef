"""Admin verbs: topic, cluster, send, consume, message, group (`cluster list` is cli/cluster.py,
`message query` and `group progress` cli/lookup.py).

Thin: each verb parses flags, calls the blocking client (`tidemq.client.blocking`) and prints a
table or a line. Errors from the cluster are printed as one line and the verb exits 1, so scripts
can branch on it; cli/hints.py words the ones a newcomer meets (a missing topic, -n at a broker).

`send` takes user properties (-p k=v), a delay level or a delivery time; `consume` a tag
expression (-e) or a SQL92 filter on those properties (--sql, brokers with enablePropertyFilter).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from tidemq.cli import cluster as cli_cluster
from tidemq.cli import dlq, lookup, ops
from tidemq.cli import trace as cli_trace
from tidemq.cli.credentials import credentials_of
from tidemq.cli.hints import fail, print_error, property_pair, time_ms, with_namesrv
from tidemq.cli.lookup import print_message
from tidemq.cli.output import add_json_flag, emit_json, wants_json
from tidemq.cli.progress import track
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import tls_of
from tidemq.errors import QueueError

if TYPE_CHECKING:
    from tidemq.client.blocking import BlockingPullConsumer
    from tidemq.client.selector import MessageSelector
    from tidemq.protocol.bodies import MessageQueue


def add_parsers(verbs: Any, *, namesrv_default: str) -> None:
    """Add the admin verbs to the `tidemq` command, in the order `--help` lists them."""
    _add_parsers_topic(verbs, namesrv_default)
    _add_parsers_cluster(verbs, namesrv_default)
    _add_parsers_send(verbs, namesrv_default)
    _add_parsers_consume(verbs, namesrv_default)
    _add_parsers_message(verbs, namesrv_default)
    _add_parsers_group(verbs, namesrv_default)
    ops.add_parsers(verbs, namesrv_default=namesrv_default)  # consumer, producer, broker status


def _verb(verbs: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = verbs.add_parser(name, help=help_text)
    return parser


def _add_parsers_topic(verbs: Any, namesrv_default: str) -> None:
    topic = _verb(verbs, "topic", "create, list and inspect topics")
    actions = topic.add_subparsers(dest="action", required=True)
    create = with_namesrv(
        actions.add_parser("create", help="create or update a topic"), namesrv_default
    )
    create.add_argument("-t", "--topic", required=True)
    create.add_argument("-q", "--queues", type=int, default=8, help="read and write queues")
    create.add_argument("-p", "--perm", type=int, default=6, help="6 read+write, 4 read, 2 write")
    create.add_argument("-c", "--cluster", help="every master of this cluster (default: all)")
    create.add_argument("-b", "--broker-addr", help="only this broker")
    create.add_argument("--order", action="store_true", help="an ordered topic")
    create.set_defaults(run=run_topic_create)
    listing = with_namesrv(
        actions.add_parser("list", help="every topic the name server knows"), namesrv_default
    )
    add_json_flag(listing).set_defaults(run=run_topic_list)
    route = with_namesrv(
        actions.add_parser("route", help="brokers and queues of a topic"), namesrv_default
    )
    route.add_argument("-t", "--topic", required=True)
    add_json_flag(route).set_defaults(run=run_topic_route)
    stats = with_namesrv(
        actions.add_parser("stats", help="min/max offset per queue"), namesrv_default
    )
    stats.add_argument("-t", "--topic", required=True)
    add_json_flag(stats).set_defaults(run=run_topic_stats)
    ops.add_topic_actions(actions, namesrv_default)  # delete


def _add_parsers_cluster(verbs: Any, namesrv_default: str) -> None:
    cluster = _verb(verbs, "cluster", "brokers of each cluster")
    actions = cluster.add_subparsers(dest="action", required=True)
    cli_cluster.add_actions(actions, namesrv_default)  # list: roles, offsets, replication lag


def _add_parsers_send(verbs: Any, namesrv_default: str) -> None:
    send = with_namesrv(_verb(verbs, "send", "send messages"), namesrv_default)
    send.add_argument("-t", "--topic", required=True)
    send.add_argument("-b", "--body", default=None, help="message body (default: read stdin)")
    send.add_argument("--tags", default=None)
    send.add_argument("-k", "--keys", default=None, help="space-separated keys")
    send.add_argument("-c", "--count", type=int, default=1, help="send the body this many times")
    send.add_argument("-g", "--group", default="TIDEMQ_CLI_PRODUCER", help="producer group")
    send.add_argument(
        "-p",
        "--property",
        type=property_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a user property (repeat for more); consumers can select on it with --sql",
    )
    when = send.add_mutually_exclusive_group()
    when.add_argument(
        "--delay-level", type=int, default=0, metavar="N", help="delay level 1..18 (1 s ... 2 h)"
    )
    when.add_argument(
        "--deliver-at",
        type=time_ms,
        default=None,
        metavar="TIME",
        help="deliver at this time: ms since the epoch or a date-time such as "
        "2026-11-25T10:00 (local) or 2026-11-25T10:00Z",
    )
    send.set_defaults(run=run_send)


def _add_parsers_consume(verbs: Any, namesrv_default: str) -> None:
    consume = with_namesrv(
        _verb(verbs, "consume", "read messages and commit the group's offsets"), namesrv_default
    )
    consume.add_argument("-t", "--topic", required=True)
    consume.add_argument("-g", "--group", default="TIDEMQ_CLI_CONSUMER")
    selected_by = consume.add_mutually_exclusive_group()
    selected_by.add_argument(
        "-e", "--expression", default="*", help="tag expression, e.g. 'A || B'"
    )
    selected_by.add_argument(
        "--sql",
        default=None,
        metavar="EXPR",
        help="SQL92 filter on properties, e.g. \"a > 5 AND region = 'eu'\" "
        "(brokers need enablePropertyFilter=true)",
    )
    consume.add_argument("-c", "--count", type=int, default=None, help="stop after this many")
    consume.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the earliest offset instead of the group's committed one",
    )
    consume.add_argument(
        "--wait-seconds",
        type=float,
        default=3.0,
        help="stop when nothing new arrives for this long",
    )
    consume.set_defaults(run=run_consume)


def _add_parsers_message(verbs: Any, namesrv_default: str) -> None:
    message = _verb(verbs, "message", "look messages up")
    actions = message.add_subparsers(dest="action", required=True)
    query = with_namesrv(
        actions.add_parser("query", help="by key or by message id"), namesrv_default
    )
    query.add_argument(
        "-t", "--topic", help="topic (needed with --key; with --id a msgId is looked up faster)"
    )
    found_by = query.add_mutually_exclusive_group(required=True)
    found_by.add_argument("-k", "--key")
    found_by.add_argument(
        "-i", "--id", help="the msgId or the offsetMsgId that send and consume print"
    )
    add_json_flag(query).set_defaults(run=lookup.run_message_query)
    ops.add_message_actions(actions, namesrv_default)  # resend
    cli_trace.add_parser(actions, with_namesrv, namesrv_default)  # trace


def _add_parsers_group(verbs: Any, namesrv_default: str) -> None:
    group = _verb(verbs, "group", "consumer groups")
    actions = group.add_subparsers(dest="action", required=True)
    progress = with_namesrv(actions.add_parser("progress", help="lag per queue"), namesrv_default)
    progress.add_argument("-g", "--group", required=True)
    progress.add_argument("-t", "--topic", default=None)
    add_json_flag(progress).set_defaults(run=lookup.run_group_progress)
    dlq.add_group_actions(actions, namesrv_default=namesrv_default)  # reset-offset
    ops.add_group_actions(actions, namesrv_default)  # list, delete


def _admin(args: argparse.Namespace) -> Any:
    from tidemq.client.blocking import BlockingAdmin

    return BlockingAdmin(args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args))


def run_topic_create(args: argparse.Namespace) -> int:
    try:
        with _admin(args) as admin:
            addrs = admin.create_topic(
                args.topic,
                cluster=args.cluster,
                broker_addr=args.broker_addr,
                read_queue_nums=args.queues,
                write_queue_nums=args.queues,
                perm=args.perm,
                order=args.order,
            )
    except QueueError as error:
        return fail(error, args)
    print(f"topic {args.topic} created on {', '.join(addrs)}")
    return 0


def run_topic_list(args: argparse.Namespace) -> int:
    try:
        with _admin(args) as admin:
            topics = admin.topic_list()
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):
        emit_json({"topics": topics})
        return 0
    for name in topics:
        print(name)
    return 0


def run_topic_route(args: argparse.Namespace) -> int:
    try:
        with _admin(args) as admin:
            route = admin.topic_route(args.topic)
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):
        emit_json(route)
        return 0
    rows = [["BROKER", "ADDRESSES", "READ", "WRITE", "PERM"]]
    addresses = {b.broker_name: b.broker_addrs for b in route.broker_datas}
    for queue in sorted(route.queue_datas, key=lambda q: q.broker_name):
        addrs = ",".join(
            f"{i}={a}" for i, a in sorted(addresses.get(queue.broker_name, {}).items())
        )
        rows.append(
            [
                queue.broker_name,
                addrs,
                str(queue.read_queue_nums),
                str(queue.write_queue_nums),
                str(queue.perm),
            ]
        )
    print_table(rows)
    return 0


def run_topic_stats(args: argparse.Namespace) -> int:
    try:
        with _admin(args) as admin:
            stats = admin.topic_stats(args.topic)
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):
        emit_json(
            {
                "topic": args.topic,
                "queues": [
                    {
                        "broker_name": queue.broker_name,
                        "queue_id": queue.queue_id,
                        "min_offset": offset.min_offset,
                        "max_offset": offset.max_offset,
                        "last_update_timestamp": offset.last_update_timestamp,
                    }
                    for queue, offset in stats.offset_table.items()
                ],
            }
        )
        return 0
    rows = [["BROKER", "QUEUE", "MIN", "MAX", "LAST UPDATE"]]
    for queue, offset in stats.offset_table.items():
        rows.append(
            [
                queue.broker_name,
                str(queue.queue_id),
                str(offset.min_offset),
                str(offset.max_offset),
                _when(offset.last_update_timestamp),
            ]
        )
    print_table(rows)
    return 0


def run_send(args: argparse.Namespace) -> int:
    from tidemq.client.blocking import BlockingProducer
    from tidemq.client.message import Message

    body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
    keys = tuple(args.keys.split()) if args.keys else ()
    try:
        message = Message(
            args.topic,
            body,
            tags=args.tags,
            keys=keys,
            properties=dict(args.property),
            delay_level=args.delay_level,
            deliver_time_ms=args.deliver_at,
        )
    except ValueError as error:
        print_error(str(error))
        return 2
    try:
        with (
            BlockingProducer(
                args.group, args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
            ) as producer,
            track("sending", args.count, show=args.count > 1) as bar,
        ):
            for _ in range(args.count):
                result = producer.send(message)
                bar.advance()
                queue = result.message_queue
                print(
                    f"{result.status.name} msgId={result.msg_id} offsetMsgId={result.offset_msg_id}"
                    f" queue={queue.broker_name}:{queue.queue_id} offset={result.queue_offset}"
                )
    except QueueError as error:
        return fail(error, args)
    return 0


def run_consume(args: argparse.Namespace) -> int:
    from tidemq.client.blocking import BlockingPullConsumer
    from tidemq.client.selector import MessageSelector

    selector = (
        MessageSelector.by_sql(args.sql) if args.sql else MessageSelector.by_tag(args.expression)
    )
    counts = _Counts()
    try:
        with (
            BlockingPullConsumer(
                args.group, args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
            ) as consumer,
            track("consuming", args.count) as bar,
        ):
            queues = consumer.fetch_subscribe_message_queues(args.topic)
            offsets = {}
            for queue in queues:
                start = consumer.fetch_consumer_offset(queue)
                offsets[queue] = (
                    consumer.min_offset(queue) if args.from_beginning or start < 0 else start
                )
            idle_since = time.monotonic()
            while args.count is None or counts.received < args.count:
                before = counts.received
                found = [_pull_once(args, consumer, selector, q, offsets, counts) for q in queues]
                progressed = any(found)  # every queue is pulled each round, found or not
                bar.advance(counts.received - before)
                if progressed:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > args.wait_seconds:
                    break
                else:
                    time.sleep(0.05)  # polling a CLI loop; long polling serves real consumers
    except QueueError as error:
        return fail(error, args)
    summary = f", {counts.skipped} undecodable skipped" if counts.skipped else ""
    print(f"{counts.received} message(s){summary}", file=sys.stderr)
    return 0


class _Counts:
    """What `consume` has printed and skipped so far."""

    def __init__(self) -> None:
        self.received = 0
        self.skipped = 0


def _pull_once(
    args: argparse.Namespace,
    consumer: BlockingPullConsumer,
    selector: MessageSelector,
    queue: MessageQueue,
    offsets: dict[MessageQueue, int],
    counts: _Counts,
) -> bool:
    """Pull one batch of `queue`, print it and commit; whether messages were found."""
    from tidemq.client.message import PullStatus

    result = consumer.pull(queue, selector, offsets[queue], 32)
    # Undecodable records are skipped (the offset moves past them), not fatal.
    for bad in result.undecodable:
        counts.skipped += 1
        print(
            f"skipped undecodable message [{queue.broker_name}:{queue.queue_id}"
            f"@{bad.queue_offset}]: {bad.reason}",
            file=sys.stderr,
        )
    for message in result.messages:
        if args.count is not None and counts.received >= args.count:
            break
        counts.received += 1
        offsets[queue] = message.queue_offset + 1
        print_message(message)
    else:
        offsets[queue] = result.next_begin_offset
    consumer.update_consumer_offset(queue, offsets[queue])
    return bool(result.status is PullStatus.FOUND)


def _when(timestamp_ms: int) -> str:
    if timestamp_ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp_ms / 1000))
