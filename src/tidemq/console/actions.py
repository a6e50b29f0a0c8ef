"""The console's writes: reset a group's offsets, delete a group, resend a message to a group.

Each is two steps. A GET (or a POST without `confirm`) computes and shows what would change and
writes nothing; only a POST carrying `confirm=yes` writes. The plan is computed again at confirm
time: offsets may have moved since the first step, and the result page shows what was written.

A reset is INVOKE_BROKER_TO_RESET_OFFSET, sent here to each master of the topic side by side so the
result page can say what each broker did (Admin.reset_offset_by_timestamp stops at the first
failure); each broker also tells live consumers (RESET_CONSUMER_CLIENT_OFFSET), so it works with
the group online. Delete and resend are the Admin's (client/admin_groups.py): a resend stores a
copy in %RETRY%<group> with upstream's retry properties (RETRY_TOPIC = the original topic,
ORIGIN_MESSAGE_ID), which only that group's consumers read, also for a dead letter. Every write is
shielded: once sent, nothing cancels it half way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

from tidemq.client import api
from tidemq.client.admin import Admin
from tidemq.client.message import MessageExt
from tidemq.client.route_cache import master_addresses, subscribe_queues
from tidemq.errors import QueueError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.bodies_admin import ResetOffsetBody
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.headers_admin import ResetOffsetRequestHeader

from . import reads

# Queues whose target offset a plan looks up (one SEARCH_OFFSET_BY_TIMESTAMP each, at most
# reads.CONCURRENCY_MAX at once); the brokers compute the rest when the reset is confirmed.
PLAN_QUEUES_MAX: Final = 1_000


@dataclass(frozen=True, slots=True)
class OffsetChange:
    queue: MessageQueue
    old: int
    new: int


@dataclass(slots=True)
class Plan:
    """What a reset would change: `changes` for the first PLAN_QUEUES_MAX of `total` queues."""

    changes: list[OffsetChange]
    total: int

    @property
    def not_shown(self) -> int:
        return self.total - len(self.changes)


@dataclass(slots=True)
class BrokerOutcome:
    """One master's part of a write: the queues it changed, or why it failed."""

    addr: str
    changes: list[OffsetChange] = field(default_factory=list)
    error: str = ""


async def current_offsets(admin: Admin, group: str, topic: str) -> dict[MessageQueue, int]:
    """The group's committed offsets on `topic`: one GET_CONSUME_STATS per master of the
    topic (not one request per queue)."""
    masters = master_addresses(await reads.route(admin, topic))
    stats = await reads.consume_stats(admin, masters.values(), group, topic)
    return {q: o.consumer_offset for q, o in stats.items() if q.topic == topic}


async def reset_plan(admin: Admin, group: str, topic: str, timestamp_ms: int) -> Plan:
    """Per queue of `topic`: the group's offset now and the offset of the message stored nearest
    `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP), which a reset would store. Writes nothing."""
    queues = subscribe_queues(topic, await reads.route(admin, topic))
    old = await current_offsets(admin, group, topic)
    limit = asyncio.Semaphore(reads.CONCURRENCY_MAX)

    async def search(queue: MessageQueue) -> int:
        async with limit:
            return await reads.bounded(api.search_offset(admin.instance, queue, timestamp_ms))

    shown = queues[:PLAN_QUEUES_MAX]
    targets = await asyncio.gather(*(search(q) for q in shown))
    changes = [OffsetChange(q, old.get(q, -1), new) for q, new in zip(shown, targets, strict=True)]
    return Plan(changes, len(queues))


async def reset_apply(
    admin: Admin, group: str, topic: str, timestamp_ms: int
) -> list[BrokerOutcome]:
    """INVOKE_BROKER_TO_RESET_OFFSET on each master of the topic, side by side: each stores the
    offsets and tells the group's live consumers. Shielded: once sent, no timeout or dropped
    connection cancels a broker's part half way; the page reports each broker's outcome."""
    masters = master_addresses(await reads.route(admin, topic))
    before = await current_offsets(admin, group, topic)
    header = ResetOffsetRequestHeader(
        topic=topic, group=group, timestamp=timestamp_ms, is_force=True
    ).to_fields()

    async def one(addr: str) -> BrokerOutcome:
        outcome = BrokerOutcome(addr)
        try:
            body = await reads.invoke(
                admin, addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header
            )
        except QueueError as error:
            outcome.error = str(error) or type(error).__name__
            return outcome
        written = ResetOffsetBody.from_json(body).offset_table
        outcome.changes = [
            OffsetChange(q, before.get(q, -1), offset) for q, offset in sorted(written.items())
        ]
        return outcome

    writes = asyncio.gather(*(one(addr) for addr in sorted(set(masters.values()))))
    return list(await asyncio.shield(writes))


async def delete_group(admin: Admin, group: str) -> list[str]:
    """DELETE_SUBSCRIPTIONGROUP with its offsets (removeOffset) on every master; the
    addresses asked. Shielded: a started delete is finished on every master."""
    return await asyncio.shield(admin.delete_group(group, remove_offset=True))


def retry_topic_of(message: MessageExt) -> str:
    """The topic a resent copy shows its consumers: for a retried or dead letter, its first."""
    return message.properties.get(pm.RETRY_TOPIC) or message.topic


async def resend(admin: Admin, message: MessageExt, group: str) -> str:
    """Deliver `message` again to `group` alone (a copy into %RETRY%<group>); its msg id."""
    await asyncio.shield(admin.resend_message(message.offset_msg_id, group))
    return message.msg_id
