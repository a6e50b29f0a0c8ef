"""A message's trace: the records the brokers (brokerTraceEnable, broker/trace.py) or tracing
clients wrote about it to the trace topic, found as the dashboard finds them.

Trace messages are keyed by each traced msgId (protocol/trace.py), so QUERY_MESSAGE by key =
msgId over the trace topic returns every trace message naming it. One trace message may carry
records of other messages too (clients batch them): only the records of `msg_id` are kept.

Traces name a message by its msgId (the producer's UNIQ_KEY) when it has one: an offsetMsgId
finds nothing then, so when the id itself finds nothing and it names a message stored on one
of the cluster's brokers, that message is viewed and its UNIQ_KEY asked for instead.
"""

from __future__ import annotations

import logging
from typing import Final

from tidemq.client.admin import Admin
from tidemq.errors import ProtocolError, QueueError
from tidemq.protocol import trace as tr
from tidemq.protocol.message_id import decode_offset_msg_id
from tidemq.protocol.names import RMQ_SYS_TRACE_TOPIC

log = logging.getLogger(__name__)

# Trace messages asked of each broker (one per msgId per writer turn on the broker side, so a
# message delivered and retried many times has a few dozen).
TRACE_MESSAGES_MAX: Final = 512
# Records of one moment are shown in the order things happen to a message.
_TYPE_ORDER: Final = {t: n for n, t in enumerate(tr.TRACE_TYPES)}


async def message_trace(
    admin: Admin,
    msg_id: str,
    *,
    trace_topic: str = RMQ_SYS_TRACE_TOPIC,
    max_messages: int = TRACE_MESSAGES_MAX,
) -> list[tr.TraceRecord]:
    """The trace records of `msg_id` (its msgId / UNIQ_KEY, or an offsetMsgId when the message
    had none), oldest first. A trace message whose body does not decode is skipped (logged).

    Raises:
        the admin's errors: no route for the trace topic (tracing never on), broker failures.
    """
    records = await _records_of(admin, msg_id, trace_topic, max_messages)
    if not records:
        unique_key = await _unique_key_of(admin, msg_id)
        if unique_key is not None:
            records = await _records_of(admin, unique_key, trace_topic, max_messages)
    return sorted(records, key=lambda r: (r.timestamp, _TYPE_ORDER.get(r.trace_type, 9)))


async def _unique_key_of(admin: Admin, msg_id: str) -> str | None:
    """The UNIQ_KEY of the message `msg_id` names as an offsetMsgId, if it is one of a broker
    of the cluster (a UNIQ_KEY also looks like one: its host is the producer's) and has one."""
    try:
        host, port, _ = decode_offset_msg_id(msg_id)
    except ProtocolError:
        return None
    info = await admin.cluster_info()
    addresses = {a for b in info.broker_addr_table.values() for a in b.broker_addrs.values()}
    if f"{host}:{port}" not in addresses:
        return None
    try:
        message = await admin.view_message(msg_id)
    except QueueError as exc:
        log.info("message %s could not be viewed: %s", msg_id, exc)
        return None
    return message.msg_id if message.msg_id != message.offset_msg_id else None


async def _records_of(
    admin: Admin, msg_id: str, trace_topic: str, max_messages: int
) -> list[tr.TraceRecord]:
    messages = await admin.query_message_by_key(trace_topic, msg_id, max_num=max_messages)
    records: list[tr.TraceRecord] = []
    seen: set[str] = set()
    for message in messages:
        if message.offset_msg_id in seen:
            continue
        seen.add(message.offset_msg_id)
        try:
            decoded = tr.decode_records(message.body.decode("utf-8", "replace"))
        except ProtocolError as exc:
            log.warning("trace message %s skipped: %s", message.offset_msg_id, exc)
            continue
        records.extend(r for r in decoded if r.msg_id == msg_id)
    return records
