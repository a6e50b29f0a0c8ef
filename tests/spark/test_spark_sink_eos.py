"""The exactly-once sink (`exactlyOnce=true`, the default) against a real broker.

Every case ends with the output topic holding each input row exactly once: an injected failure
on attempt 0 (its orphan halves rolled back), failure on all attempts (abort, then a clean
rerun), a query stopped mid-batch and restarted, and a batch committed twice (the commit log of
the last batch deleted, as after a driver crash between the sink's commit and Spark's).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ThreadedCluster, create_topic, send, wait_until

pytestmark = pytest.mark.spark

ROWS = 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    """A quick check-back, so orphan halves nobody ends are resolved within the test."""
    running = ThreadedCluster(
        tmp_path_factory.mktemp("cluster"),
        {
            "mappedFileSizeCommitLog": "65536",
            "transactionCheckInterval": "300",
            "transactionTimeOut": "500",
        },
    )
    yield running
    running.close()


def bodies(spark: Any, cluster: ThreadedCluster, topic: str) -> Counter[str]:
    rows = (
        spark.read.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", topic)
        .load()
        .collect()
    )
    return Counter(bytes(r.body).decode() for r in rows)


def in_flight(cluster: ThreadedCluster) -> int:
    return cluster.call(lambda: cluster.cluster.brokers[0].transactions.ledger.in_flight)


def sink_halves_pending(cluster: ThreadedCluster) -> int:
    return cluster.call(lambda: cluster.cluster.brokers[0].sink_batches.index.pending_count)


def batch_records(cluster: ThreadedCluster) -> int:
    from tidemq.protocol.names import RMQ_SYS_TRANS_BATCH_TOPIC

    return cluster.call(
        lambda: cluster.cluster.brokers[0].store.max_offset(RMQ_SYS_TRANS_BATCH_TOPIC, 0)
    )


def exactly_once(expected: list[str]) -> Counter[str]:
    return Counter(expected)


def failing_udf(marker_dir: Path, *, all_attempts: bool) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def fail(body: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if body == "row-90" and (all_attempts or (context and context.attemptNumber() == 0)):
            (marker_dir / f"failed-{context.attemptNumber() if context else 0}").touch()
            raise RuntimeError("injected failure")
        return body

    return F.udf(fail, StringType(), useArrow=False)


def test_failure_on_attempt_zero_rolls_its_orphans_back(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    create_topic(cluster.namesrv_addr, "EosRetry", 2)
    boom = failing_udf(tmp_path, all_attempts=False)
    rows = [f"row-{n}" for n in range(ROWS)]
    df = spark.createDataFrame([(r,) for r in rows], "body string").coalesce(1)
    (
        df.select(boom("body").alias("body"))
        .write.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "EosRetry")
        .mode("append")
        .save()
    )
    assert (tmp_path / "failed-0").exists(), "attempt 0 never failed: no retry was tested"
    assert bodies(spark, cluster, "EosRetry") == exactly_once(rows)
    # Attempt 0's halves were rolled back by the batch's END (or the check-back after it).
    wait_until(lambda: in_flight(cluster) == 0, "no pending half message")
    assert bodies(spark, cluster, "EosRetry") == exactly_once(rows)


def test_failure_on_all_attempts_aborts_then_a_rerun_delivers_once(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    create_topic(cluster.namesrv_addr, "EosAbort", 2)
    boom = failing_udf(tmp_path, all_attempts=True)
    rows = [f"row-{n}" for n in range(ROWS)]
    df = spark.createDataFrame([(r,) for r in rows], "body string").repartition(2)

    def write(frame: Any) -> None:
        (
            frame.write.format("tidemq")
            .option("nameServer", cluster.namesrv_addr)
            .option("topic", "EosAbort")
            .option("sinkId", "abortCase")
            .mode("append")
            .save()
        )

    with pytest.raises(Exception, match="injected failure"):
        write(df.select(boom("body").alias("body")))
    assert (tmp_path / "failed-1").exists()
    assert bodies(spark, cluster, "EosAbort") == Counter()
    wait_until(lambda: in_flight(cluster) == 0, "the aborted batch rolled back")
    assert bodies(spark, cluster, "EosAbort") == Counter()
    write(df)
    assert bodies(spark, cluster, "EosAbort") == exactly_once(rows)


def stream(spark: Any, cluster: ThreadedCluster, source: str, sink: str, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .selectExpr("body")
        .writeStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
    )


def test_stop_mid_batch_then_restart_delivers_once(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    (q0,) = create_topic(cluster.namesrv_addr, "EosStopIn", 1)
    create_topic(cluster.namesrv_addr, "EosStopOut", 2)
    send(cluster.namesrv_addr, q0, ROWS)
    block, entered = tmp_path / "block", tmp_path / "entered"
    block.touch()

    def hold(body: bytes) -> bytes:
        import time as clock

        # Row 0-50 of the first batch parks its task until the query is stopped (the worker is
        # killed then); the loop is bounded so a broken test cannot hang forever.
        if body == b"0-30" and block.exists():
            entered.touch()
            deadline = clock.monotonic() + 120
            while block.exists() and clock.monotonic() < deadline:
                clock.sleep(0.05)
        return body

    held = F.udf(hold, BinaryType(), useArrow=False)
    checkpoint = tmp_path / "cp"
    source = (
        spark.readStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "EosStopIn")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
    )
    query = (
        source.select(held("body").alias("body"))
        .writeStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "EosStopOut")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    wait_until(entered.exists, "a task parked mid-batch", timeout_s=120)
    stopper = threading.Thread(target=query.stop)
    stopper.start()
    stopper.join(120)
    block.unlink()
    assert not stopper.is_alive()
    assert bodies(spark, cluster, "EosStopOut") == Counter()
    rerun = stream(spark, cluster, "EosStopIn", "EosStopOut", checkpoint)
    rerun.trigger(availableNow=True).start().awaitTermination(180)
    expected = [f"0-{n}" for n in range(ROWS)]
    assert bodies(spark, cluster, "EosStopOut") == exactly_once(expected)
    wait_until(lambda: sink_halves_pending(cluster) == 0, "late halves resolved")
    assert bodies(spark, cluster, "EosStopOut") == exactly_once(expected)


def test_a_batch_committed_twice_is_delivered_once(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    (q0,) = create_topic(cluster.namesrv_addr, "EosTwiceIn", 1)
    create_topic(cluster.namesrv_addr, "EosTwiceOut", 2)
    send(cluster.namesrv_addr, q0, ROWS)
    checkpoint = tmp_path / "cp"
    query = stream(spark, cluster, "EosTwiceIn", "EosTwiceOut", checkpoint)
    assert query.trigger(availableNow=True).start().awaitTermination(180)
    expected = [f"0-{n}" for n in range(ROWS)]
    assert bodies(spark, cluster, "EosTwiceOut") == exactly_once(expected)
    # As if the driver died after the sink's commit and before Spark's commit log: the last
    # batch runs again (new attempts, same batch id) and commit(N) is called a second time.
    commits = sorted(
        (p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    records = batch_records(cluster)
    last = commits[-1]
    last.unlink()
    (checkpoint / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    again = stream(spark, cluster, "EosTwiceIn", "EosTwiceOut", checkpoint)
    assert again.trigger(availableNow=True).start().awaitTermination(180)
    assert (checkpoint / "commits" / last.name).exists(), "the batch did not run again"
    assert batch_records(cluster) == records, "a repeated COMMIT stored a new record"
    assert bodies(spark, cluster, "EosTwiceOut") == exactly_once(expected)
    wait_until(lambda: sink_halves_pending(cluster) == 0, "the replay's halves rolled back")
