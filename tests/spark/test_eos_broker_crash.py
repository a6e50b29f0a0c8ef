"""The exactly-once sink through a broker crash, with real broker processes (issue 19, item 1).

A three-broker cluster (separate `tidemq broker` processes, SYNC_FLUSH) serves the output topic,
4 queues per broker. `SparkLikeQuery` runs the connector's own task and driver functions as
Spark's micro-batch execution calls them (a pickled writer per batch for the tasks, each task
under its TaskContext with retries as new attempts, a fresh writer for the driver's commit;
a failed commit fails the query, and the restarted query replays the batch with new attempts
and new routing). broker-c is killed with SIGKILL at each point the commit protocol names:

    before the halves · during the halves · after the halves, before END_BATCH · between the
    brokers' END_BATCHes (a partial commit) · after the commit

then restarted, the query restarted (replaying the batch when it failed), and one more batch
run, whose records also roll back whatever the replays left pending. Every case must end with
each input row in the output exactly once. No Spark session is needed (Spark is slow here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.client import fault
from tidemq.client.blocking import BlockingAdmin, BlockingPullConsumer
from tidemq.client.message import PullStatus
from tidemq.errors import RequestTimeoutError
from tidemq.protocol.bodies import MessageQueue
from tidemq.testing import local_cluster
from tidemq.testing.processes import ProcessCluster, ServerProcess, process_cluster
from tidemq.testing.wait import eventually_async

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark import TaskContext  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

from tidemq.spark import eos_driver  # noqa: E402
from tidemq.spark.broker_access import CLIENTS  # noqa: E402
from tidemq.spark.eos_driver import BatchCommitError, EosCommitMessage  # noqa: E402
from tidemq.spark.sink import batch_writer, stream_writer  # noqa: E402

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

TOPIC = "EosCrashOut"
QUEUES_PER_BROKER = 4
PARTITIONS = 3
ROWS_PER_PARTITION = 100
ARROW_ROWS = 25  # rows per Arrow batch a task reads, so a fault can land mid-task
TASK_ATTEMPTS = 4  # spark.task.maxFailures' default
SCHEMA = StructType([StructField("body", StringType())])
QUERY_ID = "0b5e8a1c-4f1d-4c1e-9a57-3b1c2d3e4f50"
ROUTE_WAIT_S = 30.0
# No SYSTEM_BUSY for a send that waited over waitTimeMillsInSendQueue (200 ms) in its connection's
# queue. Under a loaded CI machine sends waited 233-277 ms there; the sink then sends those halves
# to another broker, the broker a test picks as the holder may hold none of the batch, and the test
# checks nothing (or fails on its assumption). What these tests are about is a killed broker or a
# lost END_BATCH, not overload: they keep every send on the broker it was routed to.
BROKER_SETTINGS = {"brokerFastFailureEnable": "false"}

# Where broker-c dies.
BEFORE_HALVES = "before the halves"
DURING_HALVES = "during the halves"
BEFORE_END_BATCH = "after the halves, before END_BATCH"
BETWEEN_END_BATCHES = "between END_BATCHes (partial commit)"
AFTER_COMMIT = "after the commit"


@pytest.fixture(autouse=True)
def failures_only_avoidance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault avoidance skips a broker for 30 s after one send slower than 550 ms, which a loaded
    CI machine can produce: the batch's halves could then miss the broker a test kills (or the
    holder whose request it loses), and the test would check nothing. Here only failed sends
    (the dead broker) make the producer skip a broker."""
    real = fault.skip_duration_ms

    def failures_only(latency_ms: float) -> float:
        return real(latency_ms) if latency_ms >= fault.FAILURE_LATENCY_MS else 0.0

    monkeypatch.setattr(fault, "skip_duration_ms", failures_only)


def rows_of(batch_id: int) -> list[list[str]]:
    return [
        [f"b{batch_id}-p{p}-r{r}" for r in range(ROWS_PER_PARTITION)] for p in range(PARTITIONS)
    ]


@contextlib.contextmanager
def task_context(partition: int, attempt: int, batch_id: int) -> Iterator[None]:
    """The TaskContext Spark's Python worker sets up for a streaming write task."""
    context = TaskContext._getOrCreate()
    context._partitionId = partition
    context._attemptNumber = attempt
    context._stageId = batch_id
    context._taskAttemptId = batch_id * 100 + partition * 10 + attempt
    context._localProperties = {
        "sql.streaming.queryId": QUERY_ID,
        "streaming.sql.batchId": str(batch_id),
    }
    try:
        yield
    finally:
        TaskContext._setTaskContext(None)  # type: ignore[arg-type]


class SparkLikeQuery:
    """One streaming query's micro-batches, as Spark runs them (module docstring)."""

    def __init__(self, name_server: str) -> None:
        self.options = {"nameServer": name_server, "topic": TOPIC}
        self.task_failures = 0

    def run_batch(
        self,
        batch_id: int,
        *,
        mid_task: Callable[[int, int], None] | None = None,
        after_tasks: Callable[[], None] | None = None,
        before_request: Callable[[str, str], None] | None = None,
    ) -> list[EosCommitMessage]:
        """Tasks, then the driver's commit. Raises what fails the query."""
        shipped = pickle.dumps(stream_writer(self.options, SCHEMA, False))
        messages = [
            self.run_task(shipped, batch_id, p, rows, mid_task)
            for p, rows in enumerate(rows_of(batch_id))
        ]
        if after_tasks is not None:
            after_tasks()
        committer: Any = stream_writer(self.options, SCHEMA, False)
        committer.before_request = before_request
        try:
            committer.commit(pickle.loads(pickle.dumps(messages)), batch_id)
        except Exception:
            # Spark aborts a write whose commit failed, with the same messages, on a fresh
            # writer (V2TableWriteExec), then fails the query.
            aborter: Any = stream_writer(self.options, SCHEMA, False)
            aborter.abort(pickle.loads(pickle.dumps(messages)), batch_id)
            raise
        return messages

    def run_task(
        self,
        shipped: bytes,
        batch_id: int,
        partition: int,
        rows: list[str],
        mid_task: Callable[[int, int], None] | None,
    ) -> EosCommitMessage:
        def batches() -> Iterator[Any]:
            for start in range(0, len(rows), ARROW_ROWS):
                if mid_task is not None and start:
                    mid_task(partition, start)
                yield pa.RecordBatch.from_pydict({"body": rows[start : start + ARROW_ROWS]})

        for attempt in range(TASK_ATTEMPTS):
            writer = pickle.loads(shipped)
            with task_context(partition, attempt, batch_id):
                try:
                    message: EosCommitMessage = writer.write(batches())
                except Exception as exc:  # Spark retries the task as a new attempt
                    log.info("task %d attempt %d failed: %r", partition, attempt, exc)
                    self.task_failures += 1
                    continue
            return pickle.loads(pickle.dumps(message))
        raise RuntimeError(f"task {partition} failed {TASK_ATTEMPTS} times")


def read_output(name_server: str) -> Counter[str]:
    """Every visible message of the output topic, from every queue of every broker."""
    bodies: Counter[str] = Counter()
    with contextlib.closing(_Consumer(name_server)) as consumer:
        for mq in consumer.queues():
            offset = 0
            while True:
                result = consumer.pull(mq, offset)
                if result.status is not PullStatus.FOUND:
                    break
                bodies.update(m.body.decode() for m in result.messages)
                offset = result.next_begin_offset
    return bodies


class _Consumer:
    def __init__(self, name_server: str) -> None:
        self._consumer = BlockingPullConsumer("EosCrashReader", name_server.split(";"))
        self._consumer.start()

    def queues(self) -> list[MessageQueue]:
        return self._consumer.fetch_subscribe_message_queues(TOPIC)

    def pull(self, mq: MessageQueue, offset: int) -> Any:
        return self._consumer.pull(mq, "*", offset, 64)

    def close(self) -> None:
        self._consumer.shutdown()


async def routed_queues(name_server: str) -> int:
    def count() -> int:
        with BlockingAdmin(name_server.split(";")) as admin:
            try:
                route = admin.topic_route(TOPIC)
            except Exception:
                return 0
            return sum(q.write_queue_nums for q in route.queue_datas)

    return await asyncio.to_thread(count)


async def wait_for_all_brokers(name_server: str) -> None:
    async def full() -> bool:
        return await routed_queues(name_server) == 3 * QUEUES_PER_BROKER

    await eventually_async(full, ROUTE_WAIT_S, what=f"{TOPIC} routed on three brokers")


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> Any:
    async with process_cluster(
        tmp_path,
        namesrvs=1,
        brokers=3,
        broker_settings={"flushDiskType": "SYNC_FLUSH", **BROKER_SETTINGS},
    ) as pc:
        name_server = pc.namesrv_addr

        def create() -> None:
            with BlockingAdmin(name_server.split(";")) as admin:
                admin.create_topic(
                    TOPIC, read_queue_nums=QUEUES_PER_BROKER, write_queue_nums=QUEUES_PER_BROKER
                )

        async def brokers_up() -> bool:
            def count() -> int:
                with BlockingAdmin(name_server.split(";")) as admin:
                    return len(admin.cluster_info().broker_addr_table)

            return await asyncio.to_thread(count) == 3

        await eventually_async(brokers_up, ROUTE_WAIT_S, what="three brokers registered")
        await asyncio.to_thread(create)
        await wait_for_all_brokers(name_server)
        try:
            yield pc
        finally:
            await asyncio.to_thread(CLIENTS.close)


def expected(batches: int) -> Counter[str]:
    return Counter(row for b in range(batches) for rows in rows_of(b) for row in rows)


async def crash_and_recover(
    pc: ProcessCluster, point: str, plan: Callable[[ServerProcess], dict[str, Any]]
) -> tuple[bool, SparkLikeQuery, Counter[str]]:
    """Batch 0 with every broker up (the executors learn all three), batch 1 with broker-c
    killed at `point` (the hooks `plan` returns), then broker-c restarted, the query restarted
    (batch 1 replayed when it failed) and batch 2. Returns (batch 1 failed, the query that ran
    it, the output)."""
    query = SparkLikeQuery(pc.namesrv_addr)
    victim = pc.brokers[2]
    await asyncio.to_thread(query.run_batch, 0)
    try:
        await asyncio.to_thread(query.run_batch, 1, **plan(victim))
        failed = False
    except Exception as exc:
        log.info("batch 1 failed at %s: %r", point, exc)
        failed = True
    assert not victim.running, f"broker-c was not killed {point}"
    await victim.start()
    await wait_for_all_brokers(pc.namesrv_addr)
    restarted = SparkLikeQuery(pc.namesrv_addr)
    if failed:
        await asyncio.to_thread(restarted.run_batch, 1)
    await asyncio.to_thread(restarted.run_batch, 2)
    return failed, query, await asyncio.to_thread(read_output, pc.namesrv_addr)


def assert_exactly_once(output: Counter[str], batches: int, point: str) -> None:
    want = expected(batches)
    lost = sum((want - output).values())
    extra = sum((output - want).values())
    log.info("%s: %d rows, %d lost, %d extra", point, sum(output.values()), lost, extra)
    assert (lost, extra) == (0, 0), f"{point}: {lost} rows lost, {extra} extra copies"


async def test_broker_killed_before_the_halves(tmp_path: Path) -> None:
    """The tasks' sends to the dead broker are refused (never stored) and go to the others:
    the batch commits without broker-c, the query never fails."""
    async with cluster(tmp_path) as pc:

        def plan(victim: ServerProcess) -> dict[str, Any]:
            victim.kill()
            return {}

        failed, query, output = await crash_and_recover(pc, BEFORE_HALVES, plan)
        assert not failed, "a dead broker failed the query instead of being avoided"
        assert query.task_failures == 0, "a send refused by the dead broker failed its task"
        assert_exactly_once(output, 3, BEFORE_HALVES)


async def test_broker_killed_during_the_halves(tmp_path: Path) -> None:
    async with cluster(tmp_path) as pc:

        def plan(victim: ServerProcess) -> dict[str, Any]:
            def mid_task(partition: int, row: int) -> None:
                if partition == 1 and row == 2 * ARROW_ROWS and victim.running:
                    victim.kill()

            return {"mid_task": mid_task}

        _failed, _query, output = await crash_and_recover(pc, DURING_HALVES, plan)
        assert_exactly_once(output, 3, DURING_HALVES)


async def test_broker_killed_after_the_halves_before_end_batch(tmp_path: Path) -> None:
    """broker-c holds halves and is gone from the route at commit time: the commit must fail
    (not skip it), and the replay finishes the first attempt's decision."""
    async with cluster(tmp_path) as pc:

        def plan(victim: ServerProcess) -> dict[str, Any]:
            return {"after_tasks": victim.kill}

        failed, _query, output = await crash_and_recover(pc, BEFORE_END_BATCH, plan)
        assert failed, "the commit reported success without a broker holding halves"
        assert_exactly_once(output, 3, BEFORE_END_BATCH)


async def test_broker_killed_between_end_batches(tmp_path: Path) -> None:
    """broker-a and broker-b published the batch, broker-c died before its END_BATCH: the
    replay (other attempts, other routing) must publish the same decision on broker-c."""
    async with cluster(tmp_path) as pc:

        def plan(victim: ServerProcess) -> dict[str, Any]:
            def before_request(step: str, broker: str) -> None:
                if step == "commit" and broker == victim.name and victim.running:
                    victim.kill()

            return {"before_request": before_request}

        failed, _query, output = await crash_and_recover(pc, BETWEEN_END_BATCHES, plan)
        assert failed
        assert_exactly_once(output, 3, BETWEEN_END_BATCHES)


async def test_broker_killed_after_the_commit(tmp_path: Path) -> None:
    """The batch committed, then broker-c died and the driver too, before Spark's commit log:
    the replay re-drives the recorded decision. While broker-c is down that replay must fail
    (broker-c holds halves of the decision); once it is back, it succeeds."""
    async with cluster(tmp_path) as pc:
        query = SparkLikeQuery(pc.namesrv_addr)
        victim = pc.brokers[2]
        for batch_id in (0, 1):
            await asyncio.to_thread(query.run_batch, batch_id)
        victim.kill()
        replay = SparkLikeQuery(pc.namesrv_addr)
        with pytest.raises(BatchCommitError, match="broker-c"):
            await asyncio.to_thread(replay.run_batch, 1)
        await victim.start()
        await wait_for_all_brokers(pc.namesrv_addr)
        for batch_id in (1, 2):
            await asyncio.to_thread(SparkLikeQuery(pc.namesrv_addr).run_batch, batch_id)
        output = await asyncio.to_thread(read_output, pc.namesrv_addr)
        assert_exactly_once(output, 3, AFTER_COMMIT)


# -- lost requests to a live broker (in-process cluster: nothing is killed) --------------------


@contextlib.asynccontextmanager
async def live_cluster(tmp_path: Path) -> Any:
    """Three in-process brokers serving TOPIC: faults here are requests the driver loses (a
    timeout, a reset connection) while the broker lives on. Fast failure off: BROKER_SETTINGS."""
    async with local_cluster(tmp_path, brokers=3, broker_settings=BROKER_SETTINGS) as lc:

        def create() -> None:
            with BlockingAdmin([lc.namesrv_addr]) as admin:
                admin.create_topic(
                    TOPIC, read_queue_nums=QUEUES_PER_BROKER, write_queue_nums=QUEUES_PER_BROKER
                )

        await asyncio.to_thread(create)
        await wait_for_all_brokers(lc.namesrv_addr)
        try:
            yield lc
        finally:
            await asyncio.to_thread(CLIENTS.close)


def lose_requests(
    monkeypatch: pytest.MonkeyPatch, addr: str, phases: set[str], times: int = 1
) -> list[str]:
    """The driver's next `times` END_BATCH requests of `phases` to `addr` time out unsent."""
    real = eos_driver.end_batch_request
    lost: list[str] = []

    def flaky(admin: Any, to: str, ref: Any, body: Any, **kwargs: Any) -> Any:
        phase = body.get("phase", "commit" if kwargs.get("commit") else "rollback")
        if to == addr and phase in phases and len(lost) < times:
            lost.append(phase)
            raise RequestTimeoutError(f"{phase} to {to} timed out (lost by the test)")
        return real(admin, to, ref, body, **kwargs)

    monkeypatch.setattr(eos_driver, "end_batch_request", flaky)
    return lost


@pytest.mark.parametrize("victim", [0, 2])
async def test_a_holder_that_missed_the_decide_is_finished_by_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: int
) -> None:
    """The decide to one holder is lost while the broker lives; the commit fails and Spark
    aborts the batch with the same messages, which reach that broker. The abort must not
    roll back the halves of a decision recorded elsewhere: the replay finishes it."""
    async with live_cluster(tmp_path) as lc:
        query = SparkLikeQuery(lc.namesrv_addr)
        await asyncio.to_thread(query.run_batch, 0)
        lost = lose_requests(monkeypatch, lc.brokers[victim].address, {"decide"})
        name = f"broker-{'abc'[victim]}"
        with pytest.raises(BatchCommitError, match=name):
            await asyncio.to_thread(query.run_batch, 1)
        assert lost == ["decide"]
        for batch_id in (1, 2):
            await asyncio.to_thread(SparkLikeQuery(lc.namesrv_addr).run_batch, batch_id)
        output = await asyncio.to_thread(read_output, lc.namesrv_addr)
        assert_exactly_once(output, 3, f"decide to {name} lost")


async def test_a_replay_whose_tasks_fail_keeps_the_earlier_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1's decide reached broker-a and broker-b, not broker-c (lost). Its replay fails
    in a task (Spark aborts it without a commit): that abort must not roll back broker-c's
    halves of the decision either. The next replay finishes it."""
    async with live_cluster(tmp_path) as lc:
        query = SparkLikeQuery(lc.namesrv_addr)
        await asyncio.to_thread(query.run_batch, 0)
        lose_requests(monkeypatch, lc.brokers[2].address, {"decide"})
        with pytest.raises(BatchCommitError, match="broker-c"):
            await asyncio.to_thread(query.run_batch, 1)
        replay = SparkLikeQuery(lc.namesrv_addr)
        shipped = pickle.dumps(stream_writer(replay.options, SCHEMA, False))
        done = await asyncio.to_thread(replay.run_task, shipped, 1, 0, rows_of(1)[0], None)
        aborter: Any = stream_writer(replay.options, SCHEMA, False)
        await asyncio.to_thread(aborter.abort, [done, None, None], 1)
        for batch_id in (1, 2):
            await asyncio.to_thread(SparkLikeQuery(lc.namesrv_addr).run_batch, batch_id)
        output = await asyncio.to_thread(read_output, lc.namesrv_addr)
        assert_exactly_once(output, 3, "replay aborted")


async def test_a_batch_write_whose_publish_failed_is_closed_on_every_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch (non-streaming) write whose commit failed after broker-a published (broker-b's
    publish was lost): its abort's final ROLLBACK is refused by broker-a, and must still close
    the batch on broker-b and broker-c, so that no half of it stays pending for good there."""
    async with live_cluster(tmp_path) as lc:
        options = {"nameServer": lc.namesrv_addr, "topic": TOPIC}
        writer: Any = pickle.loads(pickle.dumps(batch_writer(options, SCHEMA, False)))
        rows = [f"w-{n}" for n in range(60)]
        message = await asyncio.to_thread(
            writer.write, iter([pa.RecordBatch.from_pydict({"body": rows})])
        )
        assert len(message.brokers) == 3
        lose_requests(monkeypatch, lc.brokers[1].address, {"commit"})
        with pytest.raises(BatchCommitError, match="broker-b"):
            await asyncio.to_thread(writer.commit, [message])
        await asyncio.to_thread(writer.abort, [message])

        def pending() -> list[int]:
            return [b.transactions.ledger.in_flight for b in lc.brokers]

        assert pending() == [0, 0, 0]


async def test_a_decision_a_holder_rolled_back_gives_way_to_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """broker-c missed batch 1's decide, and before the replay it rolled back its halves of
    that decision (they outlived its orphan timeout: the query stayed down; sent here as the
    ROLLBACK the timeout records). That decision was published nowhere and can never be
    recorded on broker-c: the replay must commit its own rows instead of failing forever or
    publishing the decision without broker-c's rows."""
    async with live_cluster(tmp_path) as lc:
        query = SparkLikeQuery(lc.namesrv_addr)
        await asyncio.to_thread(query.run_batch, 0)
        lose_requests(monkeypatch, lc.brokers[2].address, {"decide"})
        with pytest.raises(BatchCommitError, match="broker-c"):
            await asyncio.to_thread(query.run_batch, 1)
        monkeypatch.undo()

        def time_out_on_c() -> None:
            admin = CLIENTS.get(lc.namesrv_addr).admin
            ref = eos_driver.BatchRef(QUERY_ID, 1)
            found = eos_driver.lookup(admin, {"broker-a": lc.brokers[0].address}, ref)
            state, decision = found["broker-a"]
            assert state == "DECIDED"
            body = {"txns": sorted(decision.txns)}
            eos_driver.end_batch_request(admin, lc.brokers[2].address, ref, body, commit=False)

        await asyncio.to_thread(time_out_on_c)
        for batch_id in (1, 2):
            await asyncio.to_thread(SparkLikeQuery(lc.namesrv_addr).run_batch, batch_id)
        output = await asyncio.to_thread(read_output, lc.namesrv_addr)
        assert_exactly_once(output, 3, "decision rolled back on broker-c")
