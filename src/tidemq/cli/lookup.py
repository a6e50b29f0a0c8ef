"""`tidemq message query --id` and `tidemq group progress`: looking things up by what the user has.

A message has two ids, both 32 hex characters for IPv4 and 56 for IPv6 (protocol/message_id.py),
and `send` and `consume` print both or the first:

    msgId        UNIQ_KEY, made by the producer: IP (4|16) | pid (2) | instance (4) | ms (4) | n (2)
    offsetMsgId  made by the broker:             IP (4|16) | port (4) | commit-log offset (8)

The layout alone cannot tell them apart: a UNIQ_KEY's "port" field is the producer's pid & 0xFFFF
and two bytes of its instance, which decodes as a port 1..65535 whenever the pid is a multiple of
65536. So an id is an offsetMsgId only when the host:port it decodes to is a broker the name
server lists; that broker is asked (VIEW_MESSAGE_BY_ID), and if it has no such message the id is
taken as a UNIQ_KEY after all. A UNIQ_KEY is looked up in the brokers' index (QUERY_MESSAGE with
uniqueKeyQuery), on -t's topic or, without -t, on every topic the name server lists. Nothing else
is dialled: a UNIQ_KEY would otherwise send the CLI to the producer's IP.

`group progress` of a group no broker has heard of would be an empty table and "total lag: 0":
a typo in -g looks like a healthy group. A group is unknown when no broker holds an offset for
it on any topic and none of its consumers is online; the verb then says so and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

from tidemq.cli.credentials import credentials_of
from tidemq.cli.hints import run_verb
from tidemq.cli.output import emit_json, message_document, wants_json
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import tls_of
from tidemq.client.admin import Admin
from tidemq.client.message import MessageExt
from tidemq.errors import (
    BrokerError,
    ProtocolError,
    SystemErrorError,
    error_for_code,
)
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import ConsumeStats, MessageQueue, OffsetWrapper
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerListByGroupRequestHeader,
    GetConsumeStatsRequestHeader,
)
from tidemq.remoting.address import normalise_host, parse_address

PORT_MAX: Final = 65_535
ID_LENGTHS: Final = (32, 56)  # hex characters of an id made on IPv4, on IPv6 (either kind)
_HEX: Final = frozenset("0123456789ABCDEF")


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args))


def is_message_id(msg_id: str) -> bool:
    """Whether `msg_id` (upper case) has the form of either id: 32 or 56 hex characters."""
    return len(msg_id) in ID_LENGTHS and _HEX.issuperset(msg_id)


def offset_msg_id_broker(msg_id: str) -> tuple[str, int] | None:
    """(host, port) `msg_id` names if it is read as an offsetMsgId, or None when it cannot be
    one. A UNIQ_KEY may decode to a host and port as well: see broker_addresses."""
    try:
        host, port, physical_offset = pm.decode_offset_msg_id(msg_id)
    except (ProtocolError, ValueError):
        return None
    if not 0 < port <= PORT_MAX or physical_offset < 0:
        return None
    return normalise_host(host), port


async def broker_addresses(admin: Admin) -> set[tuple[str, int]]:
    """(host, port) of every broker, master or slave, the name server lists."""
    info = await admin.cluster_info()
    found: set[tuple[str, int]] = set()
    for broker in info.broker_addr_table.values():
        for addr in broker.broker_addrs.values():
            try:
                host, port = parse_address(addr)
            except ValueError:
                continue
            found.add((normalise_host(host), port))
    return found


def print_message(message: MessageExt) -> None:
    body = message.body.decode("utf-8", errors="replace")
    print(
        f"[{message.broker_name}:{message.queue_id}@{message.queue_offset}] "
        f"msgId={message.msg_id} tags={message.tags or ''} keys={' '.join(message.keys)} {body}"
    )


async def _by_unique_key(admin: Admin, msg_id: str, topic: str | None) -> list[MessageExt]:
    topics = [topic] if topic else await admin.topic_list()
    found: list[MessageExt] = []
    for name in topics:
        try:
            messages = await admin.query_message_by_key(name, msg_id, unique_key=True)
        except BrokerError as error:
            if topic or error.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            continue  # listed but gone (deleted, or its broker not registered yet)
        found.extend(m for m in messages if m.msg_id.upper() == msg_id)
    return found


async def _by_id(admin: Admin, msg_id: str, topic: str | None) -> list[MessageExt]:
    """The message `msg_id` names: by offsetMsgId when it names a listed broker, else (or when
    that broker has no such message) by UNIQ_KEY."""
    broker = offset_msg_id_broker(msg_id)
    if broker is not None and broker in await broker_addresses(admin):
        try:
            return [await admin.view_message(msg_id)]
        except (SystemErrorError, ProtocolError):  # "can not find message by the offset"
            pass  # a UNIQ_KEY that happens to decode to a broker's address
    return await _by_unique_key(admin, msg_id, topic)


async def _query(args: argparse.Namespace) -> int:
    msg_id = args.id.strip().upper() if args.id else ""
    if args.id and not is_message_id(msg_id):
        print(
            f"tidemq: {args.id!r} is not a message id (32 or 56 hex characters: the msgId or"
            " offsetMsgId that send and consume print)",
            file=sys.stderr,
        )
        return 2
    async with _admin(args) as admin:
        if args.id:
            messages = await _by_id(admin, msg_id, args.topic)
        elif not args.topic:
            print("tidemq: --key needs --topic", file=sys.stderr)
            return 2
        else:
            messages = await admin.query_message_by_key(args.topic, args.key)
    if wants_json(args):
        emit_json({"messages": [message_document(m) for m in messages]})
    else:
        for message in messages:
            print_message(message)
    if not messages:
        where = f"topic {args.topic}" if args.topic else "any topic"
        print(f"no message found on {where}", file=sys.stderr)
        return 1
    return 0


def run_message_query(args: argparse.Namespace) -> int:
    return run_verb(_query(args), args)


async def online(admin: Admin, group: str, addrs: list[str]) -> bool:
    """Whether a broker at one of `addrs` sees a consumer of `group` connected."""
    header = GetConsumerListByGroupRequestHeader(consumer_group=group)
    for addr in addrs:
        cmd = RemotingCommand(
            code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields=header.to_fields()
        )
        response = await admin.instance.remoting.invoke(addr, cmd, admin.timeout_ms)
        if response.code == ResponseCode.SUCCESS:  # a group without members is an error answer
            return True
    return False


async def offsets_anywhere(admin: Admin, group: str, addrs: list[str]) -> ConsumeStats:
    """The group's offsets on every topic of the brokers at `addrs` (GET_CONSUME_STATS without
    a topic). Admin.consume_stats only asks the brokers of the group's retry topic, which a
    group that only ever pulled does not have."""
    header = GetConsumeStatsRequestHeader(consumer_group=group)
    table: dict[MessageQueue, OffsetWrapper] = {}
    for addr in addrs:
        cmd = RemotingCommand(code=RequestCode.GET_CONSUME_STATS, ext_fields=header.to_fields())
        response = await admin.instance.remoting.invoke(addr, cmd, admin.timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for_code(response.code, response.remark)
        table.update(ConsumeStats.from_json(response.body).offset_table)
    return ConsumeStats(offset_table=dict(sorted(table.items())))


async def _progress(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        masters = await admin.master_addresses()
        anywhere = await offsets_anywhere(admin, args.group, masters)
        if not anywhere.offset_table and not await online(admin, args.group, masters):
            print(
                f"tidemq: group {args.group} is unknown: no broker holds an offset for it and"
                " none of its consumers is online (check -g)",
                file=sys.stderr,
            )
            return 1
        stats = await admin.consume_stats(args.group, args.topic)
    if args.topic is None:
        stats = ConsumeStats(
            offset_table=dict(sorted({**anywhere.offset_table, **stats.offset_table}.items()))
        )
    if wants_json(args):
        emit_json(_progress_document(args.group, stats))
    else:
        _print_progress(stats)
    return 0


def _lag(offset: OffsetWrapper) -> int:
    return max(0, offset.broker_offset - max(offset.consumer_offset, 0))


def _progress_document(group: str, stats: ConsumeStats) -> dict[str, object]:
    queues = [
        {
            "topic": queue.topic,
            "broker_name": queue.broker_name,
            "queue_id": queue.queue_id,
            "broker_offset": offset.broker_offset,
            "consumer_offset": offset.consumer_offset,
            "last_timestamp": offset.last_timestamp,
            "lag": _lag(offset),
        }
        for queue, offset in stats.offset_table.items()
    ]
    total = sum(_lag(offset) for offset in stats.offset_table.values())
    return {"group": group, "queues": queues, "total_lag": total}


def _print_progress(stats: ConsumeStats) -> None:
    rows = [["TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG"]]
    total = 0
    for queue, offset in stats.offset_table.items():
        lag = _lag(offset)
        total += lag
        rows.append(
            [
                queue.topic,
                queue.broker_name,
                str(queue.queue_id),
                str(offset.broker_offset),
                str(offset.consumer_offset),
                str(lag),
            ]
        )
    print_table(rows)
    print(f"total lag: {total}")


def run_group_progress(args: argparse.Namespace) -> int:
    return run_verb(_progress(args), args)
