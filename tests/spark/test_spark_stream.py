"""Streaming reads: admission control, AvailableNow, restart from the checkpoint, advisory
consumer-group offsets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tidemq.client.blocking import BlockingAdmin, BlockingPullConsumer

from .conftest import ThreadedCluster, create_topic, send

pytestmark = pytest.mark.spark

WAIT_S = 120


def run_available_now(
    spark: Any, cluster: ThreadedCluster, topic: str, out: Path, checkpoint: Path, **options: str
) -> Any:
    reader = (
        spark.readStream.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topic", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .selectExpr("queueId", "queueOffset", "CAST(body AS STRING) AS body")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT_S), "the AvailableNow query did not finish"
    assert query.exception() is None
    return query


def test_max_offsets_per_trigger_and_restart_from_checkpoint(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    q0, q1 = create_topic(cluster.namesrv_addr, "StreamLimit", 2)
    send(cluster.namesrv_addr, q0, 20)
    send(cluster.namesrv_addr, q1, 5)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "10",
        "consumerGroup": "SparkLagGroup",
    }
    first = run_available_now(spark, cluster, "StreamLimit", out, checkpoint, **options)
    sizes = [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 25
    assert max(sizes) <= 10
    assert len(sizes) >= 3
    # The small queue is not starved: it advances in the first batch already.
    first_batch = json.loads(first.recentProgress[0]["sources"][0]["endOffset"])
    assert first_batch["StreamLimit"]["broker-a"]["1"] > 0
    # reportLatestOffset: the brokers' ends, which progress shows for lag.
    latest = json.loads(first.lastProgress["sources"][0]["latestOffset"])
    assert latest == {"StreamLimit": {"broker-a": {"0": 20, "1": 5}}}

    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r.queueId, r.queueOffset) for r in rows) == sorted(
        [(0, n) for n in range(20)] + [(1, n) for n in range(5)]
    )

    send(cluster.namesrv_addr, q1, 4, first=5)
    second = run_available_now(spark, cluster, "StreamLimit", out, checkpoint, **options)
    assert second.id == first.id
    assert sum(p["numInputRows"] for p in second.recentProgress) == 4
    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.queueId, r.queueOffset) for r in rows]
    assert len(keys) == len(set(keys)) == 29

    # Advisory offsets: stored for the group, at most one batch behind (spec §3.2).
    with BlockingPullConsumer("SparkLagGroup", cluster.namesrv_addr) as consumer:
        assert consumer.fetch_consumer_offset(q0) > 0
    # What `tidemq group progress -g SparkLagGroup -t StreamLimit` shows.
    with BlockingAdmin(cluster.namesrv_addr) as admin:
        stats = admin.consume_stats("SparkLagGroup", "StreamLimit")
    progress = {mq.queue_id: wrapper for mq, wrapper in stats.offset_table.items()}
    assert progress[0].broker_offset == 20
    assert 0 < progress[0].consumer_offset <= 20


def test_stream_defaults_to_latest_and_tags(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    (q0,) = create_topic(cluster.namesrv_addr, "StreamLatest", 1)
    send(cluster.namesrv_addr, q0, 3, tags="Old")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = run_available_now(spark, cluster, "StreamLatest", out, checkpoint, tags="New")
    assert sum(p["numInputRows"] for p in first.recentProgress) == 0
    send(cluster.namesrv_addr, q0, 2, first=3, tags="New")
    send(cluster.namesrv_addr, q0, 2, first=5, tags="Old")
    run_available_now(spark, cluster, "StreamLatest", out, checkpoint, tags="New")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.queueOffset for r in rows) == [3, 4]


def test_queue_added_mid_query_starts_at_earliest(
    spark: Any, cluster: ThreadedCluster, tmp_path: Path
) -> None:
    q0, _ = create_topic(cluster.namesrv_addr, "StreamGrow", 2)
    send(cluster.namesrv_addr, q0, 3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_available_now(spark, cluster, "StreamGrow", out, checkpoint, startingOffsets="earliest")
    *_, q2 = create_topic(cluster.namesrv_addr, "StreamGrow", 3)
    send(cluster.namesrv_addr, q2, 4)
    send(cluster.namesrv_addr, q0, 1, first=3)
    query = run_available_now(spark, cluster, "StreamGrow", out, checkpoint)
    assert query.lastProgress is not None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r.queueId, r.queueOffset) for r in rows) == sorted(
        [(0, n) for n in range(4)] + [(2, n) for n in range(4)]
    )
