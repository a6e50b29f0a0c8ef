"""`tidemq dlq list|resend` and `tidemq group reset-offset`: operator verbs over a group's offsets.

    tidemq dlq list   -g GROUP [-n NAMESRV] [--limit N]
        QUEUE  OFFSET  TOPIC  RECONSUMED  STORED  ORIGIN MSGID  RESENT  BODY
    tidemq dlq resend -g GROUP [-n NAMESRV] [--count N]
    tidemq group reset-offset -g GROUP -t TOPIC (--to-time TIME | --to-earliest | --to-latest)
        TIME: ms since the epoch or an ISO date-time, local unless it says Z or +hh:mm

Dead letters of a group live in `%DLQ%<group>` (broker/handlers/send_back.py), each with its
original topic in RETRY_TOPIC and its first msgId in ORIGIN_MESSAGE_ID. `resend` sends each to
that topic again as a fresh message (reconsume count 0) keeping its user properties, tags, keys,
UNIQ_KEY (so consumers that deduplicate by msgId recognise it) and ORIGIN_MESSAGE_ID; the broker's
bookkeeping properties are dropped. How far `resend` got is the group's own consumer offset on
`%DLQ%<group>` (UPDATE_CONSUMER_OFFSET), so running it twice does not send a message twice and
`list` can mark what was re-sent. Reading uses a separate pull group and never joins GROUP, so
live consumers of the group are not rebalanced.

`reset-offset` computes one offset per queue of the topic (GET_MIN_OFFSET, GET_MAX_OFFSET, or
SEARCH_OFFSET_BY_TIMESTAMP, which answers the message stored nearest the time, as RocketMQ 4.x
does) and stores it with UPDATE_CONSUMER_OFFSET. A running consumer would overwrite it with its
next commit, so the group must be stopped: the verb refuses while the brokers see a live member,
unless --force.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from tidemq.cli.credentials import add_options, credentials_of
from tidemq.cli.hints import run_verb, time_ms
from tidemq.cli.lookup import online
from tidemq.cli.output import add_json_flag, emit_json, message_document, wants_json
from tidemq.cli.progress import track
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import add_client_flags, tls_of
from tidemq.client import api
from tidemq.client.admin import Admin
from tidemq.client.message import Message, MessageExt, PullStatus
from tidemq.client.producer import Producer
from tidemq.client.route_cache import master_addresses, subscribe_queues
from tidemq.errors import BrokerError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import PullSysFlag

# The pull group the tool reads dead letters with (never GROUP itself, see the docstring).
READER_GROUP: Final = "TIDEMQ_CLI_DLQ_READER"
PRODUCER_GROUP: Final = "TIDEMQ_CLI_DLQ_PRODUCER"
PULL_BATCH: Final = 32
BODY_PREVIEW_CHARS: Final = 40
# Broker bookkeeping a re-sent message must not carry (its retry history, parking, timers).
_DROPPED_ON_RESEND: Final = frozenset(
    {
        pm.KEYS,
        pm.TAGS,
        pm.WAIT,
        pm.DELAY,
        pm.RETRY_TOPIC,
        pm.REAL_TOPIC,
        pm.REAL_QID,
        pm.TRAN_MSG,
        pm.PGROUP,
        pm.MIN_OFFSET,
        pm.MAX_OFFSET,
        pm.RECONSUME_TIME,
        pm.MAX_RECONSUME_TIMES,
        pm.CONSUME_START_TIME,
        pm.TRAN_PREPARED_QUEUE_OFFSET,
        pm.TRANSACTION_CHECK_TIMES,
        pm.CLUSTER,
        pm.TIMER_DELIVER_MS,
        pm.TIMER_DELAY_SEC,
        pm.TIMER_DELAY_MS,
    }
)


def add_parsers(verbs: Any, *, namesrv_default: str) -> None:
    dlq: argparse.ArgumentParser = verbs.add_parser("dlq", help="a group's dead letters")
    actions = dlq.add_subparsers(dest="action", required=True)
    listing = _common(actions.add_parser("list", help="dead letters of a group"), namesrv_default)
    listing.add_argument("--limit", type=int, default=100, help="rows shown")
    add_json_flag(listing).set_defaults(run=run_dlq_list)
    resend = _common(
        actions.add_parser("resend", help="send dead letters to their original topic again"),
        namesrv_default,
    )
    resend.add_argument("-c", "--count", type=int, default=None, help="at most this many")
    resend.set_defaults(run=run_dlq_resend)


def add_group_actions(group_actions: Any, *, namesrv_default: str) -> None:
    """`tidemq group reset-offset`, added to cli/admin.py's `group` verb."""
    reset: argparse.ArgumentParser = group_actions.add_parser(
        "reset-offset",
        help="move a stopped group's offsets on a topic (stop the group's consumers first)",
        description="Store new consumer offsets for GROUP on every queue of TOPIC. Stop the "
        "group's consumers first: a running consumer overwrites the offsets with its next commit.",
    )
    _common(reset, namesrv_default)
    reset.add_argument("-t", "--topic", required=True)
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument(
        "--to-time",
        type=time_ms,
        metavar="TIME",
        help="ms since the epoch or a date-time: 2026-11-25T10:00 (local), 2026-11-25T10:00Z",
    )
    to.add_argument(
        "--timestamp",
        type=time_ms,
        metavar="TIME",
        help="as mqadmin resetOffsetByTime: the brokers reset the offsets and tell the group's "
        "live consumers (no need to stop them); ms since the epoch or a date-time",
    )
    to.add_argument("--to-earliest", action="store_true", help="each queue's first offset")
    to.add_argument("--to-latest", action="store_true", help="each queue's end (skip all)")
    reset.add_argument(
        "--force",
        action="store_true",
        help="even while consumers are online; with --timestamp: move queues forward too "
        "(mqadmin's isForce; without it only queues it moves back are reset)",
    )
    add_json_flag(reset).set_defaults(run=run_group_reset_offset)


def _common(parser: argparse.ArgumentParser, namesrv_default: str) -> argparse.ArgumentParser:
    parser.add_argument(
        "-n", "--namesrv-addr", default=namesrv_default, help="name servers, ';'-separated"
    )
    parser.add_argument("-g", "--group", required=True, help="consumer group")
    add_options(parser)  # --access-key / --secret-key
    add_client_flags(parser, default=argparse.SUPPRESS)  # --tls, --tls-ca, ...
    return parser


# -- dead letters ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    queue: MessageQueue
    message: MessageExt
    resent: bool


async def _dlq_queues(admin: Admin, group: str) -> list[MessageQueue] | None:
    """The queues of %DLQ%<group>, or None when the group has never had a dead letter."""
    topic = pm.dlq_topic(group)
    try:
        route = await admin.topic_route(topic)
    except BrokerError as error:
        if error.response_code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        raise
    return subscribe_queues(topic, route)


async def _read(
    admin: Admin,
    group: str,
    queue: MessageQueue,
    *,
    unsent_only: bool,
    limit: int | None,
    on_letter: Callable[[DeadLetter], Awaitable[None]],
) -> None:
    """Call `on_letter` for each dead letter of `queue` in offset order, up to `limit`."""
    instance = admin.instance
    resent_below = max(await api.query_consumer_offset(instance, group, queue), 0)
    offset = await api.min_offset(instance, queue)
    if unsent_only:
        offset = max(offset, resent_below)
    end = await api.max_offset(instance, queue)
    count = 0
    while offset < end and (limit is None or count < limit):
        result = await api.pull(
            instance,
            queue,
            group=READER_GROUP,
            expression=pm.SUB_ALL,
            offset=offset,
            max_nums=PULL_BATCH,
            sys_flag=int(PullSysFlag.SUBSCRIPTION),
            timeout_ms=admin.timeout_ms,
        )
        for message in result.messages:
            if limit is not None and count >= limit:
                return
            count += 1
            await on_letter(DeadLetter(queue, message, message.queue_offset < resent_below))
        if result.status is not PullStatus.FOUND and result.next_begin_offset <= offset:
            return  # nothing more readable (a hole the broker will not move us past)
        offset = max(result.next_begin_offset, offset + len(result.messages))


async def _list(args: argparse.Namespace) -> int:
    async with Admin(
        args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
    ) as admin:
        queues = await _dlq_queues(admin, args.group)
        if not queues and wants_json(args):
            emit_json({"group": args.group, "dead_letters": []})
            return 0
        if not queues:
            print(f"no dead letters for group {args.group}")
            return 0
        rows = [["QUEUE", "OFFSET", "TOPIC", "RECONSUMED", "STORED", "ORIGIN MSGID", "RESENT"]]
        rows[0].append("BODY")
        letters: list[DeadLetter] = []

        async def keep(letter: DeadLetter) -> None:
            letters.append(letter)

        for queue in queues:
            remaining = args.limit - len(letters)
            if remaining <= 0:
                break
            await _read(
                admin, args.group, queue, unsent_only=False, limit=remaining, on_letter=keep
            )
    if wants_json(args):
        documents = [{**message_document(x.message), "resent": x.resent} for x in letters]
        emit_json({"group": args.group, "dead_letters": documents})
        return 0
    for letter in letters:
        m = letter.message
        body = m.body.decode("utf-8", errors="replace")[:BODY_PREVIEW_CHARS]
        rows.append(
            [
                f"{m.broker_name}:{m.queue_id}",
                str(m.queue_offset),
                m.properties.get(pm.RETRY_TOPIC, "-"),
                str(m.reconsume_times),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.store_timestamp / 1000)),
                m.properties.get(pm.ORIGIN_MESSAGE_ID) or m.msg_id,
                "yes" if letter.resent else "no",
                body.replace("\n", " "),
            ]
        )
    print_table(rows)
    print(f"{len(letters)} dead letter(s) shown")
    return 0


def resend_message(letter: MessageExt) -> Message | None:
    """The message that re-sends a dead letter to its original topic; None if none recorded."""
    topic = letter.properties.get(pm.RETRY_TOPIC)
    if not topic:
        return None
    properties = {k: v for k, v in letter.properties.items() if k not in _DROPPED_ON_RESEND}
    properties.setdefault(pm.UNIQ_KEY, letter.msg_id)
    properties.setdefault(pm.ORIGIN_MESSAGE_ID, letter.msg_id)
    return Message(
        topic,
        letter.body,
        tags=letter.tags,
        keys=letter.keys,
        properties=properties,
        flag=letter.flag,
    )


async def _resend(args: argparse.Namespace) -> int:
    sent = skipped = 0
    async with (
        Admin(args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)) as admin,
        Producer(
            PRODUCER_GROUP, args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
        ) as producer,
    ):

        async def resend(letter: DeadLetter) -> None:
            nonlocal sent, skipped
            message = resend_message(letter.message)
            if message is None:
                skipped += 1
                print(f"skipped {letter.message.msg_id}: no original topic", file=sys.stderr)
            else:
                result = await producer.send(message)
                sent += 1
                print(f"resent {result.msg_id} to {message.topic}")
            # Commit after each one, so an interrupted resend does not repeat what it sent.
            done_below = letter.message.queue_offset + 1
            await api.update_consumer_offset(admin.instance, args.group, letter.queue, done_below)

        with track("resending", args.count) as bar:

            async def resend_one(letter: DeadLetter) -> None:
                await resend(letter)
                bar.advance()

            for queue in await _dlq_queues(admin, args.group) or []:
                limit = None if args.count is None else args.count - sent - skipped
                if limit is not None and limit <= 0:
                    break
                await _read(
                    admin, args.group, queue, unsent_only=True, limit=limit, on_letter=resend_one
                )
    print(f"{sent} dead letter(s) resent" + (f", {skipped} skipped" if skipped else ""))
    return 0


def run_dlq_list(args: argparse.Namespace) -> int:
    return run_verb(_list(args), args)


def run_dlq_resend(args: argparse.Namespace) -> int:
    return run_verb(_resend(args), args)


# -- offsets --------------------------------------------------------------------------------


async def _reset(args: argparse.Namespace) -> int:
    async with Admin(
        args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args)
    ) as admin:
        if args.timestamp is not None:
            return await _reset_by_brokers(admin, args)
        route = await admin.topic_route(args.topic)
        if not args.force and await online(
            admin, args.group, sorted(master_addresses(route).values())
        ):
            print(
                f"tidemq: group {args.group} has consumers online; stop them first "
                "(or --force: they will overwrite the new offsets)",
                file=sys.stderr,
            )
            return 1
        moved: list[tuple[MessageQueue, int, int]] = []
        instance = admin.instance
        queues = subscribe_queues(args.topic, route)
        with track("resetting", len(queues)) as bar:
            for queue in queues:
                offset = await _target_offset(admin, queue, args)
                old = await api.query_consumer_offset(instance, args.group, queue)
                await api.update_consumer_offset(instance, args.group, queue, offset)
                moved.append((queue, old, offset))
                bar.advance()
    if wants_json(args):
        documents = [
            {"broker_name": q.broker_name, "queue_id": q.queue_id, "old": old, "offset": new}
            for q, old, new in moved
        ]
        emit_json({"group": args.group, "topic": args.topic, "queues": documents})
        return 0
    rows = [["BROKER", "QUEUE", "OLD", "NEW"]]
    rows += [[q.broker_name, str(q.queue_id), str(old), str(new)] for q, old, new in moved]
    print_table(rows)
    return 0


async def _target_offset(admin: Admin, queue: MessageQueue, args: argparse.Namespace) -> int:
    """Where --to-earliest, --to-latest or --to-time puts `queue`."""
    instance = admin.instance
    if args.to_earliest:
        return await api.min_offset(instance, queue)
    if args.to_latest:
        return await api.max_offset(instance, queue)
    return await api.search_offset(instance, queue, args.to_time)


async def _reset_by_brokers(admin: Admin, args: argparse.Namespace) -> int:
    """--timestamp: INVOKE_BROKER_TO_RESET_OFFSET on every broker of the topic (Admin), which
    also tells live consumers (RESET_CONSUMER_CLIENT_OFFSET); prints the new offsets. Without
    --force (mqadmin's isForce false) a queue is only moved back, never forward. One request
    per broker, nothing to count: no bar."""
    offsets = await admin.reset_offset_by_timestamp(
        args.group, args.topic, args.timestamp, force=args.force
    )
    ordered = sorted(offsets.items())
    if wants_json(args):
        emit_json(
            {
                "group": args.group,
                "topic": args.topic,
                "timestamp": args.timestamp,
                "queues": [
                    {"broker_name": q.broker_name, "queue_id": q.queue_id, "offset": offset}
                    for q, offset in ordered
                ],
            }
        )
        return 0
    rows = [["BROKER", "QUEUE", "NEW"]]
    rows += [[q.broker_name, str(q.queue_id), str(offset)] for q, offset in ordered]
    print_table(rows)
    return 0


def run_group_reset_offset(args: argparse.Namespace) -> int:
    return run_verb(_reset(args), args)
