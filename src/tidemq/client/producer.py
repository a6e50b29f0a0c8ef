"""The asyncio producer: route lookup, queue choice, retries with broker fault avoidance.

One `send` is: publish queues of the topic (cached route; on TOPIC_NOT_EXIST from the name server,
the TBW102 route with at most 4 queues per broker, so the broker auto-creates the topic, as the
C++ client does) → round-robin queue choice skipping brokers that failed recently (client/fault.py
has the rule, its table and the probes that readmit a broker that answers again, run by
fault_probe.py) → SEND_MESSAGE_V2 (310) to the queue's master.

Start: routes of the declared `topics` fetched, their brokers (a TransactionProducer: every
master) heartbeated, so check-backs reach the group before its first send (instance.announce).

Retries: up to `retry_times` more attempts within one `send_timeout_ms` budget, preferably on
another broker; the coroutine path that makes them, and the rule, are send_retry.py.

Pipelining: `send_nowait(msg)` starts a send and returns an asyncio.Future of its SendResult, like
RocketMQ's async send with a SendCallback (`future.add_done_callback(...)`), and `send` awaits the
same. A window of sends in flight is kept without a coroutine per message:

    in_flight: collections.deque[asyncio.Future[SendResult]] = collections.deque()
    for message in messages:
        if len(in_flight) >= 256:
            await in_flight.popleft()  # the oldest; usually already done
        in_flight.append(producer.send_nowait(message))
    for future in in_flight:
        await future

Sends share one connection per broker and are paired by opaque. On the happy path (route cached,
connection open, first attempt answered) a send is no task and no timer: the connection completes
it from its read callback (client/sending.py). Anything else takes the coroutine path: the first
route lookup or connect, a paused transport, and retries, which a failed first attempt hands to
`_send_with_retries` with the attempt and the failed broker counted, so the rule is the same.

Properties set on every message (remoting.md §6.3): UNIQ_KEY (client message id, kept if the
caller already set one), WAIT=true, TAGS, KEYS (space-joined), DELAY (when delay_level > 0),
TIMER_DELIVER_MS (when deliver_time_ms is set). A body
of at least `compress_over_bytes` is compressed with `compression` ("zlib", the default every
client reads; "lz4" or "zstd", RocketMQ 5's sysFlag types, with `tidemq[codecs]`; None: never) and
flagged COMPRESSED, if it pays: zlib judges a sample first, so random or encrypted bodies go as
they are, and a result that did not shrink is not sent (protocol/compression.py). Not for batches.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine, Sequence
from typing import Any

from tidemq.clock import Clock
from tidemq.errors import (
    BrokerError,
    ClientClosedError,
    ClientError,
    NoRouteError,
    RequestTimeoutError,
)
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, SEND_TIMEOUT_MS_DEFAULT
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.compression import codec_bits
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    send_fields_v2,
)
from tidemq.security.signing import Credentials

from .fault import FaultTracker, select_queue
from .fault_probe import BrokerProber
from .instance import ClientInstance
from .message import Message, MessageExt, SendResult
from .route_cache import DEFAULT_TOPIC_QUEUES_PER_BROKER, PublishInfo, PublishInfos
from .send_retry import RetryingSends
from .sending import (
    COMPRESS_LEVEL_DEFAULT,
    COMPRESS_OVER_BYTES_DEFAULT,
    PreparedMessage,
    QueueSelector,
    SendTimeouts,
    SendWaiter,
    explicit_queue,
    is_retriable,
    prepare_batch,
    prepare_message,
    prepare_parts,
    send_request,
    send_result,
    settle_send,
)
from .tls import TlsOption

logger = logging.getLogger(__name__)


class Producer(RetryingSends):
    """Sends messages for producer group `group`. Use `async with Producer(...) as p:`."""

    # start() heartbeats every master, not only the declared topics' brokers (TransactionProducer)
    _announce_to_every_master = False

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT,
        retry_times: int = 2,
        compress_over_bytes: int = COMPRESS_OVER_BYTES_DEFAULT,
        compress_level: int = COMPRESS_LEVEL_DEFAULT,
        compression: str | None = "zlib",
        max_message_size: int = MESSAGE_BODY_SIZE_MAX,
        clock: Clock | None = None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = False,
        topics: Sequence[str] = (),
    ) -> None:
        pm.validate_group(group)
        # ValueError for an unknown name, CodecMissingError for a codec not installed.
        self._codec_bits = None if compression is None else codec_bits(compression)
        self.compression = compression
        if send_timeout_ms <= 0 or retry_times < 0 or max_message_size <= 0:
            raise ValueError("send_timeout_ms and max_message_size must be > 0, retry_times >= 0")
        self._group = group
        self._instance = instance or ClientInstance(
            namesrv_addr,
            clock=clock,
            instance_name=instance_name,
            credentials=credentials,
            tls=tls,
        )
        self._clock = self._instance.clock
        self.send_timeout_ms = send_timeout_ms
        self.retry_times = retry_times
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.faults = FaultTracker(on_failure=lambda name: self._prober.wake(name))
        self._prober = BrokerProber(self.faults, self._instance.probe_broker, self._clock)
        self._topics = tuple(topics)
        self._keys = pm.UniqueKeyGenerator(self._instance.client_ip, self._instance.pid)
        self._counters: dict[str, int] = {}
        self._publish_infos = PublishInfos(self._instance.routes)
        self._checked_topics: set[str] = set()
        # Sends in flight: fast-path attempts (with their one expiry timer) and coroutine-path
        # tasks; shutdown waits for both, woken through `_idle`.
        self._timeouts = SendTimeouts(self._on_send_expired)
        self._on_response = self._on_send_response  # bound once, not per send
        self._on_failure = self._on_send_failure
        self._tasks: set[asyncio.Task[SendResult]] = set()
        self._idle: asyncio.Future[None] | None = None
        self._started = False
        self._closed = False

    @property
    def group(self) -> str:
        return self._group

    @property
    def instance(self) -> ClientInstance:
        return self._instance

    async def start(self) -> None:
        if self._started:
            return
        self._instance.register_producer(self)
        await self._instance.start()
        self._started = True
        await self._instance.announce(self._topics, every_master=self._announce_to_every_master)

    async def shutdown(self) -> None:
        """Wait for `send_nowait` sends still in flight, unregister, close the instance."""
        if self._closed:
            return
        self._closed = True
        while self._timeouts or self._tasks:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        self._timeouts.cancel()
        await self._prober.stop()
        if self._started:
            await self._instance.unregister_producer(self._group)
            await self._instance.shutdown()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"producer {self._group} is shut down")
        if not self._started:
            raise ClientError(f"producer {self._group} is not started")

    # -- routes ----------------------------------------------------------------------------

    async def publish_info(self, topic: str) -> PublishInfo:
        """The queues `topic` may be sent to (via TBW102 if the name server does not know it).

        Raises:
            NoRouteError: neither the topic nor TBW102 has a writable queue.
        """
        now = self._clock.monotonic_ms()
        known = self._publish_infos.known(topic, now)
        if known is not None:
            return known
        route = self._instance.routes.get(topic)
        if route is None:
            self._instance.watch_topic(topic)
            try:
                route = await self._instance.fetch_route(topic)
            except BrokerError as exc:
                if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                default = await self._instance.route(pm.TBW102)
                return self._publish_infos.of_default(topic, default, now)
        try:
            return self._publish_infos.of_route(topic, route)
        except NoRouteError:
            self._instance.suspect_routes(topic)  # no master listed: one may be on its way
            raise

    def _next_index(self, topic: str) -> int:
        # Start each topic at a random queue so many producers do not all begin on queue 0.
        index = self._counters.get(topic)
        if index is None:
            index = int.from_bytes(os.urandom(2), "big")
        self._counters[topic] = index + 1
        return index

    # -- sending ---------------------------------------------------------------------------

    def _prepare(self, message: Message) -> PreparedMessage:
        return prepare_message(
            message,
            self._keys.next(self._clock.now_ms()),
            compress_over_bytes=self.compress_over_bytes,
            compress_level=self.compress_level,
            max_message_size=self.max_message_size,
            checked_topics=self._checked_topics,
            codec_bits=self._codec_bits,
        )

    async def send(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        """Send and await the broker's answer.

        A send to an explicit `queue`, a queue chosen by `selector(queues, message, arg)` or by
        `sharding_key` (hash modulo the queue count, so one key always lands on one queue) is
        made once, never moved to another queue.

        Raises:
            ValueError, ProtocolError, MessageTooLargeError: the message is invalid.
            BrokerError: a non-retriable broker answer, or the last retriable one.
            RequestTimeoutError, ConnectionClosedError: the last attempt's transport failure.
            NoRouteError: the topic has no writable queue.
        """
        return await self.send_nowait(
            message, queue=queue, selector=selector, arg=arg, sharding_key=sharding_key
        )

    def send_nowait(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        sharding_key: str | None = None,
    ) -> asyncio.Future[SendResult]:
        """Start a send; its future gets the SendResult or the exception `send` would raise
        (an invalid message included). Cancelling the future does not recall the message.

        Raises:
            ClientClosedError, ClientError: the producer is shut down or not started.
        """
        if self._closed or not self._started:
            self._check_open()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        now_ms = self._clock.now_ms()
        try:
            parts = prepare_parts(
                message,
                self._keys.next(now_ms),
                self.compress_over_bytes,
                self.compress_level,
                self.max_message_size,
                self._checked_topics,
                self._codec_bits,
            )
        except Exception as exc:
            future.set_exception(exc)
            return future
        return self._start_send(future, message, parts, now_ms, queue, selector, arg, sharding_key)

    def _start_send(
        self,
        future: asyncio.Future[SendResult],
        message: Message,
        parts: tuple[str, bytes, int, str],
        now_ms: int,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        arg: Any,
        sharding_key: str | None,
    ) -> asyncio.Future[SendResult]:
        """send_nowait of `parts` (prepare_parts of `message` at `now_ms`); `future` gets it."""
        topic = message.topic
        explicit = queue is not None or selector is not None or sharding_key is not None
        started = self._clock.monotonic_ms()
        info = self._publish_infos.known(topic, started)
        if info is not None:
            if not explicit:
                chosen = select_queue(info.queues, self._next_index(topic), self.faults, started)
            else:
                try:
                    chosen = queue or explicit_queue(
                        info.queues, message, selector, arg, sharding_key
                    )
                except Exception as exc:  # the caller's selector
                    future.set_exception(exc)
                    return future
            waiter = SendWaiter(
                topic,
                chosen,
                parts,
                message.flag,
                future,
                started,
                started + self.send_timeout_ms,
                not explicit,
                self._on_response,
                self._on_failure,
            )
            if self._launch(waiter, now_ms):
                return future
            # The coroutine path connects to the queue chosen here. A selector is not asked
            # twice; and choosing afresh would, under load, keep landing on connected brokers
            # (the others' picks moved the index meanwhile), so a broker with no connection, one
            # that restarted, would never be connected to again nor found failed.
            queue, first = (chosen, None) if explicit else (None, chosen)
        else:
            first = None
        prepared = PreparedMessage(parts[0], parts[1], parts[2], message.flag, parts[3])
        self._spawn(
            self._send_slowly(message, prepared, queue, selector, arg, sharding_key, first),
            future,
        )
        return future

    def _spawn(
        self, coroutine: Coroutine[Any, Any, SendResult], future: asyncio.Future[SendResult]
    ) -> None:
        """Run the coroutine path of a send as a task that hands its result or exception to
        `future`; cancelling `future` (a cancelled `send`) cancels it, as it would have cancelled
        the send's own coroutine."""
        # The task is the coroutine itself (not a wrapper awaiting it): a task cancelled before
        # its first step then closes the coroutine instead of leaving it never awaited.
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(lambda done: settle_send(done, future))
        task.add_done_callback(self._task_done)
        future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)

    def _task_done(self, task: asyncio.Task[SendResult]) -> None:
        self._tasks.discard(task)
        self._wake_shutdown()

    def _wake_shutdown(self) -> None:
        idle = self._idle
        if idle is not None and not self._timeouts and not self._tasks and not idle.done():
            idle.set_result(None)

    # -- the fast path: one attempt completed from the connection's read callback ------------

    def _launch(self, waiter: SendWaiter, born_ms: int) -> bool:
        """Write the attempt if the broker's connection is open and takes writes (else False:
        the caller takes the coroutine path, which connects or waits for the transport)."""
        queue = waiter.queue
        addr = self._instance.routes.master_address(queue.broker_name)
        connection = None if addr is None else self._instance.remoting.ready_connection(addr)
        if connection is None:
            return False
        fields = send_fields_v2(
            self._group,
            waiter.topic,
            pm.TBW102,
            DEFAULT_TOPIC_QUEUES_PER_BROKER,
            queue.queue_id,
            waiter.sys_flag,
            born_ms,
            waiter.flag,
            waiter.properties,
            False,
            queue.broker_name,
        )
        cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, 0, 0, fields, waiter.body)
        try:
            waiter.opaque = connection.start_request(cmd, waiter)
        except Exception as exc:  # as the coroutine path's request() would have raised it
            self._on_send_failure(waiter, exc)
            return True
        waiter.connection = connection
        self._timeouts.add(waiter, waiter.deadline_ms - waiter.started_ms)
        return True

    def _on_send_response(self, waiter: SendWaiter, response: RemotingCommand) -> None:
        queue = waiter.queue
        try:
            result = send_result(waiter.topic, queue, waiter.uniq_key, response)
        except Exception as exc:  # a failure code (BrokerError) or a malformed header
            self._on_send_failure(waiter, exc)
            return
        waiter.settled = True
        self._timeouts.discard(waiter)
        finished = self._clock.monotonic_ms()
        self.faults.record(queue.broker_name, finished - waiter.started_ms, finished, failed=False)
        future = waiter.future
        if not future.done():
            future.set_result(result)
        if self._idle is not None:
            self._wake_shutdown()

    def _on_send_expired(self, waiter: SendWaiter) -> None:
        if waiter.connection is not None:
            waiter.connection.abandon(waiter.opaque)
        self._on_send_failure(
            waiter,
            RequestTimeoutError(
                f"send to {waiter.queue} timed out after {self.send_timeout_ms} ms"
            ),
        )

    def _on_send_failure(self, waiter: SendWaiter, exc: Exception) -> None:
        """A failed first attempt: recorded against its broker, then retried on the coroutine
        path as `_send_with_retries` would have (same attempts, same budget), or reported."""
        waiter.settled = True
        self._timeouts.discard(waiter)
        queue, future = waiter.queue, waiter.future
        now = self._clock.monotonic_ms()
        self.faults.record(queue.broker_name, 0.0, now, failed=True)
        retry = waiter.retry and is_retriable(exc)
        if retry:
            logger.info("send to %s failed (attempt 1 of %d): %s", queue, 1 + self.retry_times, exc)
        if future.done():
            pass
        elif retry and self.retry_times > 0 and now < waiter.deadline_ms:
            retry_send = self._send_with_retries(
                waiter.topic,
                waiter.prepared(),
                deadline_ms=waiter.deadline_ms,
                attempts_made=1,
                last_failed=queue.broker_name,
                last_error=exc,
            )
            self._spawn(retry_send, future)
        else:
            future.set_exception(exc)
        if self._idle is not None:
            self._wake_shutdown()

    async def send_oneway(self, message: Message) -> None:
        """Fire and forget: one attempt, no answer awaited (the write is)."""
        self._check_open()
        prepared = self._prepare(message)
        info = await self.publish_info(message.topic)
        now = self._clock.monotonic_ms()
        queue = select_queue(info.queues, self._next_index(message.topic), self.faults, now)
        code, now_ms = RequestCode.SEND_MESSAGE_V2, self._clock.now_ms()
        cmd = send_request(self._group, message.topic, queue, prepared, code, now_ms)
        await self._instance.remoting.invoke_oneway(
            self._instance.master_address(queue.broker_name), cmd
        )

    async def send_batch(self, messages: Sequence[Message]) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (320); no delay levels.

        The result's `msg_id` and `offset_msg_id` are comma-joined, one per message, in order;
        `queue_offset` is the first message's.
        """
        self._check_open()
        prepared = prepare_batch(
            messages,
            lambda: self._keys.next(self._clock.now_ms()),
            self.max_message_size,
            self._checked_topics,
        )
        topic = messages[0].topic
        return await self._send_with_retries(topic, prepared, batch=True)

    async def on_check_transaction_state(
        self, broker_addr: str, header: CheckTransactionStateRequestHeader, message: MessageExt
    ) -> None:
        # Seam for the transactional producer (next issue): a plain producer has no local
        # transaction to consult, so the broker keeps asking until its check limit.
        logger.warning(
            "producer %s got a transaction check for %s but has no transaction listener",
            self._group,
            header.msg_id,
        )
