"""`tidemq message trace --id MSGID`: a message's timeline from the trace topic (client/trace.py).

One row per trace record, oldest first: when, what (sent, delivered, consumed, sent back,
dead-lettered, transaction ended), which group, and the details the record carries. With --json
one document {"msg_id", "trace_topic", "records": [...]} whose records are the decoded fields.
Exit status 1 when no record names the message (tracing off, or the id unknown).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from tidemq.cli.credentials import credentials_of
from tidemq.cli.hints import run_verb
from tidemq.cli.output import add_json_flag, emit_json, wants_json
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import tls_of
from tidemq.client.admin import Admin
from tidemq.client.trace import message_trace
from tidemq.protocol import trace as tr
from tidemq.protocol.names import RMQ_SYS_TRACE_TOPIC


def add_parser(actions: Any, with_namesrv: Any, namesrv_default: str) -> None:
    """`trace` under cli/admin.py's `message` verb (`with_namesrv` adds -n and credentials)."""
    parser = with_namesrv(
        actions.add_parser("trace", help="a message's trace timeline (message trace on)"),
        namesrv_default,
    )
    parser.add_argument("-i", "--id", required=True, help="the msgId (or offsetMsgId) traced")
    parser.add_argument(
        "-t",
        "--topic",
        default=RMQ_SYS_TRACE_TOPIC,
        help=f"the trace topic (msgTraceTopicName; default {RMQ_SYS_TRACE_TOPIC})",
    )
    add_json_flag(parser).set_defaults(run=run_message_trace)


def run_message_trace(args: argparse.Namespace) -> int:
    return run_verb(_trace(args), args)


async def _trace(args: argparse.Namespace) -> int:
    msg_id = args.id.strip().upper()
    admin = Admin(args.namesrv_addr, credentials=credentials_of(args), tls=tls_of(args))
    async with admin:
        records = await message_trace(admin, msg_id, trace_topic=args.topic)
    if wants_json(args):
        emit_json(
            {
                "msg_id": msg_id,
                "trace_topic": args.topic,
                "records": [r.to_dict() for r in records],
            }
        )
    else:
        print_table(timeline_rows(records))
    if not records:
        print(f"no trace of {msg_id} in {args.topic}", file=sys.stderr)
        return 1
    return 0


def timeline_rows(records: list[tr.TraceRecord]) -> list[list[str]]:
    """The table: header, then one row per record."""
    rows = [["TIME", "EVENT", "GROUP", "TOPIC", "DETAIL"]]
    for record in records:
        rows.append(
            [
                _time(record.timestamp),
                event_name(record),
                record.group or "-",
                record.topic or "-",
                detail(record),
            ]
        )
    return rows


def _time(timestamp_ms: int) -> str:
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_name(record: tr.TraceRecord) -> str:
    """What happened, in words (SubAfter's meaning depends on success and contextCode)."""
    if record.trace_type == tr.PUB:
        return "sent" if record.success else "send failed"
    if record.trace_type == tr.SUB_BEFORE:
        return "delivered"
    if record.trace_type == tr.END_TRANSACTION:
        return "transaction " + (record.transaction_state or "?")
    if record.success:
        return "consumed"
    if record.context_code == tr.CONTEXT_DLQ:
        return "moved to DLQ"
    return "consume failed"


def detail(record: tr.TraceRecord) -> str:
    """The record's other fields worth reading, as key=value words."""
    words: list[str] = []
    if record.trace_type == tr.PUB:
        names = tr.MSG_TYPE_NAMES
        kind = names[record.msg_type] if 0 <= record.msg_type < len(names) else record.msg_type
        words += [f"type={kind}", f"store={record.store_host}", f"bytes={record.body_length}"]
        words += [f"cost={record.cost_time}ms", f"offsetMsgId={record.offset_msg_id}"]
    elif record.trace_type == tr.SUB_BEFORE:
        words += [f"retry={record.retry_times}"]
    elif record.trace_type == tr.END_TRANSACTION:
        words += [f"txId={record.transaction_id or '-'}"]
        words += [f"fromCheck={str(record.from_transaction_check).lower()}"]
    else:
        words += [f"cost={record.cost_time}ms", f"context={record.context_code}"]
    if record.tags:
        words.append(f"tags={record.tags}")
    if record.keys:
        words.append(f"keys={record.keys}")
    if record.request_id:
        words.append(f"request={record.request_id}")
    return " ".join(words)
