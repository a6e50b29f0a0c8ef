"""The exactly-once sink (`exactlyOnce=true`, the default): half messages ended per batch.

Executors send every row as a half message (TRAN_MSG) tagged with the property __SPARKTXN# =
`<sinkId>/<batchId>/<partition>/<attempt>`; nothing is visible yet. Each task reports its txn
and the brokers its halves went to. The driver's `commit` ends the batch on every one of them in
two phases, decide then publish, after looking up a decision an earlier attempt of the batch may
have left (eos_driver.py; ARCHITECTURE.md has the protocol and its failure cases): a batch
becomes visible on all its brokers or, until a replay finishes it, nowhere new. `abort` sends
ROLLBACK. Halves nobody ends (a failed attempt, a write landing after an abort, a driver that
died) are resolved by the broker from its batch records, never by producer check-back.

A send the broker never received (it was down: the connection could not be opened) or refused
without storing is sent again, on another broker when the producer's fault avoidance or a
refreshed route offers one (`HalfSender`); any other send failure fails the task, because a
half that may have been stored must not be stored twice under one txn id (Spark's retry is a
new attempt, a new txn id).

A batch write's abort is *final* (`abort_write_job`): its sink id is never replayed nor followed
by a later batch, so the driver closes batch 0 on every master of the cluster even when no task
reported (Spark kills the other tasks of a failed job; they may still be sending halves after
the abort), and the brokers roll back every half of it, however late.

Identities, and why:
- sinkId: the query id (`sql.streaming.queryId`, stable across restarts from one checkpoint),
  prefixed by the user's `sinkId` option when given, so a reused name with a new checkpoint
  (batch ids restart at 0) is another sink. Batch writes: a fresh id per write job, batch 0.
- attempt: Spark's attempt number, its task attempt id (unique in the application: a stage
  resubmitted after a fetch failure runs its tasks as attempt 0 again) and a nonce made on the
  driver when the writer is built. A batch replayed after a restart runs attempt 0 again; the
  nonce keeps its halves apart from the first run's, so "commit the listed txns" can never
  publish a replay's rows twice.
The writer Spark rebuilds for a streaming `commit`/`abort` has another nonce: those read the
txns, the sink id, the topics and the brokers from the tasks' commit messages only (spec §3.1).
A batch write's `commit`/`abort` run on the tasks' own (pickled) writer, so its job id names
the sink.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tidemq.client.blocking import BlockingProducer
from tidemq.client.message import Message
from tidemq.errors import BrokerError, ClientError, ConnectFailedError, NoRouteError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import PGROUP, SPARK_TXN, TRAN_MSG

from .broker_access import CLIENTS
from .eos_driver import (
    BeforeRequest,
    EosCommitMessage,
    abort_batch,
    abort_write_job,
    commit_batch,
)
from .options import SinkOptions

logger = logging.getLogger(__name__)

# Halves are sent one per request (the broker refuses transactional messages in a batch), in
# chunks of HALF_CHUNK_ROWS pipelined together (HalfSender), HALF_CHUNKS_IN_FLIGHT_MAX chunks
# in flight per task: the next chunk is built while one is on the wire.
HALF_CHUNK_ROWS: Final = 32
HALF_CHUNKS_IN_FLIGHT_MAX: Final = 2
# Attempts per half whose earlier attempts were never stored: one per broker of a small cluster
# and one more, so a task outlives one dead broker without failing the query.
HALF_SEND_ATTEMPTS_MAX: Final = 4
# Pause before a resend, times the attempt number, in seconds: lets the name server drop the
# dead broker from the route the resend refreshes.
HALF_RESEND_BACKOFF_S: Final = 0.1
# A task refreshes a topic's route at most this often, in seconds (32 sends in flight fail
# together when a broker dies).
ROUTE_REFRESH_INTERVAL_S: Final = 0.5
# Broker answers that mean the half was not stored (anything else may have been).
NOT_STORED_CODES: Final = frozenset(
    {
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.FLOW_CONTROL,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
    }
)


def never_stored(exc: Exception) -> bool:
    """Whether a failed send certainly stored nothing (so sending it again cannot duplicate)."""
    if isinstance(exc, ConnectFailedError | NoRouteError):
        return True
    return isinstance(exc, BrokerError) and exc.response_code in NOT_STORED_CODES


def writer_nonce() -> str:
    """A short id of one writer instance (made on the driver, shipped to its tasks)."""
    return uuid.uuid4().hex[:8]


def sink_id_of(options: SinkOptions, query_id: str | None, job_id: str) -> str:
    """The sink id: the query id (or, for batch writes, the job id), after the user's sinkId."""
    base = query_id or job_id
    return f"{options.sink_id}:{base}" if options.sink_id else base


@dataclass(frozen=True)
class TaskTag:
    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str

    @property
    def value(self) -> str:
        return f"{self.sink_id}/{self.batch_id}/{self.partition_id}/{self.attempt}"


def task_tag(options: SinkOptions, job_id: str, nonce: str) -> TaskTag:
    context = TaskContext.get()
    if context is None:
        return TaskTag(sink_id_of(options, None, job_id), 0, 0, f"0-{nonce}")
    query_id = context.getLocalProperty("sql.streaming.queryId")
    batch_text = context.getLocalProperty("streaming.sql.batchId")
    return TaskTag(
        sink_id=sink_id_of(options, query_id, job_id),
        batch_id=int(batch_text) if batch_text and query_id else 0,
        partition_id=context.partitionId(),
        # attemptNumber restarts at 0 in a resubmitted stage (a fetch failure); the task
        # attempt id does not, so a partial first run's halves never share the retry's txn.
        attempt=f"{context.attemptNumber()}-{context.taskAttemptId()}-{nonce}",
    )


class HalfSender:
    """One task's half sends: each half is stored at most once (module docstring), and the
    brokers that stored them are remembered for the commit message. Thread-safe (the send
    window calls it from its threads).

    The sends run on the producer's event loop: a chunk of halves (`send_chunk`) is one hop
    from the task's thread to that loop, its sends pipelined on the connection. One thread hop
    per half (a blocking send each, 32 threads) cost more client CPU than the broker spent
    storing the half."""

    def __init__(self, producer: BlockingProducer) -> None:
        self._producer = producer
        self._lock = threading.Lock()
        self._brokers: dict[str, str] = {}
        self._refreshed_at: dict[str, float] = {}

    @property
    def brokers(self) -> tuple[tuple[str, str], ...]:
        with self._lock:
            return tuple(sorted(self._brokers.items()))

    def send(self, message: Message, sharding_key: str | None = None) -> None:
        self._producer._run(self._send(message, sharding_key))

    def send_chunk(self, messages: list[Message]) -> None:
        """Send `messages` concurrently; once all are answered, raise the first failure."""
        self._producer._run(self._send_chunk(messages))

    async def _send_chunk(self, messages: list[Message]) -> None:
        results = await asyncio.gather(
            *(self._send(message, None) for message in messages), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _send(self, message: Message, sharding_key: str | None) -> None:
        for attempt in range(1, HALF_SEND_ATTEMPTS_MAX + 1):
            try:
                result = await self._producer.producer.send(message, sharding_key=sharding_key)
            except Exception as exc:
                if not never_stored(exc) or attempt == HALF_SEND_ATTEMPTS_MAX:
                    raise
                logger.warning(
                    "tidemq sink: half to %s not stored (attempt %d of %d): %s; sending it again",
                    message.topic,
                    attempt,
                    HALF_SEND_ATTEMPTS_MAX,
                    exc,
                )
                await asyncio.sleep(HALF_RESEND_BACKOFF_S * attempt)
                await self._refresh_route(message.topic)
                continue
            self._stored_on(result.message_queue.broker_name)
            return

    def _stored_on(self, broker_name: str) -> None:
        with self._lock:
            if broker_name in self._brokers:
                return
        addr = self._producer.producer.instance.routes.master_address(broker_name) or ""
        with self._lock:
            self._brokers[broker_name] = addr

    async def _refresh_route(self, topic: str) -> None:
        """Ask the name server for the topic's route again: a dead broker leaves it."""
        now = time.monotonic()
        with self._lock:
            last = self._refreshed_at.get(topic)
            if last is not None and now - last < ROUTE_REFRESH_INTERVAL_S:
                return
            self._refreshed_at[topic] = now
        try:
            await self._producer.producer.instance.fetch_route(topic)
        except (BrokerError, ClientError) as exc:
            logger.warning("tidemq sink: route of %s not refreshed: %s", topic, exc)


def send_halves(
    sender: HalfSender,
    batches: Iterator[pa.RecordBatch],
    options: SinkOptions,
    tag: TaskTag,
) -> tuple[int, set[str]]:
    """Send every row as a tagged half message; returns (rows, topics written)."""
    from .sink import SendWindow, batch_to_messages

    marks = {TRAN_MSG: "true", PGROUP: options.producer_group, SPARK_TXN: tag.value}
    topics: set[str] = set()
    sent = 0
    chunk: list[Message] = []
    window: SendWindow[list[Message]] = SendWindow(
        sender.send_chunk, HALF_CHUNKS_IN_FLIGHT_MAX, "tidemq-eos"
    )
    try:
        for batch in batches:
            for message, sharding_key in batch_to_messages(batch, options.topic):
                message = replace(message, properties={**message.properties, **marks})
                topics.add(message.topic)
                sent += 1
                if sharding_key is not None:
                    # In row order: a key's rows keep their order in its queue.
                    sender.send(message, sharding_key)
                    continue
                chunk.append(message)
                if len(chunk) >= HALF_CHUNK_ROWS:
                    window.submit(chunk)
                    chunk = []
        if chunk:
            window.submit(chunk)
        window.wait_all()
    finally:
        window.close()
    return sent, topics


def write_task(
    options: SinkOptions, batches: Iterator[pa.RecordBatch], job_id: str, nonce: str
) -> EosCommitMessage:
    """The executor side of one task: halves out, the commit message back."""
    tag = task_tag(options, job_id, nonce)
    # No producer retries: only HalfSender resends, and only what was certainly not stored.
    producer = CLIENTS.producer(
        options.name_server,
        options.producer_group,
        retry_times=0,
        credentials=options.credentials,
        tls=options.tls,
    )
    sender = HalfSender(producer)
    rows, topics = send_halves(sender, batches, options, tag)
    return EosCommitMessage(
        sink_id=tag.sink_id,
        batch_id=tag.batch_id,
        partition_id=tag.partition_id,
        attempt=tag.attempt,
        rows=rows,
        topics=tuple(sorted(topics | ({options.topic} if options.topic else set()))),
        brokers=sender.brokers,
    )


class TideMQEosWriter(DataSourceArrowWriter):
    """Batch writer (exactly once): one sink id per write job, batch 0."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job_id = f"write-{uuid.uuid4().hex}"
        self.nonce = writer_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EosCommitMessage:
        return write_task(self.options, iterator, self.job_id, self.nonce)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(self.options, messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_write_job(self.options, messages, sink_id_of(self.options, None, self.job_id))


class TideMQEosStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (exactly once): the query id names the sink, Spark's batch id the batch."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job_id = f"stream-{uuid.uuid4().hex}"
        self.nonce = writer_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EosCommitMessage:
        return write_task(self.options, iterator, self.job_id, self.nonce)

    # Fault-injection seam for the broker-crash tests (eos_driver.BeforeRequest); None in use.
    before_request: BeforeRequest | None = None

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.options, messages, batchId, before_request=self.before_request)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self.options, messages, batchId)
