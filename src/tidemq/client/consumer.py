"""The asyncio push consumer: rebalance, long-poll pulls per queue, listener calls, offsets.

    rebalance (every 10 s, and at once on NOTIFY_CONSUMER_IDS_CHANGED)
      per subscribed topic: route → readable queues; clustering: consumer ids from one broker of
      the topic → allocate_averagely (rebalance.py); broadcasting: every queue
      new queue → first offset (stored offset, else the CONSUME_FROM_* rule of offset_store.py)
                → orderly: LOCK_BATCH_MQ first → start its pull loop
      dropped queues → all at once: stop their pull loops and listener calls (orderly: wait
                for the batch with the listener), commit their offsets, orderly:
                UNLOCK_BATCH_MQ (assignment.py: why at once)
    pull loop (one task per queue)
      wait while the queue caches ≥ pull_threshold messages (flow control)
      PULL_MESSAGE sysFlag SUSPEND|SUBSCRIPTION(|COMMIT_OFFSET): held ≤ 15 s, 30 s timeout
      to the master of the queue's group, or the broker id its last answer suggested, or a slave
      while the master fails (read_route.py)
      → ProcessQueue → listener; on a transport error wait 3 s and try again. A record that
      cannot be decoded (e.g. COMPRESSED but not zlib) is skipped, counted in
      `undecodable_count` and logged (rate-limited), and the offset moves past it
      (pull_answer.py), so it never blocks the messages behind it
    listener
      concurrent (consume_concurrently.py): batches of ≤ consume_batch_max run as tasks,
        ≤ consume_concurrency at once; a failed batch is sent back for a later retry.
      orderly (consume_orderly.py): one batch at a time per queue, only while its broker lock is
        held; a failed batch is retried in place, then sent to the dead-letter queue.
    offsets committed every 5 s and at shutdown: clustering to the broker (the master whenever
      the route lists it, a slave only if that request fails: an offset stored in a slave is
      committed again each round, and at shutdown tried once more on the master, so it reaches
      the master once that is back), broadcasting to a JSON file under `offset_store_dir`.

Clustering consumers also subscribe `%RETRY%<group>` with "*"; messages from it reach the listener
with their original topic restored from the RETRY_TOPIC property.

Listeners may be sync (run in a thread pool of `consume_concurrency` threads) or async callables
taking list[MessageExt]; returning None or a success status is success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import BrokerError, ClientError, ProtocolError, SubscriptionParseFailedError
from tidemq.limits import MIB, PULL_SUSPEND_MS_DEFAULT, PULL_TIMEOUT_MS_DEFAULT
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import ConsumerData, MessageQueue
from tidemq.protocol.bodies_admin import ConsumerRunningInfo
from tidemq.protocol.headers import PullSysFlag
from tidemq.security.signing import Credentials

from . import api, running_info
from .assignment import (
    OwnedQueue,
    allocate,
    commit_last_offsets,
    commit_offsets,
    first_offset,
    release_queues,
)
from .consume_concurrently import ConcurrentConsumption
from .consume_orderly import OrderlyConsumption
from .instance import ClientInstance
from .iterate import MessageIterator, MessageStream
from .listener import (
    Listener,
    Subscription,
    call_listener,
    restore_retry_topic,
    subscription_table,
)
from .message import (
    ConsumeFromWhere,
    MessageExt,
    MessageModel,
    PullStatus,
)
from .offset_store import LocalOffsetFile, OffsetTable
from .process_queue import ProcessQueue
from .pull_answer import UndecodableLog
from .read_route import PullSuggestions
from .rebalance import diff_assignment
from .reset_offset import reset_queues
from .selector import Selectable, check_sql_subscriptions, warn_if_sql_looking
from .tls import TlsOption

logger = logging.getLogger(__name__)

REBALANCE_INTERVAL_MS: Final = 10_000
PERSIST_INTERVAL_MS: Final = 5_000
# Pause after a failed pull, as RocketMQ's pullTimeDelayMillsWhenException.
PULL_ERROR_DELAY_MS: Final = 3_000
# After an answer that asks to retry at once but moves nothing (a slave that has not yet copied
# the consumer's offset, with the master it points to down): the next pull waits this long
# instead of spinning on the slave.
PULL_STALLED_DELAY_MS: Final = 200
# How long shutdown waits for listener calls already running before committing offsets.
SHUTDOWN_CONSUME_WAIT_MS: Final = 10_000
# Flow control per queue, as RocketMQ's pullThresholdForQueue / pullThresholdSizeForQueue.
PULL_THRESHOLD_MESSAGES_DEFAULT: Final = 1_000
PULL_THRESHOLD_BYTES_DEFAULT: Final = 100 * MIB


def _broadcast_offset_file(
    model: MessageModel, group: str, store_dir: Path | str | None, name: str | ClientInstance | None
) -> LocalOffsetFile | None:
    """Where a broadcasting consumer keeps its offsets (None: clustering, the broker keeps them),
    keyed by a name stable across restarts (the instance name, not the client id: it has the
    pid)."""
    if model is not MessageModel.BROADCASTING:
        return None
    base = Path(store_dir) if store_dir else Path.home() / ".tidemq_offsets"
    label = name.instance_name if isinstance(name, ClientInstance) else name or "DEFAULT"
    return LocalOffsetFile.for_group(base, label, group)


class PushConsumer(ConcurrentConsumption, OrderlyConsumption):
    """Consumes the subscribed topics for `group`, calling the listener, or as a stream:

        async with PushConsumer("CG", addr, subscriptions={"Orders": "created"}) as consumer:
            async for message in consumer:
                ...

    `subscriptions` maps each topic to a tag expression or a MessageSelector (as `subscribe`);
    `listener` is as `register_listener`. Without a listener, `async for` reads the messages
    (client/iterate.py: what counts as consumed, and when a message goes back for a retry).
    """

    _started = False
    _closed = False
    # What `async for` reads, made by start() when no listener was given.
    _stream: MessageStream | None = None
    _started_at_ms = 0

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        subscriptions: Mapping[str, Selectable] | None = None,
        listener: Listener | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        consume_concurrency: int = 20,
        pull_batch_size: int = 32,
        consume_batch_max: int = 1,
        max_reconsume_times: int = 16,
        orderly: bool = False,
        pull_threshold_messages: int = PULL_THRESHOLD_MESSAGES_DEFAULT,
        pull_threshold_bytes: int = PULL_THRESHOLD_BYTES_DEFAULT,
        suspend_current_queue_ms: int = 1_000,
        offset_store_dir: Path | str | None = None,
        rebalance_interval_ms: float = REBALANCE_INTERVAL_MS,
        persist_interval_ms: float = PERSIST_INTERVAL_MS,
        clock: Clock | None = None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = False,
    ) -> None:
        pm.validate_group(group)
        if consume_concurrency < 1 or pull_batch_size < 1 or consume_batch_max < 1:
            raise ValueError("consume_concurrency, pull_batch_size, consume_batch_max must be >= 1")
        self._group = group
        self._instance = instance or ClientInstance(
            namesrv_addr,
            clock=clock,
            instance_name=instance_name,
            credentials=credentials,
            tls=tls,
        )
        self._clock = self._instance.clock
        self.message_model = MessageModel(message_model)
        self.consume_from_where = ConsumeFromWhere(consume_from_where)
        self.consume_timestamp_ms = consume_timestamp_ms
        self.pull_batch_size = pull_batch_size
        self.consume_batch_max = consume_batch_max
        self.max_reconsume_times = max_reconsume_times
        self.orderly = orderly
        self.pull_threshold_messages = pull_threshold_messages
        self.pull_threshold_bytes = pull_threshold_bytes
        self.suspend_current_queue_ms = suspend_current_queue_ms
        self._rebalance_interval_ms = rebalance_interval_ms
        self._persist_interval_ms = persist_interval_ms
        self._subscriptions = subscription_table(subscriptions or {}, self._clock.now_ms())
        self._listener: Listener | None = listener
        self._queues: dict[MessageQueue, OwnedQueue] = {}
        self._offsets = OffsetTable()
        self._pull_from = PullSuggestions()
        self._undecodable = UndecodableLog(group, self._clock)
        self._offset_file = _broadcast_offset_file(
            self.message_model, group, offset_store_dir, instance_name or instance
        )
        self._semaphore = asyncio.Semaphore(consume_concurrency)
        self._executor = ThreadPoolExecutor(
            consume_concurrency, thread_name_prefix=f"tidemq-{group}"
        )
        self._rebalance_wanted = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._consuming: set[asyncio.Task[object]] = set()
        self._retrying: set[asyncio.Task[None]] = set()

    # -- configuration ---------------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def instance(self) -> ClientInstance:
        return self._instance

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    def subscribe(self, topic: str, expression: Selectable = "*") -> None:
        """Consume `topic` messages whose tag matches `expression` ("*", "TagA || TagB"), or
        that a `MessageSelector.by_sql("a > 5")` selects (needs enablePropertyFilter=true on
        the broker; see client/selector.py)."""
        pm.validate_topic(topic)
        warn_if_sql_looking(expression, topic)
        self._subscriptions[topic] = Subscription.parse(topic, expression, self._clock.now_ms())
        if self._started:
            self.trigger_rebalance()

    def register_listener(self, listener: Listener) -> None:
        if self._started:
            raise ClientError("register_listener() before start(), or pass listener=")
        self._listener = listener

    # -- what the instance asks ------------------------------------------------------------

    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            group_name=self._group,
            consume_type=pm.ConsumeType.CONSUME_PASSIVELY,
            message_model=self.message_model,
            consume_from_where=self.consume_from_where,
            subscription_data_set=[s.to_data() for _, s in sorted(self._subscriptions.items())],
            unit_mode=False,
        )

    def topics(self) -> list[str]:
        return sorted(self._subscriptions)

    def trigger_rebalance(self) -> None:
        self._rebalance_wanted.set()

    def assigned_queues(self) -> list[MessageQueue]:
        return sorted(self._queues)

    def running_info(self) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO's answer (client/running_info.py)."""
        return running_info.build(
            running_info.settings_of(self, self._started_at_ms, self._executor._max_workers),
            self.consumer_data().subscription_data_set,
            self._queues,
            self._offsets,
        )

    def reset_offsets(self, table: Mapping[MessageQueue, int]) -> None:
        """An admin reset (RESET_CONSUMER_CLIENT_OFFSET): see client/reset_offset.py."""
        self._spawn(reset_queues(self._rebalance_lock, self._queues, self._start_queue, table))

    @property
    def undecodable_count(self) -> int:
        """Messages skipped because they could not be decoded (e.g. a COMPRESSED body that is
        not zlib data, a CRC mismatch). Each is logged (rate-limited) and committed past, so it
        does not block the queue; see client/pull_answer.py."""
        return self._undecodable.count

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if not self._subscriptions:
            raise ValueError(
                "no topic to consume: pass subscriptions={topic: expression} to PushConsumer, "
                "or call subscribe() before start()"
            )
        if self._listener is None:
            # No listener: the messages wait for `async for message in consumer`.
            self._stream = MessageStream(self._group)
            self._listener = self._stream.deliver
        if self.clustering:
            retry = pm.retry_topic(self._group)
            self._subscriptions.setdefault(
                retry, Subscription.parse(retry, pm.SUB_ALL, self._clock.now_ms())
            )
        elif self._offset_file is not None:
            for mq, offset in self._offset_file.load().items():
                self._offsets.update(mq, offset)
        self._instance.register_consumer(self)
        await self._instance.start()
        self._started, self._started_at_ms = True, self._clock.now_ms()
        await self._instance.refresh_routes()
        await self._instance.heartbeat()
        try:
            await check_sql_subscriptions(self._instance, self._subscriptions.values())
        except SubscriptionParseFailedError:
            await self.shutdown()
            raise
        self._tasks = [
            asyncio.create_task(self._rebalance_loop()),
            asyncio.create_task(self._persist_loop()),
        ]
        if self.orderly and self.clustering:
            self._tasks.append(asyncio.create_task(self._lock_loop()))

    async def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish, commit offsets, unlock, unregister."""
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self._stream.close()  # what no loop finished is not committed (iterate.py)
        if not self._started:
            self._executor.shutdown(wait=False)
            return
        # Pull loops and orderly loops stop at once; listener calls already running (concurrent
        # batches, an orderly queue's batch) finish and their offsets count. Orderly queues are
        # dropped first, so no new batch starts.
        if self.orderly:
            for state in self._queues.values():
                state.pq.drop()
        loops = [*self._tasks, *(t for s in self._queues.values() for t in s.tasks)]
        for task in [*loops, *self._retrying]:
            task.cancel()
        await asyncio.gather(*loops, *self._retrying, return_exceptions=True)
        if self._consuming:
            await asyncio.wait(self._consuming, timeout=SHUTDOWN_CONSUME_WAIT_MS / 1000)
        for state in self._queues.values():
            state.pq.drop()
        await self._persist(all_queues=True)
        if self.orderly and self.clustering:
            # A queue whose listener call still runs keeps its lock until it expires.
            await self._unlock([mq for mq, s in self._queues.items() if not s.in_call])
        self._queues.clear()
        await self._instance.unregister_consumer(self._group)
        await self._instance.shutdown()
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        task = asyncio.current_task()
        if self._stream is not None and task is not None:
            # The message this task's loop is on: finished, or sent back if the block raised.
            # Other tasks' loops may be mid-body: shutdown abandons theirs (iterate.py).
            self._stream.settle(task, ok=exc_type is None)
        await self.shutdown()

    def __aiter__(self) -> MessageIterator:
        """`async for message in consumer`: see the class docstring and client/iterate.py."""
        return MessageIterator(self.stream_to_read())

    @property
    def stream(self) -> MessageStream | None:
        """What `async for` reads (None: not started, or the consumer has a listener)."""
        return self._stream

    def stream_to_read(self) -> MessageStream:
        if self._stream is None:
            if self._listener is not None:
                raise ClientError(
                    f"consumer {self._group} calls its listener; iterate a consumer without one"
                )
            raise ClientError(f"start() consumer {self._group} (or `async with` it) to iterate")
        return self._stream

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._consuming.add(task)
        task.add_done_callback(self._consuming.discard)

    # -- rebalance -------------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        while True:
            self._rebalance_wanted.clear()
            try:
                await self.rebalance()
            except Exception:
                logger.exception("%s: rebalance failed", self._group)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._rebalance_interval_ms / 1000):
                    await self._rebalance_wanted.wait()

    async def rebalance(self) -> None:
        """One rebalance round over every subscribed topic.

        Every topic's share is fetched first, then every queue given up is released together
        (assignment.py), then the new queues start: a round never keeps consuming a queue it is
        giving up while it waits on another queue's commit. While the shares are fetched, the
        offsets changed since the last commit are committed: a new owner that reads a queue's
        offset before this round releases the queue then starts from about where we are, not
        from what the last pull carried.
        """
        async with self._rebalance_lock:
            topics = sorted(self._subscriptions)
            allocations = asyncio.gather(
                *(
                    allocate(self._instance, self._group, topic, clustering=self.clustering)
                    for topic in topics
                )
            )
            if self.clustering:
                shares, _ = await asyncio.gather(allocations, self._persist(all_queues=False))
            else:
                shares = await allocations
            # A topic whose share is unknown this round (None) keeps what it has.
            pairs = zip(topics, shares, strict=True)
            wanted = {topic: mine for topic, mine in pairs if mine is not None}
            given_up: list[MessageQueue] = []
            for topic, mine in wanted.items():
                current = [mq for mq in self._queues if mq.topic == topic]
                given_up += diff_assignment(current, mine)[1]
            await release_queues(
                self._instance,
                self._group,
                [self._queues.pop(mq) for mq in given_up],
                self._offsets,
                clustering=self.clustering,
                orderly=self.orderly,
            )
            for mine in wanted.values():
                await self._take_queues([mq for mq in mine if mq not in self._queues])

    async def _take_queues(self, added: list[MessageQueue]) -> None:
        if added and self.orderly and self.clustering:
            locked = await self._lock(added)
            added = [mq for mq in added if mq in locked]
        # Every start offset at once: a round that takes many queues takes one round trip, so
        # the next round (which may give queues up) is not held back by it.
        offsets = await asyncio.gather(
            *(
                first_offset(
                    self._instance,
                    self._group,
                    mq,
                    known=None if self.clustering else self._local_offset(mq),
                    consume_from_where=self.consume_from_where,
                    consume_timestamp_ms=self.consume_timestamp_ms,
                )
                for mq in added
            ),
            return_exceptions=True,
        )
        for mq, offset in zip(added, offsets, strict=True):
            if isinstance(offset, (ClientError, BrokerError, ProtocolError)):
                logger.warning("%s: no start offset for %s yet: %s", self._group, mq, offset)
                continue
            if isinstance(offset, BaseException):
                raise offset
            self._start_queue(mq, offset)

    def _start_queue(self, mq: MessageQueue, offset: int) -> None:
        self._offsets.update(mq, offset, increase_only=False)
        self._pull_from.forget(mq)
        state = OwnedQueue(mq, ProcessQueue(), offset)
        if self.orderly and self.clustering:
            state.pq.locked = True
            state.pq.lock_renewed_at_ms = self._clock.monotonic_ms()
        state.tasks.append(asyncio.create_task(self._pull_loop(state)))
        if self.orderly:
            state.tasks.append(asyncio.create_task(self._orderly_loop(state)))
        self._queues[mq] = state
        logger.info("%s: consuming %s from offset %d", self._group, mq, offset)

    def _local_offset(self, mq: MessageQueue) -> int:
        known = self._offsets.get(mq)
        return -1 if known is None else known

    # -- pulling ---------------------------------------------------------------------------

    async def _pull_loop(self, state: OwnedQueue) -> None:
        mq, pq = state.mq, state.pq
        subscription = self._subscriptions[mq.topic]
        while not pq.dropped:
            await pq.wait_below(self.pull_threshold_messages, self.pull_threshold_bytes)
            if pq.dropped:
                return
            needs_lock = self.orderly and self.clustering and not pq.locked
            if needs_lock and mq not in await self._lock([mq]):
                await asyncio.sleep(PULL_ERROR_DELAY_MS / 1000)
                continue
            committed = self._offsets.get(mq) if self.clustering else None
            sys_flag = PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
            if committed is not None and committed > 0:
                sys_flag |= PullSysFlag.COMMIT_OFFSET
            try:
                result = await api.pull(
                    self._instance,
                    mq,
                    group=self._group,
                    expression=subscription.expression,
                    expression_type=subscription.expression_type,
                    offset=state.next_offset,
                    max_nums=self.pull_batch_size,
                    sys_flag=int(sys_flag),
                    commit_offset=committed or 0,
                    suspend_ms=PULL_SUSPEND_MS_DEFAULT,
                    timeout_ms=PULL_TIMEOUT_MS_DEFAULT,
                    sub_version=subscription.sub_version,
                    broker_id=self._pull_from.get(mq),
                )
            except (ClientError, BrokerError, ProtocolError) as exc:
                logger.warning("%s: pull %s failed: %s", self._group, mq, exc)
                await asyncio.sleep(PULL_ERROR_DELAY_MS / 1000)
                continue
            if pq.dropped:
                return
            self._pull_from.update(mq, result.suggest_which_broker_id)
            stalled = (
                result.status is PullStatus.NO_MATCHED_MSG
                and not result.messages
                and result.next_begin_offset == state.next_offset
            )
            state.next_offset = result.next_begin_offset
            if stalled:
                await asyncio.sleep(PULL_STALLED_DELAY_MS / 1000)
                continue
            self._undecodable.record(result.undecodable)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                logger.warning(
                    "%s: offset of %s illegal, moving to %d", self._group, mq, state.next_offset
                )
                pq.moved_to(state.next_offset)
                self._offsets.update(mq, state.next_offset, increase_only=False)
                continue
            added = pq.put(result.messages)
            pq.pulled_to(result.next_begin_offset)
            if added:
                self._dispatch(state, added)
            else:
                # Nothing new (filtered out or undecodable): with nothing pending, move on.
                self._offsets.update(mq, pq.commit_offset())

    def _dispatch(self, state: OwnedQueue, messages: list[MessageExt]) -> None:
        if self.orderly:
            state.pq.notify()
            return
        for start in range(0, len(messages), self.consume_batch_max):
            batch = messages[start : start + self.consume_batch_max]
            self._spawn(self._consume_concurrently(state, batch))

    # -- consuming (the listener calls: consume_concurrently.py, consume_orderly.py) --------

    def _restore_topic(self, message: MessageExt) -> MessageExt:
        return restore_retry_topic(message, self._group)

    async def _call_listener(self, messages: list[MessageExt]) -> bool:
        assert self._listener is not None
        view = [self._restore_topic(m) for m in messages]
        return await call_listener(self._listener, view, self._executor, self._group)

    # -- offsets ---------------------------------------------------------------------------

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self._persist_interval_ms / 1000)
            try:
                await self._persist(all_queues=False)
            except Exception:
                logger.exception("%s: offset commit failed", self._group)

    async def _persist(self, *, all_queues: bool) -> None:
        """Commit changed offsets (every assigned queue's with `all_queues`)."""
        if all_queues:
            self._offsets.mark_dirty(self._queues)
        dirty = self._offsets.take_dirty()
        if not dirty:
            return
        if self._offset_file is not None:
            await asyncio.to_thread(self._offset_file.save, self._offsets.items())
            return
        if all_queues:  # shutdown: no later round sends them again
            await commit_last_offsets(self._instance, self._group, dirty)
            return
        again = await commit_offsets(self._instance, self._group, dirty)
        self._offsets.mark_dirty(again)

    def committed_offsets(self) -> dict[MessageQueue, int]:
        """The offsets as this consumer last recorded them (for tests and monitoring)."""
        return self._offsets.items()
