"""The exactly-once sink (`exactlyOnce=true`, the default): half messages ended per batch.

Executors send every row as a half message (TRAN_MSG) tagged with the property __SPARKTXN# =
`<sinkId>/<batchId>/<partition>/<attempt>`; nothing is visible yet. The driver's `commit`
sends one TIDEMQ_END_BATCH COMMIT per master of the output topics, listing the (partition,
attempt) pairs of the successful tasks; each broker records the decision durably, commits the
listed halves and rolls back the rest of the batch (broker/transaction/batch.py). `abort` sends
ROLLBACK. Halves nobody ends (a failed attempt, a write landing after an abort, a driver that
died) are resolved by the broker from its batch records, never by producer check-back.

A batch write's abort is *final* (`abort_write_job`): its sink id is never replayed nor followed
by a later batch, so the driver closes batch 0 on every master of the cluster even when no task
reported (Spark kills the other tasks of a failed job; they may still be sending halves after
the abort), and the brokers roll back every half of it, however late.

Identities, and why:
- sinkId: the query id (`sql.streaming.queryId`, stable across restarts from one checkpoint),
  prefixed by the user's `sinkId` option when given, so a reused name with a new checkpoint
  (batch ids restart at 0) is another sink. Batch writes: a fresh id per write job, batch 0.
- attempt: Spark's attempt number plus a nonce made on the driver when the writer is built. A
  batch replayed after a restart runs attempt 0 again; the nonce keeps its halves apart from the
  first run's, so "commit the listed txns" can never publish a replay's rows twice.
The writer Spark rebuilds for a streaming `commit`/`abort` has another nonce: those read the
txns, the sink id and the topics from the tasks' commit messages only (spec §3.1). A batch
write's `commit`/`abort` run on the tasks' own (pickled) writer, so its job id names the sink.

Atomic per broker only: a batch spread over several brokers becomes visible broker by broker.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

import orjson
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tidemq.client.blocking import BlockingAdmin, BlockingProducer
from tidemq.client.message import Message
from tidemq.errors import BrokerError, error_for_code
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndBatchRequestHeader
from tidemq.protocol.message import PGROUP, SPARK_TXN, TRAN_MSG, SysFlag

from .broker_access import CLIENTS
from .options import SinkOptions

logger = logging.getLogger(__name__)

# Half messages one write task keeps in flight: halves are sent one per request (the broker
# refuses transactional messages in a batch), so the window hides the round trips.
HALF_SENDS_IN_FLIGHT_MAX: Final = 32
# How long the driver waits for one broker's END_BATCH answer, in ms (it may flush to disk).
END_BATCH_TIMEOUT_MS: Final = 30_000
# How long the driver waits for a written topic's route (auto-created topics register late), s.
ROUTE_WAIT_S: Final = 30.0
ROUTE_POLL_S: Final = 0.2


@dataclass(frozen=True)
class EosCommitMessage(WriterCommitMessage):
    """What one successful exactly-once write task reports to the driver."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str
    rows: int
    topics: tuple[str, ...]

    @property
    def txn(self) -> str:
        return f"{self.partition_id}/{self.attempt}"


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
        attempt=f"{context.attemptNumber()}-{nonce}",
    )


def send_halves(
    producer: BlockingProducer,
    batches: Iterator[pa.RecordBatch],
    options: SinkOptions,
    tag: TaskTag,
) -> tuple[int, set[str]]:
    """Send every row as a tagged half message; returns (rows, topics written)."""
    from .sink import SendWindow, batch_to_messages

    marks = {TRAN_MSG: "true", PGROUP: options.producer_group, SPARK_TXN: tag.value}
    topics: set[str] = set()
    sent = 0
    window: SendWindow[Message] = SendWindow(producer.send, HALF_SENDS_IN_FLIGHT_MAX, "tidemq-eos")
    try:
        for batch in batches:
            for message, sharding_key in batch_to_messages(batch, options.topic):
                message = replace(message, properties={**message.properties, **marks})
                topics.add(message.topic)
                sent += 1
                if sharding_key is not None:
                    # In row order: a key's rows keep their order in its queue.
                    producer.send(message, sharding_key=sharding_key)
                    continue
                window.submit(message)
        window.wait_all()
    finally:
        window.close()
    return sent, topics


def write_task(
    options: SinkOptions, batches: Iterator[pa.RecordBatch], job_id: str, nonce: str
) -> EosCommitMessage:
    """The executor side of one task: halves out, the commit message back."""
    tag = task_tag(options, job_id, nonce)
    # No send retries: a retried half could be stored twice under one txn id. A failed send
    # fails the task, and Spark's retry is a new attempt (a new txn id).
    producer = CLIENTS.producer(options.name_server, options.producer_group, retry_times=0)
    rows, topics = send_halves(producer, batches, options, tag)
    return EosCommitMessage(
        sink_id=tag.sink_id,
        batch_id=tag.batch_id,
        partition_id=tag.partition_id,
        attempt=tag.attempt,
        rows=rows,
        topics=tuple(sorted(topics | ({options.topic} if options.topic else set()))),
    )


# -- driver ---------------------------------------------------------------------------------


def master_addresses(admin: BlockingAdmin, topics: Sequence[str]) -> list[str]:
    """Every master address serving any of `topics`, sorted. A topic the sends auto-created
    may reach the name server a little later: its route is awaited up to ROUTE_WAIT_S."""
    addrs: set[str] = set()
    for topic in topics:
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            try:
                route = admin.topic_route(topic)
                break
            except BrokerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(ROUTE_POLL_S)
        addrs.update(b.master_addr for b in route.broker_datas if b.master_addr)
    return sorted(addrs)


def end_batch(
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int | None,
    *,
    commit: bool,
) -> dict[str, dict[str, str]]:
    """Send TIDEMQ_END_BATCH to every master of the written topics; returns each broker's
    answer fields. Raises the BrokerError of the first refusal."""
    done = [m for m in messages if isinstance(m, EosCommitMessage)]
    if not done:
        if commit:
            return {}
        logger.warning(
            "tidemq sink aborted batch %s with no task message; its halves stay invisible and "
            "the brokers roll them back from their batch records",
            batch_id,
        )
        return {}
    sink_ids = {m.sink_id for m in done}
    batch_ids = {m.batch_id for m in done}
    assert len(sink_ids) == 1, sink_ids
    assert len(batch_ids) == 1, batch_ids
    sink_id, task_batch = sink_ids.pop(), batch_ids.pop()
    if batch_id is not None and batch_id != task_batch:
        raise RuntimeError(f"tasks wrote batch {task_batch}, the driver ends batch {batch_id}")
    topics = sorted({t for m in done for t in m.topics})
    admin = CLIENTS.get(options.name_server).admin
    answers = send_end_batch(
        admin,
        master_addresses(admin, topics),
        sink_id,
        task_batch,
        {"txns": sorted(m.txn for m in done)},
        commit=commit,
    )
    logger.info(
        "tidemq sink %s batch %d of %s: %d rows from %d tasks, brokers %s",
        "committed" if commit else "rolled back",
        task_batch,
        sink_id,
        sum(m.rows for m in done),
        len(done),
        answers,
    )
    return answers


def send_end_batch(
    admin: BlockingAdmin,
    addrs: Sequence[str],
    sink_id: str,
    batch_id: int,
    body: dict[str, object],
    *,
    commit: bool,
) -> dict[str, dict[str, str]]:
    """One TIDEMQ_END_BATCH per address; returns each broker's answer fields. Raises the
    BrokerError of the first refusal."""
    header = EndBatchRequestHeader(
        sink_id=sink_id,
        batch_id=batch_id,
        commit_or_rollback=SysFlag.COMMIT if commit else SysFlag.ROLLBACK,
    )
    encoded = orjson.dumps(body)
    answers: dict[str, dict[str, str]] = {}
    for addr in addrs:
        command = RemotingCommand(
            code=RequestCode.TIDEMQ_END_BATCH, ext_fields=header.to_fields(), body=encoded
        )
        # BlockingAdmin has no public raw-request method; its loop runs the remoting call.
        response = admin._run(
            admin.admin.instance.remoting.invoke(addr, command, END_BATCH_TIMEOUT_MS)
        )
        if response.code != ResponseCode.SUCCESS:
            raise error_for_code(
                response.code, f"END_BATCH of {sink_id}/{batch_id} at {addr}: {response.remark}"
            )
        answers[addr] = dict(response.ext_fields)
    return answers


def abort_write_job(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], job_id: str
) -> dict[str, dict[str, str]]:
    """Close batch 0 of a batch write's sink for good on every master of the cluster (the
    module docstring says why), whether or not any task reported."""
    sink_id = sink_id_of(options, None, job_id)
    done = [m for m in messages if isinstance(m, EosCommitMessage)]
    if any(m.sink_id != sink_id or m.batch_id != 0 for m in done):
        raise RuntimeError(f"tasks wrote another sink than {sink_id}/0")
    admin = CLIENTS.get(options.name_server).admin
    addrs = sorted(
        {b.master_addr for b in admin.cluster_info().broker_addr_table.values() if b.master_addr}
    )
    answers = send_end_batch(
        admin,
        addrs,
        sink_id,
        0,
        {"txns": sorted(m.txn for m in done), "final": True},
        commit=False,
    )
    logger.info(
        "tidemq sink rolled back write %s for good (%d task messages), brokers %s",
        sink_id,
        len(done),
        answers,
    )
    return answers


class TideMQEosWriter(DataSourceArrowWriter):
    """Batch writer (exactly once): one sink id per write job, batch 0."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job_id = f"write-{uuid.uuid4().hex}"
        self.nonce = writer_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EosCommitMessage:
        return write_task(self.options, iterator, self.job_id, self.nonce)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        end_batch(self.options, messages, None, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_write_job(self.options, messages, self.job_id)


class TideMQEosStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (exactly once): the query id names the sink, Spark's batch id the batch."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job_id = f"stream-{uuid.uuid4().hex}"
        self.nonce = writer_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EosCommitMessage:
        return write_task(self.options, iterator, self.job_id, self.nonce)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_batch(self.options, messages, batchId, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_batch(self.options, messages, batchId, commit=False)
