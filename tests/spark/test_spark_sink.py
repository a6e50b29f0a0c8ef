"""The sink (at-least-once mode) and its refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import ThreadedCluster, create_topic, send

pytestmark = pytest.mark.spark


def read_topic(spark: Any, cluster: ThreadedCluster, topic: str) -> list[Any]:
    return (
        spark.read.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", topic)
        .option("includeProperties", "true")
        .load()
        .collect()
    )


def test_batch_write_at_least_once_round_trip(spark: Any, cluster: ThreadedCluster) -> None:
    create_topic(cluster.namesrv_addr, "SinkBatch", 2)
    rows = [(f"row-{n}", "TagS" if n % 2 else None, f"k{n}", {"n": str(n)}) for n in range(50)]
    df = spark.createDataFrame(
        rows, "body string, tags string, keys string, properties map<string,string>"
    )
    (
        df.repartition(3)
        .write.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkBatch")
        .option("exactlyOnce", "false")
        .option("sendBatchSize", "8")
        .mode("append")
        .save()
    )
    got = read_topic(spark, cluster, "SinkBatch")
    assert sorted(bytes(r.body).decode() for r in got) == sorted(r[0] for r in rows)
    by_body = {bytes(r.body).decode(): r for r in got}
    assert by_body["row-3"].tags == "TagS"
    assert by_body["row-2"].tags is None
    assert by_body["row-7"].keys == "k7"
    assert by_body["row-7"].properties == {"n": "7"}


def test_sharding_key_keeps_order_in_one_queue(spark: Any, cluster: ThreadedCluster) -> None:
    create_topic(cluster.namesrv_addr, "SinkSharded", 4)
    df = spark.createDataFrame(
        [(f"{n:02d}", "acct-1") for n in range(20)], "body string, shardingKey string"
    )
    (
        df.coalesce(1)
        .write.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkSharded")
        .option("exactlyOnce", "false")
        .mode("append")
        .save()
    )
    got = read_topic(spark, cluster, "SinkSharded")
    assert len({r.queueId for r in got}) == 1
    ordered = [bytes(r.body).decode() for r in sorted(got, key=lambda r: r.queueOffset)]
    assert ordered == [f"{n:02d}" for n in range(20)]


def test_stream_to_stream_at_least_once(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    (q0,) = create_topic(cluster.namesrv_addr, "SinkIn", 1)
    create_topic(cluster.namesrv_addr, "SinkOut", 2)
    send(cluster.namesrv_addr, q0, 30)
    query = (
        spark.readStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkIn")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "12")
        .load()
        .selectExpr("body", "'copied' AS tags")
        .writeStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkOut")
        .option("exactlyOnce", "false")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    got = read_topic(spark, cluster, "SinkOut")
    assert sorted(bytes(r.body) for r in got) == sorted(f"0-{n}".encode() for n in range(30))
    assert {r.tags for r in got} == {"copied"}


def test_sink_refusals(spark: Any, cluster: ThreadedCluster) -> None:
    df = spark.createDataFrame([("x",)], "body string")

    def writer(frame: Any = df, **options: str) -> Any:
        result = frame.write.format("tidemq").option("nameServer", cluster.namesrv_addr)
        for key, value in options.items():
            result = result.option(key, value)
        return result

    with pytest.raises(Exception, match="overwrite"):
        writer(topic="T", exactlyOnce="false").mode("overwrite").save()
    with pytest.raises(Exception, match="sinkId"):
        writer(topic="T", sinkId="a/b").mode("append").save()
    with pytest.raises(Exception, match="topic option or a topic column"):
        writer(exactlyOnce="false").mode("append").save()
    no_body = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="body column"):
        writer(no_body, topic="T", exactlyOnce="false").mode("append").save()


def test_failed_attempt_is_retried_and_every_row_arrives(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    """At least once: attempt 0 of a task dies mid-write; the retry sends the partition again."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    create_topic(cluster.namesrv_addr, "SinkRetry", 2)
    marker = tmp_path / "attempt-0-failed"

    def fail_first_attempt(body: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and body == "row-150":
            marker.touch()
            raise RuntimeError("injected failure on attempt 0")
        return body

    boom = F.udf(fail_first_attempt, StringType(), useArrow=False)
    df = spark.createDataFrame([(f"row-{n}",) for n in range(200)], "body string").coalesce(1)
    (
        df.select(boom("body").alias("body"))
        .write.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkRetry")
        .option("exactlyOnce", "false")
        .option("sendBatchSize", "8")
        .mode("append")
        .save()
    )
    got = [bytes(r.body).decode() for r in read_topic(spark, cluster, "SinkRetry")]
    assert set(got) == {f"row-{n}" for n in range(200)}
    assert len(got) >= 200
    assert marker.exists(), "attempt 0 never failed: the test did not test a retry"


def test_complete_mode_is_refused(spark: Any, cluster: ThreadedCluster, tmp_path: Path) -> None:
    create_topic(cluster.namesrv_addr, "SinkComplete", 1)
    counts = (
        spark.readStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkComplete")
        .load()
        .groupBy("tags")
        .count()
        .selectExpr("CAST(count AS STRING) AS body")
    )
    writer = (
        counts.writeStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", "SinkComplete")
        .option("exactlyOnce", "false")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .outputMode("complete")
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="complete output mode"):
        writer.start().awaitTermination(60)
