"""Which queues a push consumer holds: asking who owns what, where a new queue starts, and how
queues are given up. The allocation itself is pure (rebalance.py); this is its I/O.

Giving queues up is where a group start or a scale-out makes duplicates. The new owner starts
from the offset the broker holds at the moment it asks; whatever the old owner consumes after
that, or consumed without committing it yet, is delivered twice. So `release_queues` gives up
every queue of a rebalance round together, in three steps:

    1. stop      mark every released process queue dropped and cancel its pull loop, all at
                 once and before any await: from here no listener call starts for any of them
                 (a concurrent batch waiting for a slot checks `dropped` first). Orderly: a
                 batch already with the listener is waited for (ORDERLY_RELEASE_WAIT_MS at
                 most), as upstream waits for its consume lock; its result then counts
    2. commit    send every released queue's offset (the lowest unfinished message) at once:
                 one round trip for the lot, not one per queue; one that failed or landed on
                 a slave is tried once more on the master (no later round sends it again)
    3. release   forget the offsets; orderly: UNLOCK_BATCH_MQ, so the new owner may lock,
                 except for a queue whose listener call is still running: its broker lock is
                 left to expire, so the new owner never consumes it alongside that call

as upstream drops the process queue and persists its offset on rebalance. Giving queues up one
at a time (stop, commit, next queue) kept the later queues consuming for a round trip per queue
while their new owners had already started (10 queues took ~190 ms, 8-13 % duplicates). Two more
things shorten the race (PushConsumer.rebalance): a round commits the offsets changed so far
while it asks who is in the group, so a new owner that reads an offset before the release still
reads about where the old owner is; and a round that takes queues reads all their first offsets
at once (one round trip, not one per queue), so it does not hold back the next round, which may
be the one that gives queues up.

What is left duplicated is what was in flight: listener calls already running when the queues
were dropped (their results no longer move the offset), and what the old owner consumed between
its last commit and the new owner's offset query, about one pull batch per queue at most.
tests/integration/test_group_start_duplicates.py states the bound and measures it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Final

from tidemq.errors import BrokerError, ClientError, ProtocolError, QueueError
from tidemq.protocol.bodies import MessageQueue

from . import api
from .instance import ClientInstance
from .message import ConsumeFromWhere
from .offset_store import InitialOffset, OffsetTable, initial_offset_rule
from .process_queue import ProcessQueue
from .rebalance import allocate_averagely
from .route_cache import subscribe_queues

logger = logging.getLogger(__name__)


# Orderly: how long giving a queue up waits for the listener call in progress on it (a call is
# not cut short: the listener may be a thread). Upstream tries its consume lock for 1 s and
# retries at the next rebalance (20 s); one round here waits longer instead of coming back.
# Past it the broker lock is not released but left to expire (60 s, broker side).
ORDERLY_RELEASE_WAIT_MS: Final = 5_000
# A last commit (a queue given up, shutdown) that failed or landed on a slave is tried once more
# on the master with this deadline: a healthy master answers a commit in milliseconds, and one
# that is down should not hold a rebalance round or a shutdown for a full request timeout.
LAST_COMMIT_MASTER_TIMEOUT_MS: Final = 1_000


@dataclass(slots=True)
class OwnedQueue:
    """A queue this consumer holds: its process queue, the next offset to pull, its tasks.

    Orderly: `call` is the batch task with the listener (shielded from the loop's cancellation),
    and `released` is set once the queue's offset was committed for giving it up: a call that
    ends later must not record an offset for a queue this consumer no longer holds."""

    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    call: asyncio.Task[bool] | None = None
    released: bool = False

    @property
    def in_call(self) -> bool:
        """Whether a listener call of this queue's (orderly) is running."""
        return self.call is not None and not self.call.done()


async def wait_for_calls(owned: list[OwnedQueue], wait_ms: float) -> set[MessageQueue]:
    """Wait up to `wait_ms` for the listener calls running on `owned`; the queues still in one."""
    calls = {queue.call: queue.mq for queue in owned if queue.call is not None and queue.in_call}
    if not calls:
        return set()
    _, running = await asyncio.wait(calls, timeout=wait_ms / 1000)
    return {calls[call] for call in running}


async def allocate(
    instance: ClientInstance, group: str, topic: str, *, clustering: bool
) -> list[MessageQueue] | None:
    """This consumer's queues of `topic`; None means "unknown, change nothing this round"."""
    try:
        route = await instance.route(topic)
    except QueueError as exc:
        logger.debug("%s: no route for %s yet: %s", group, topic, exc)
        return None
    queues = subscribe_queues(topic, route)
    if not clustering:
        return queues
    # One broker per group, as reads go (the master, else a slave: heartbeats reach both).
    for broker_name in sorted({b.broker_name for b in route.broker_datas}):
        try:
            target = instance.reads.target(broker_name)
            ids = await api.consumer_ids(instance, group, target)
        except (ClientError, BrokerError, ProtocolError) as exc:
            logger.info("%s: consumer list from %s failed: %s", group, broker_name, exc)
            continue
        if instance.client_id not in ids:
            # The broker has not seen our heartbeat yet: say hello and wait for next round.
            await instance.heartbeat()
            return None
        return allocate_averagely(instance.client_id, queues, ids)
    return None


async def first_offset(
    instance: ClientInstance,
    group: str,
    mq: MessageQueue,
    *,
    known: int | None,
    consume_from_where: ConsumeFromWhere,
    consume_timestamp_ms: int | None,
) -> int:
    """Where a newly held queue starts: the stored offset, else the CONSUME_FROM_* rule.

    `known` is the locally kept offset (broadcasting); None asks the broker (clustering).
    """
    if known is None:
        stored = await api.query_consumer_offset(instance, group, mq)
    else:
        stored = known
    if stored >= 0:
        return stored
    rule = initial_offset_rule(consume_from_where, mq.topic)
    if rule is InitialOffset.ZERO:
        return 0
    if rule is InitialOffset.BY_TIMESTAMP and consume_timestamp_ms is not None:
        return await api.search_offset(instance, mq, consume_timestamp_ms)
    return await api.max_offset(instance, mq)


async def commit_offsets(
    instance: ClientInstance, group: str, offsets: dict[MessageQueue, int]
) -> list[MessageQueue]:
    """Send every offset to its broker concurrently; returns the queues to commit again: those
    whose commit failed, and those stored in a slave because the master did not answer (the
    master's copy replaces the slave's once it is back, so the offset must reach it too)."""
    ordered = sorted(offsets.items())
    results = await asyncio.gather(
        *(api.update_consumer_offset(instance, group, mq, offset) for mq, offset in ordered),
        return_exceptions=True,
    )
    again: list[MessageQueue] = []
    for (mq, offset), result in zip(ordered, results, strict=True):
        if isinstance(result, (ClientError, BrokerError)):
            logger.warning("%s: commit %s=%d failed: %s", group, mq, offset, result)
            again.append(mq)
        elif isinstance(result, BaseException):
            raise result
        elif result.is_slave:
            again.append(mq)
    return again


async def commit_last_offsets(
    instance: ClientInstance, group: str, offsets: dict[MessageQueue, int]
) -> list[MessageQueue]:
    """`commit_offsets` for offsets no later round sends again (queues given up, shutdown):
    each that failed or landed on a slave is tried once more on the master directly, with
    LAST_COMMIT_MASTER_TIMEOUT_MS (one transport error, a connection that closed under the
    request, sends a commit to the slave, whose copy the master's older one then replaces).
    Returns the queues whose offset the master may still lack, and logs them."""
    again = await commit_offsets(instance, group, offsets)
    if not again:
        return []
    results = await asyncio.gather(
        *(
            api.commit_on_master(instance, group, mq, offsets[mq], LAST_COMMIT_MASTER_TIMEOUT_MS)
            for mq in again
        ),
        return_exceptions=True,
    )
    missing: list[MessageQueue] = []
    for mq, result in zip(again, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, QueueError):
            raise result
        if result is not True:
            missing.append(mq)
    if missing:
        logger.warning(
            "%s: the master has not taken the last offset of %s (stored in a slave or nowhere; "
            "a new owner may consume from an older one)",
            group,
            ", ".join(f"{mq}={offsets[mq]}" for mq in missing),
        )
    return missing


async def release_queues(
    instance: ClientInstance,
    group: str,
    owned: list[OwnedQueue],
    offsets: OffsetTable,
    *,
    clustering: bool,
    orderly: bool,
) -> None:
    """Give up `owned` together: stop them all, commit their offsets, then release them."""
    if not owned:
        return
    # 1. Stop: synchronous up to the first await, so no listener call starts for any of them.
    for queue in owned:
        queue.pq.drop()
        for task in queue.tasks:
            task.cancel()
    await asyncio.gather(*(t for q in owned for t in q.tasks), return_exceptions=True)
    # Orderly: the batch with the listener is not cancelled with its loop; its result counts.
    busy = await wait_for_calls(owned, ORDERLY_RELEASE_WAIT_MS) if orderly else set()
    for queue in owned:
        queue.released = True
    mqs = [queue.mq for queue in owned]
    if clustering:
        # 2. Commit (broadcasting offsets stay in the local file, kept for a later return).
        held = {mq: offset for mq in mqs if (offset := offsets.get(mq)) is not None}
        try:
            await commit_last_offsets(instance, group, held)
        finally:
            # Forgotten even if the commit raised: a later commit round must not send them.
            for mq in mqs:
                offsets.remove(mq)
        # 3. Release the broker locks (orderly), now that the offsets are in.
        if orderly:
            if busy:
                logger.warning(
                    "%s: listener still running on %s after %d ms: not unlocked (the lock "
                    "expires on the broker)",
                    group,
                    ", ".join(map(str, sorted(busy))),
                    ORDERLY_RELEASE_WAIT_MS,
                )
            if unlock := [mq for mq in mqs if mq not in busy]:
                await api.unlock_queues(instance, group, unlock)
    logger.info("%s: stopped consuming %s", group, ", ".join(map(str, sorted(mqs))))
