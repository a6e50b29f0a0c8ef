"""The source against a real cluster and a real SparkSession: batch ranges, timestamps, schema."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
import pytest

from tidemq.client.blocking import BlockingPullConsumer
from tidemq.spark.schema import source_arrow_schema, source_ddl

from .conftest import ThreadedCluster, create_topic, send

pytestmark = pytest.mark.spark


def read(spark: Any, cluster: ThreadedCluster, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("tidemq").option("nameServer", cluster.namesrv_addr)
    reader = reader.option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def test_arrow_schema_is_what_spark_derives(spark: Any) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    for include in (False, True):
        derived = to_arrow_schema(_parse_datatype_string(source_ddl(include)), timezone="UTC")
        assert derived.equals(source_arrow_schema(include)), (derived, include)


def test_batch_read_exact_ranges_with_splitting(spark: Any, cluster: ThreadedCluster) -> None:
    q0, q1 = create_topic(cluster.namesrv_addr, "BatchRanges", 2)
    send(cluster.namesrv_addr, q0, 10, tags="TagA", keys="k1 k2", properties={"p": "v"})
    send(cluster.namesrv_addr, q1, 6)
    starting = {"BatchRanges": {"broker-a": {"0": 2, "1": -2}}}
    ending = {"BatchRanges": {"broker-a": {"0": 9, "1": -1}}}
    rows = read(
        spark,
        cluster,
        "BatchRanges",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
        maxRecordsPerPartition="3",
        includeProperties="true",
    )
    got = sorted((r.queueId, r.queueOffset, bytes(r.body)) for r in rows)
    expected = [(0, n, f"0-{n}".encode()) for n in range(2, 9)]
    expected += [(1, n, f"1-{n}".encode()) for n in range(6)]
    assert got == expected
    first = min((r for r in rows if r.queueId == 0), key=lambda r: r.queueOffset)
    assert (first.topic, first.brokerName, first.tags, first.keys) == (
        "BatchRanges",
        "broker-a",
        "TagA",
        "k1 k2",
    )
    assert first.properties == {"p": "v"}
    assert len(first.msgId) == 32
    assert first.storeTimestamp >= first.bornTimestamp
    assert abs(first.bornTimestamp.timestamp() - time.time()) < 600


def test_batch_read_tag_filter_and_earliest_default(spark: Any, cluster: ThreadedCluster) -> None:
    (q0,) = create_topic(cluster.namesrv_addr, "BatchTags", 1)
    send(cluster.namesrv_addr, q0, 3, tags="Keep")
    send(cluster.namesrv_addr, q0, 3, first=3, tags="Drop")
    rows = read(spark, cluster, "BatchTags", tags="Keep")
    assert sorted(r.queueOffset for r in rows) == [0, 1, 2]
    assert "properties" not in rows[0].asDict()


def test_starting_timestamp(spark: Any, cluster: ThreadedCluster) -> None:
    (q0,) = create_topic(cluster.namesrv_addr, "BatchTime", 1)
    send(cluster.namesrv_addr, q0, 4)
    with BlockingPullConsumer("SparkTestReader", cluster.namesrv_addr) as consumer:
        last = consumer.pull(q0, "*", 3, 1).messages[0].store_timestamp
        cut = last + 1
        # Wait on the clock (not a fixed sleep) so later sends are stored at or after the cut.
        while int(time.time() * 1000) < cut:
            time.sleep(0.001)
        send(cluster.namesrv_addr, q0, 3, first=4)
    rows = read(spark, cluster, "BatchTime", startingTimestamp=str(cut))
    assert sorted(r.queueOffset for r in rows) == [4, 5, 6]
    before = read(spark, cluster, "BatchTime", endingTimestamp=str(cut))
    assert sorted(r.queueOffset for r in before) == [0, 1, 2, 3]
    by_queue = json.dumps({"BatchTime": {"broker-a": {"0": cut}}})
    rows = read(spark, cluster, "BatchTime", startingOffsetsByTimestamp=by_queue)
    assert sorted(r.queueOffset for r in rows) == [4, 5, 6]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        read(spark, cluster, "BatchTime", startingTimestamp=str(cut + 10**9))
    late = read(
        spark,
        cluster,
        "BatchTime",
        startingTimestamp=str(cut + 10**9),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert late == []


def test_batch_refuses_system_topics_and_bad_options(spark: Any, cluster: ThreadedCluster) -> None:
    with pytest.raises(Exception, match="system topic"):
        read(spark, cluster, "RMQ_SYS_TRANS_HALF_TOPIC")
    with pytest.raises(Exception, match="endingOffsets"):
        (
            spark.readStream.format("tidemq")
            .option("nameServer", cluster.namesrv_addr)
            .option("topic", "X")
            .option("endingOffsets", "latest")
            .load()
            .writeStream.format("console")
            .start()
            .awaitTermination(30)
        )


def test_arrow_record_batches_leave_read(cluster: ThreadedCluster) -> None:
    """The executor path without Spark: read() yields Arrow batches in the declared schema."""
    from pyspark.sql.datasource import InputPartition

    from tidemq.spark.offsets import QueueRange
    from tidemq.spark.options import parse_source_options
    from tidemq.spark.source import TideMQBatchReader

    (q0,) = create_topic(cluster.namesrv_addr, "ArrowOut", 1)
    send(cluster.namesrv_addr, q0, 25)
    options = parse_source_options(
        {"nameServer": cluster.namesrv_addr, "topic": "ArrowOut", "arrowBatchRows": "10"},
        streaming=False,
    )
    reader = TideMQBatchReader(options)
    batches = list(reader.read(InputPartition(QueueRange("ArrowOut", "broker-a", 0, 0, 25))))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert [b.num_rows for b in batches] == [10, 10, 5] or sum(b.num_rows for b in batches) == 25
    assert batches[0].schema.equals(source_arrow_schema(False))


class _ArgListener:
    """The local transaction's outcome is the `arg` of each send."""

    def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        return arg

    def check_local_transaction(self, message: Any) -> Any:
        from tidemq import LocalTransactionState

        return LocalTransactionState.UNKNOW


def test_only_committed_messages_are_read(spark: Any, cluster: ThreadedCluster) -> None:
    from tidemq import LocalTransactionState
    from tidemq.client.blocking import BlockingTransactionProducer
    from tidemq.client.message import Message

    create_topic(cluster.namesrv_addr, "TxnOrders", 1)
    outcomes = {
        b"committed": LocalTransactionState.COMMIT_MESSAGE,
        b"rolled-back": LocalTransactionState.ROLLBACK_MESSAGE,
        b"pending": LocalTransactionState.UNKNOW,
    }
    with BlockingTransactionProducer(
        "SparkTxnProducer", cluster.namesrv_addr, listener=_ArgListener()
    ) as producer:
        for body, outcome in outcomes.items():
            producer.send_message_in_transaction(Message("TxnOrders", body), outcome)
    rows = read(spark, cluster, "TxnOrders")
    assert [bytes(r.body) for r in rows] == [b"committed"]
    # A pattern that would match the system topics still reads only data topics.
    everything = (
        spark.read.format("tidemq")
        .option("nameServer", cluster.namesrv_addr)
        .option("topicPattern", "Txn.*|RMQ_SYS.*|.*HALF.*")
        .load()
        .collect()
    )
    assert {(r.topic, bytes(r.body)) for r in everything} == {("TxnOrders", b"committed")}
