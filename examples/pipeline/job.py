"""The pipeline job: order events from TideMQ → windowed sums per account → Parquet + TideMQ.

Runs on any Spark master (local mode from run.py, or a cluster via spark-submit):

    spark-submit --master spark://HOST:7077 examples/pipeline/job.py \
        --name-server HOST:9876 --out /shared/pipeline [--available-now]

Input: JSON bodies {"account": "acct-3", "amount": 17, "ts": <event time, epoch ms>} on
`--input-topic` (the transfer example's {"id", "amount"} events work too: they count under the
account "transfer", at their born time). Output, per 10-second event-time window and account,
once the window has closed (watermark 10 s): a Parquet table under OUT/sums and one JSON message
per row on `--output-topic` (keys = account).

The TideMQ sink runs with exactlyOnce=false until the broker offers the batch-scoped END
request (see the README); the checkpoint under OUT/checkpoints makes restarts resume where the
last run stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

WINDOW = "10 seconds"
WATERMARK = "10 seconds"


def sums(spark: Any, name_server: str, topic: str) -> Any:
    """The streaming DataFrame of closed windows: window_start, window_end, account, total, n."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("tidemq")
        .option("nameServer", name_server)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50000")
        .option("consumerGroup", "pipeline_job")
        .load()
    )
    schema = "account string, amount long, ts long"
    parsed = events.select(
        F.from_json(F.col("body").cast("string"), schema).alias("e"), "bornTimestamp"
    )
    typed = parsed.select(
        F.coalesce(F.col("e.account"), F.lit("transfer")).alias("account"),
        F.col("e.amount").alias("amount"),
        F.coalesce(F.timestamp_millis(F.col("e.ts")), F.col("bornTimestamp")).alias("eventTime"),
    ).where(F.col("amount").isNotNull())
    return (
        typed.withWatermark("eventTime", WATERMARK)
        .groupBy(F.window("eventTime", WINDOW), "account")
        .agg(F.sum("amount").alias("total"), F.count("*").alias("n"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "account",
            "total",
            "n",
        )
    )


def start(spark: Any, args: argparse.Namespace) -> list[Any]:
    """Start the two queries (Parquet table, TideMQ topic); each has its own checkpoint."""
    from pyspark.sql import functions as F

    from tidemq.spark import TideMQDataSource

    spark.dataSource.register(TideMQDataSource)
    result = sums(spark, args.name_server, args.input_topic)
    trigger = {"availableNow": True} if args.available_now else {"processingTime": "5 seconds"}
    table = (
        result.writeStream.format("parquet")
        .option("path", os.path.join(args.out, "sums"))
        .option("checkpointLocation", os.path.join(args.out, "checkpoints", "parquet"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    topic = (
        result.select(
            F.to_json(F.struct("window_start", "window_end", "account", "total", "n")).alias(
                "body"
            ),
            F.col("account").alias("keys"),
        )
        .writeStream.format("tidemq")
        .option("nameServer", args.name_server)
        .option("topic", args.output_topic)
        .option("exactlyOnce", "false")
        .option("checkpointLocation", os.path.join(args.out, "checkpoints", "tidemq"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    return [table, topic]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name-server", required=True)
    parser.add_argument("--input-topic", default="Orders")
    parser.add_argument("--output-topic", default="AccountSums")
    parser.add_argument("--out", required=True, help="directory for the table and checkpoints")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then stop"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("tidemq-pipeline").getOrCreate()
    queries = start(spark, args)
    for query in queries:
        query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
