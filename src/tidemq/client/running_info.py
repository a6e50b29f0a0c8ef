"""Answers to the broker's requests about one consumer (remoting.md §4.13), wired by
ClientInstance:

- GET_CONSUMER_RUNNING_INFO (307), relayed by a broker for an admin tool: the consumer's settings
  (upstream's PROP_* keys plus its own), subscriptions, and each queue it holds (committed offset,
  cached messages, lock) as upstream's ConsumerRunningInfo;
- RESET_CONSUMER_CLIENT_OFFSET (220, oneway), sent by a broker that reset the group's offsets:
  the group's consumer continues the named queues from the new offsets (client/reset_offset.py).
  Its body is fastjson's map form or the C++ list form; both are read.

A consumer answers only if it implements the matching protocol below (the push consumer does);
a group this process does not consume is answered SYSTEM_ERROR as upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tidemq._version import __version__
from tidemq.errors import ProtocolError
from tidemq.limits import MIB
from tidemq.protocol import bodies_admin as ba
from tidemq.protocol.bodies import MessageQueue, SubscriptionData
from tidemq.protocol.bodies_admin import ConsumerRunningInfo, ProcessQueueInfo, ResetOffsetBody
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_admin import (
    GetConsumerRunningInfoRequestHeader,
    ResetOffsetRequestHeader,
)
from tidemq.remoting.connection import Connection

if TYPE_CHECKING:  # consumer.py and instance.py (which assignment.py imports) import this
    from .assignment import OwnedQueue
    from .consumer import PushConsumer
    from .offset_store import OffsetTable

logger = logging.getLogger(__name__)


@runtime_checkable
class Reporting(Protocol):
    """A consumer that can describe itself (GET_CONSUMER_RUNNING_INFO)."""

    def running_info(self) -> ConsumerRunningInfo: ...


@runtime_checkable
class Resettable(Protocol):
    """A consumer whose queues can be moved (RESET_CONSUMER_CLIENT_OFFSET)."""

    def reset_offsets(self, table: Mapping[MessageQueue, int]) -> None: ...


def build(
    settings: Mapping[str, object],
    subscriptions: list[SubscriptionData],
    queues: Mapping[MessageQueue, OwnedQueue],
    offsets: OffsetTable,
) -> ConsumerRunningInfo:
    """The running info of a push consumer: `settings` become properties (as upstream lists
    its consumer's configuration there), each held queue a ProcessQueueInfo."""
    properties = {key: _text(value) for key, value in settings.items()}
    properties.setdefault(ba.PROP_CONSUME_TYPE, "CONSUME_PASSIVELY")
    properties.setdefault(ba.PROP_CLIENT_VERSION, f"TideMQ {__version__}")
    table: dict[MessageQueue, ProcessQueueInfo] = {}
    for mq, state in queues.items():
        pq = state.pq
        committed = offsets.get(mq)
        table[mq] = ProcessQueueInfo(
            commit_offset=committed if committed is not None else -1,
            cached_msg_count=pq.cached_count,
            cached_msg_size_in_mib=pq.cached_bytes // MIB,
            locked=pq.locked,
            dropped=pq.dropped,
        )
    return ConsumerRunningInfo(
        properties=properties, subscription_set=subscriptions, mq_table=table
    )


# The push consumer's attributes listed in its running info (upstream lists its config there).
_SETTINGS = (
    "group",
    "message_model",
    "consume_from_where",
    "pull_batch_size",
    "consume_batch_max",
    "max_reconsume_times",
    "pull_threshold_messages",
    "pull_threshold_bytes",
)


def settings_of(consumer: PushConsumer, started_at_ms: int, threads: int) -> dict[str, object]:
    """Upstream's PROP_* keys and the push consumer's settings (its public attributes)."""
    settings: dict[str, object] = {
        ba.PROP_CONSUMER_START_TIMESTAMP: started_at_ms,
        ba.PROP_THREADPOOL_CORE_SIZE: threads,
    }
    for name in _SETTINGS:
        value = getattr(consumer, name)
        key = "consumerGroup" if name == "group" else _camel(name)
        settings[key] = getattr(value, "name", value)  # an enum by its name
    settings[ba.PROP_CONSUME_ORDERLY] = consumer.orderly
    settings[ba.PROP_NAMESERVER_ADDR] = ";".join(consumer.instance.namesrv_addrs)
    settings["clientId"] = consumer.instance.client_id
    return settings


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def answer_running_info(
    consumers: Mapping[str, object], connection: Connection, request: RemotingCommand
) -> RemotingCommand:
    header = GetConsumerRunningInfoRequestHeader.from_fields(request.ext_fields)
    consumer = consumers.get(header.consumer_group)
    if not isinstance(consumer, Reporting):
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            remark=f"The Consumer Group <{header.consumer_group}> not exist in this consumer",
        )
    return request.response(ResponseCode.SUCCESS, body=consumer.running_info().to_json())


async def apply_reset(
    consumers: Mapping[str, object], connection: Connection, request: RemotingCommand
) -> RemotingCommand | None:
    """A oneway request: nothing is answered; a body that cannot be read is logged."""
    try:
        header = ResetOffsetRequestHeader.from_fields(request.ext_fields)
        body = ResetOffsetBody.from_json(request.body)
    except ProtocolError as exc:
        logger.warning("unreadable offset reset from %s: %s", connection.peer_text, exc)
        return None
    consumer = consumers.get(header.group)
    if not isinstance(consumer, Resettable):
        return None
    table = {mq: offset for mq, offset in body.offset_table.items() if mq.topic == header.topic}
    logger.info("%s: offsets of %s reset by %s", header.group, header.topic, connection.peer_text)
    consumer.reset_offsets(table)
    return None
