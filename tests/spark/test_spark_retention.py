"""A start offset below the queue's minimum (retention removed it) follows failOnDataLoss."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.client.blocking import BlockingPullConsumer

from .conftest import ThreadedCluster, create_topic

pytestmark = pytest.mark.spark

HOURS_MS = 3_600_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    # 4 KiB commit-log segments, so a few dozen messages span several files.
    running = ThreadedCluster(
        tmp_path_factory.mktemp("retention"), {"mappedFileSizeCommitLog": "4096"}
    )
    yield running
    running.close()


def expire_old_segments(cluster: ThreadedCluster) -> None:
    store = cluster.cluster.brokers[0].store
    later = int(time.time() * 1000) + 100 * HOURS_MS  # beyond the 72 h fileReservedTime
    assert cluster.call(lambda: store.clean_expired_files(later, force=True)) > 0


def test_retention_gap_both_ways(spark: Any, cluster: ThreadedCluster, tmp_path: Path) -> None:
    from tidemq.client.blocking import BlockingProducer
    from tidemq.client.message import Message

    (q0,) = create_topic(cluster.namesrv_addr, "Retained", 1)
    with BlockingProducer("SparkTestProducer", cluster.namesrv_addr) as producer:
        for n in range(40):
            producer.send(Message("Retained", b"%03d" % n + b"x" * 400), queue=q0)
    expire_old_segments(cluster)
    with BlockingPullConsumer("SparkTestReader", cluster.namesrv_addr) as consumer:
        low = consumer.min_offset(q0)
    assert 0 < low < 40

    def read(**options: str) -> list[Any]:
        reader = (
            spark.read.format("tidemq")
            .option("nameServer", cluster.namesrv_addr)
            .option("topic", "Retained")
            .option("startingOffsets", json.dumps({"Retained": {"broker-a": {"0": 0}}}))
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load().collect()

    with pytest.raises(Exception, match="failOnDataLoss"):
        read()
    rows = read(failOnDataLoss="false")
    assert sorted(r.queueOffset for r in rows) == list(range(low, 40))

    # Streaming: a checkpoint whose offsets fell below the minimum meets the same rule.
    def stream(checkpoint: Path, **options: str) -> Any:
        reader = (
            spark.readStream.format("tidemq")
            .option("nameServer", cluster.namesrv_addr)
            .option("topic", "Retained")
            .option("startingOffsets", json.dumps({"Retained": {"broker-a": {"0": 0}}}))
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(checkpoint / "out"))
            .option("checkpointLocation", str(checkpoint / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as exc:
            return exc
        return query

    failed = stream(tmp_path / "strict")
    assert "failOnDataLoss" in str(failed)
    done = stream(tmp_path / "lenient", failOnDataLoss="false")
    assert done.exception() is None
    got = spark.read.parquet(str(tmp_path / "lenient" / "out")).collect()
    assert sorted(r.queueOffset for r in got) == list(range(low, 40))
