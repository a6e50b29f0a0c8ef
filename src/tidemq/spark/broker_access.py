"""Talking to TideMQ from Spark's Python processes: queue discovery and offset lookups for the
driver, range reads for the executors, and the per-process client cache both use.

Why a process-wide cache: Spark reuses executor Python workers across tasks but rebuilds the
connector objects for each task from pickles, so nothing on them lives longer than one task. A
blocking client per (process, name server) — a daemon event-loop thread and one connection per
broker — is what lets the second task skip the handshakes. It is keyed by pid too, because Spark
forks workers from a daemon process and a client must never cross a fork. The account
(accessKey/secretKey) is part of the key: two queries of one process with different accounts
never share a client.

Reads follow `failOnDataLoss` (spec §4.3): data is lost when a range starts below the queue's
minimum offset (retention deleted it) or the queue ends before the planned end.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

from tidemq.client import Credentials
from tidemq.client.blocking import BlockingAdmin, BlockingProducer, BlockingPullConsumer
from tidemq.client.message import MessageExt, PullStatus
from tidemq.client.tls import TlsOption
from tidemq.errors import BrokerError
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import ResponseCode
from tidemq.security.tls import TlsClientSettings, client_context

from .offsets import Offsets, QueueKey, QueueRange
from .options import SourceOptions

logger = logging.getLogger(__name__)

# The group name the connector's pulls and lookups go under when no consumerGroup is given.
# Pulls by a pull consumer store nothing, so the name is only what brokers log.
READER_GROUP_DEFAULT: Final = "TIDEMQ_SPARK_READER"
# Pulls that find nothing new in a row before a read gives up on a range it expected to be full.
EMPTY_PULLS_MAX: Final = 3
# Pull results a read keeps ahead of the Arrow conversion (each at most pullBatchSize messages).
PREFETCH_PULLS_MAX: Final = 4
# How often a prefetching thread checks whether its reader went away, in seconds.
PREFETCH_POLL_S: Final = 0.5

T = TypeVar("T")


class DataLossError(RuntimeError):
    """Offsets the query planned to read are gone (failOnDataLoss=true)."""


def data_loss(options: SourceOptions, what: str) -> None:
    """Raise or log a data loss, as `failOnDataLoss` says."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{what}. Some data may have been lost because it is no longer available in TideMQ "
            "(retention removed it, or the queue was reset). If you want the query to go on "
            "regardless, set the source option failOnDataLoss to false."
        )
    logger.warning("%s; skipping it because failOnDataLoss is false", what)


@dataclass
class _Clients:
    consumer: BlockingPullConsumer
    admin: BlockingAdmin


# (pid, name server, group, account, TLS): one set of started clients each.
_Key = tuple[int, str, str, Credentials | None, TlsClientSettings | None]


def _tls_option(tls: TlsClientSettings | None) -> TlsOption:
    """The clients' `tls=` from the options' settings (built in this process: a context does
    not cross to the executors, its settings do)."""
    return client_context(tls) if tls is not None else False


class ClientCache:
    """Started blocking clients per (pid, name server, group, account, TLS settings); see the
    module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[_Key, _Clients] = {}
        self._producers: dict[_Key, BlockingProducer] = {}

    def get(
        self,
        name_server: str,
        group: str = READER_GROUP_DEFAULT,
        *,
        credentials: Credentials | None = None,
        tls: TlsClientSettings | None = None,
    ) -> _Clients:
        key = (os.getpid(), name_server, group, credentials, tls)
        with self._lock:
            clients = self._clients.get(key)
            if clients is None:
                addresses = name_server.split(";")
                context = _tls_option(tls)
                consumer = BlockingPullConsumer(
                    group, addresses, credentials=credentials, tls=context
                )
                consumer.start()
                admin = BlockingAdmin(addresses, credentials=credentials, tls=context)
                admin.start()
                clients = self._clients[key] = _Clients(consumer, admin)
            return clients

    def producer(
        self,
        name_server: str,
        group: str,
        *,
        retry_times: int = 2,
        credentials: Credentials | None = None,
        tls: TlsClientSettings | None = None,
    ) -> BlockingProducer:
        key = (os.getpid(), name_server, f"{group}#{retry_times}", credentials, tls)
        with self._lock:
            producer = self._producers.get(key)
            if producer is None:
                producer = BlockingProducer(
                    group,
                    name_server.split(";"),
                    retry_times=retry_times,
                    credentials=credentials,
                    tls=_tls_option(tls),
                )
                producer.start()
                self._producers[key] = producer
            return producer

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            producers, self._producers = list(self._producers.values()), {}
        for item in clients:
            item.consumer.shutdown()
            item.admin.shutdown()
        for producer in producers:
            producer.shutdown()


# The one cache of this process (see the module docstring for why it is process-wide).
CLIENTS: Final = ClientCache()


def _queue(key: QueueKey) -> MessageQueue:
    return MessageQueue(topic=key[0], broker_name=key[1], queue_id=key[2])


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """Per queue: the first offset still stored and the next offset to be written."""

    min_offsets: Offsets
    max_offsets: Offsets


def discover_topics(options: SourceOptions, admin: BlockingAdmin) -> list[str]:
    if options.topic_pattern is None:
        return list(options.topics)
    return sorted(topic for topic in admin.topic_list() if options.matches_topic(topic))


def fetch_bounds(options: SourceOptions, admin: BlockingAdmin) -> QueueBounds:
    """Min and max offsets of every queue of the source's topics (a missing topic has none)."""
    min_offsets: Offsets = {}
    max_offsets: Offsets = {}
    for topic in discover_topics(options, admin):
        try:
            table = admin.topic_stats(topic)
        except BrokerError as exc:
            if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            logger.info("topic %s does not exist (yet); it has no queues to read", topic)
            continue
        for mq, offset in table.offset_table.items():
            key = (mq.topic, mq.broker_name, mq.queue_id)
            min_offsets[key] = offset.min_offset
            max_offsets[key] = offset.max_offset
    return QueueBounds(min_offsets, max_offsets)


def first_offset_at(consumer: BlockingPullConsumer, key: QueueKey, timestamp_ms: int) -> int:
    """The first offset whose store time is >= `timestamp_ms`, or the queue's max offset.

    The broker answers the *nearest* offset (RocketMQ's searchOffset), so one message is read to
    step past an earlier neighbour.
    """
    mq = _queue(key)
    offset = consumer.search_offset(mq, timestamp_ms)
    result = consumer.pull(mq, "*", offset, 1)
    if result.status is PullStatus.FOUND and result.messages:
        if result.messages[0].store_timestamp < timestamp_ms:
            return offset + 1
        return offset
    return max(offset, result.max_offset)


def read_range(
    consumer: BlockingPullConsumer, item: QueueRange, options: SourceOptions
) -> Iterator[list[MessageExt]]:
    """The messages of `item` (filtered by the source's tags), a pull's worth at a time."""
    mq = _queue(item.key)
    offset, end = item.start_offset, item.end_offset
    empty_pulls = 0
    while offset < end:
        count = min(options.pull_batch_size, end - offset)
        result = consumer.pull(mq, options.tags, offset, count)
        if result.min_offset > offset:
            data_loss(
                options,
                f"offsets {offset}..{min(result.min_offset, end) - 1} of {mq.topic}/"
                f"{mq.broker_name}/{mq.queue_id} are no longer stored (the queue now starts at "
                f"{result.min_offset})",
            )
            offset = min(result.min_offset, end)
            continue
        if result.status is PullStatus.FOUND:
            empty_pulls = 0
            batch = [message for message in result.messages if message.queue_offset < end]
            if batch:
                yield batch
        elif (
            result.status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_ILLEGAL)
            and result.max_offset < end
        ):
            empty_pulls += 1
            if empty_pulls >= EMPTY_PULLS_MAX or result.status is PullStatus.OFFSET_ILLEGAL:
                data_loss(
                    options,
                    f"{mq.topic}/{mq.broker_name}/{mq.queue_id} ends at {result.max_offset} "
                    f"but offsets up to {end - 1} were planned",
                )
                return
            continue
        if result.next_begin_offset <= offset:
            # A broker must move us forward; anything else would loop for ever.
            data_loss(options, f"{mq.topic}/{mq.broker_name}/{mq.queue_id} did not advance")
            return
        offset = result.next_begin_offset


_DONE: Final = object()


def prefetched(source: Iterator[T], depth: int = PREFETCH_PULLS_MAX) -> Iterator[T]:
    """`source`'s items, produced by a helper thread up to `depth` ahead of the consumer.

    A read spends much of its time waiting for the broker; running the pulls ahead lets that
    wait overlap the Arrow conversion and Spark's consumption of the previous batch. An
    exception of `source` is raised here, in order; closing this generator stops the helper.
    """
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def offer(item: object) -> bool:
        while not stopped.is_set():
            try:
                items.put(item, timeout=PREFETCH_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in source:
                if not offer(item):
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            offer(exc)
            return
        offer(_DONE)

    helper = threading.Thread(target=produce, name="tidemq-spark-prefetch", daemon=True)
    helper.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stopped.set()
        helper.join()
