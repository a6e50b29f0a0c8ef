"""The Spark connector's throughput, as ratios to references measured in the same run.

The broker runs as a separate `tidemq dev` process; Spark runs `local[2]` in this process.
Cases (one topic of 4 queues, `--rows` messages with 100-byte bodies):

  raw pull       the blocking Python client pulls every queue, one after the other, 256 per
                 pull (what one executor task does): the reference for the source (median of 3)
  raw pull x2    the same with two threads (Spark local[2] runs two tasks at once)
  source         spark.read.format("tidemq") of the whole topic, materialised by the noop sink;
                 the median of three runs after a first one that starts the Python workers
  raw send       the blocking Python client's send_batch, 128 per batch, one at a time (filling
                 the topic): the reference for the sink
  sink (alo)     df.write.format("tidemq") with exactlyOnce=false of the same rows
  sink (eos)     the same write with exactlyOnce=true (half messages; three TIDEMQ_END_BATCH
                 phases per broker: lookup, decide, publish), reported as a ratio to the
                 at-least-once sink of the same run

Beside each sink case a probe times a cheap request to the broker every 10 ms (LagProbe): its
p99 and max are how long any request waited behind the broker's event loop during the case.

Goals: source / raw pull >= 0.8 (issue 5); sink eos / alo >= 0.5 with the probe's max
<= 100 ms (issue 18).

Usage: python benchmarks/bench_spark.py [--rows N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_produce_consume import dev_server

from tidemq.client.blocking import BlockingAdmin, BlockingProducer, BlockingPullConsumer
from tidemq.client.message import Message
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode

BODY_SIZE = 100
TOPIC = "BenchSpark"
QUEUES = 4
PULL_BATCH = 256
# Timed runs per case; the median is reported (a shared 2-core machine is noisy).
RUNS = 3


def produce(namesrv: str, rows: int) -> float:
    """Create the topics and fill the input one; returns the send rate (128 per batch)."""
    with BlockingAdmin(namesrv) as admin:
        admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        admin.create_topic(TOPIC + "Out", read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        deadline = time.monotonic() + 20
        while True:
            try:
                admin.topic_route(TOPIC)
                admin.topic_route(TOPIC + "Out")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    body = os.urandom(BODY_SIZE // 2).hex().encode()
    with BlockingProducer("bench_spark_producer", namesrv) as producer:
        start = time.perf_counter()
        for first in range(0, rows, 128):
            count = min(128, rows - first)
            producer.send_batch([Message(TOPIC, body, tags="T") for _ in range(count)])
        return rows / (time.perf_counter() - start)


def pull_queues(namesrv: str, queues: list[MessageQueue]) -> int:
    received = 0
    with BlockingPullConsumer("bench_spark_raw", namesrv) as consumer:
        for queue in queues:
            offset, end = consumer.min_offset(queue), consumer.max_offset(queue)
            while offset < end:
                result = consumer.pull(queue, "*", offset, min(PULL_BATCH, end - offset))
                received += len(result.messages)
                offset = result.next_begin_offset
    return received


def raw_pull(namesrv: str, rows: int, threads: int) -> float:
    queues = [MessageQueue(topic=TOPIC, broker_name="broker-a", queue_id=i) for i in range(QUEUES)]
    counts: list[int] = []
    workers = [
        threading.Thread(
            target=lambda part=queues[i::threads]: counts.append(pull_queues(namesrv, part))
        )
        for i in range(threads)
    ]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    if sum(counts) != rows:
        raise RuntimeError(f"raw pull read {sum(counts)} of {rows} messages")
    return rows / elapsed


class LagProbe:
    """Times a cheap request (GET_MAX_OFFSET, a read of the broker's memory) every 10 ms on its
    own connection while a case runs: what any request (a heartbeat, a route query) waits
    behind the broker's event loop. A blocking socket in a thread, not a client: the probe
    must not share the bench's event loops."""

    INTERVAL_S = 0.01

    def __init__(self, broker_addr: str) -> None:
        host, port = broker_addr.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples_ms: list[float] = []

    def _run(self) -> None:
        decoder = FrameDecoder()
        opaque = 0
        while not self._stop.wait(self.INTERVAL_S):
            opaque += 1
            request = RemotingCommand(
                code=RequestCode.GET_MAX_OFFSET,
                opaque=opaque,
                ext_fields={"topic": TOPIC, "queueId": "0"},
            )
            start = time.perf_counter()
            self._sock.sendall(encode(request))
            while not decoder.feed(data := self._sock.recv(65536)):
                if not data:  # the broker closed the connection: no answer will come
                    raise ConnectionError("the broker closed the lag probe's connection")
            self.samples_ms.append((time.perf_counter() - start) * 1000)

    def __enter__(self) -> LagProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def summary(self) -> str:
        if not self.samples_ms:
            return "no samples"
        ordered = sorted(self.samples_ms)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return f"probe p99 {p99:7.1f} ms, max {ordered[-1]:7.1f} ms ({len(ordered)} requests)"


def broker_address(namesrv: str) -> str:
    with BlockingAdmin(namesrv) as admin:
        route = admin.topic_route(TOPIC)
    addr = route.broker_datas[0].master_addr
    assert addr is not None
    return addr


def spark_session(tmp: Path) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from tidemq.spark import TideMQDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(TideMQDataSource)
    return session


def source_rate(spark: Any, namesrv: str, rows: int) -> float:
    def once() -> float:
        df = (
            spark.read.format("tidemq")
            .option("nameServer", namesrv)
            .option("topic", TOPIC)
            .option("minPartitions", "2")
            .load()
        )
        start = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - start

    once()  # cold: Python workers start
    return rows / statistics.median(once() for _ in range(RUNS))


def sink_rates(
    spark: Any, namesrv: str, rows: int
) -> tuple[tuple[float, LagProbe], tuple[float, LagProbe]]:
    """(at-least-once, exactly-once) rows/s writing the same cached rows to one topic, each with
    the lag probe that ran beside it."""
    df = (
        spark.read.format("tidemq")
        .option("nameServer", namesrv)
        .option("topic", TOPIC)
        .load()
        .select("body", "tags")
        .cache()
    )
    df.count()

    broker = broker_address(namesrv)

    def once(exactly_once: bool) -> tuple[float, LagProbe]:
        with LagProbe(broker) as probe:
            start = time.perf_counter()
            (
                df.write.format("tidemq")
                .option("nameServer", namesrv)
                .option("topic", TOPIC + "Out")
                .option("exactlyOnce", str(exactly_once).lower())
                .option("sendBatchSize", "256")
                .mode("append")
                .save()
            )
            elapsed = time.perf_counter() - start
        return rows / elapsed, probe

    # At least once first: it also creates the output topic the exactly-once END is routed by.
    return once(False), once(True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="a fifth of the rows")
    args = parser.parse_args()
    rows = args.rows // 5 if args.quick else args.rows
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-spark-") as tmp_name:
        tmp = Path(tmp_name)
        with dev_server(tmp / "data", "ASYNC_FLUSH") as namesrv:
            raw_send = produce(namesrv, rows)
            raw1 = statistics.median(raw_pull(namesrv, rows, 1) for _ in range(RUNS))
            raw2 = statistics.median(raw_pull(namesrv, rows, 2) for _ in range(RUNS))
            spark = spark_session(tmp)
            try:
                source = source_rate(spark, namesrv, rows)
                (sink, probe), (sink_eos, probe_eos) = sink_rates(spark, namesrv, rows)
            finally:
                spark.stop()
    print(f"TideMQ Spark connector, {rows} rows of {BODY_SIZE} B, local[2], {os.cpu_count()} cpus")
    print(f"{'raw pull (1 thread)':<24} {raw1:>10,.0f} rows/s")
    print(f"{'raw pull (2 threads)':<24} {raw2:>10,.0f} rows/s")
    print(f"{'source (Arrow)':<24} {source:>10,.0f} rows/s  {source / raw1:5.2f}x raw pull")
    print(f"{'raw send_batch (1 thr)':<24} {raw_send:>10,.0f} rows/s")
    print(
        f"{'sink, at least once':<24} {sink:>10,.0f} rows/s  {sink / raw_send:5.2f}x raw send  "
        f"{probe.summary()}"
    )
    print(
        f"{'sink, exactly once':<24} {sink_eos:>10,.0f} rows/s  "
        f"{sink_eos / sink:5.2f}x at least once  {probe_eos.summary()}"
    )


if __name__ == "__main__":
    main()
