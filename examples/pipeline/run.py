"""The pipeline, end to end, with one command:

    python examples/pipeline/run.py [--orders 20000] [--master local[2]] [--keep]

0. checks that pyspark and Java are there (exit 2, saying how to get them, if not);
1. starts `tidemq dev` on free ports in a temp dir and creates the topics Orders and AccountSums;
2. sends `--orders` seeded order events (5 accounts, event times over one synthetic minute) and
   one late marker event that moves the watermark past every window;
3. runs job.py's two queries with Trigger.AvailableNow on the given Spark master;
4. checks that the Parquet table and the AccountSums topic both hold, per account, exactly the
   sums of the orders sent, prints the per-account totals, and exits 0 iff they match.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import job

from tidemq.client.blocking import BlockingAdmin, BlockingProducer
from tidemq.client.message import Message

TIDEMQ = [sys.executable, "-m", "tidemq.cli.main"]
ACCOUNTS = [f"acct-{n}" for n in range(5)]
EVENT_TIME_START_MS = 1_700_000_000_000
EVENT_TIME_SPAN_MS = 60_000
MARKER = "_watermark"


def missing_prerequisites() -> list[str]:
    """What Spark local mode needs and this machine lacks, each with how to get it: checked
    before a broker is started or an order sent, so a missing piece costs seconds, not a run."""
    missing = []
    try:
        found = importlib.util.find_spec("pyspark") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        try:
            import pyspark  # noqa: F401  (a broken install fails here, not in the middle)
        except ImportError:
            found = False
    if not found:
        missing.append(
            "pyspark is not installed: `make spark`, or `pip install -e '.[spark]'` in a clone"
        )
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no `java` on PATH"
        missing.append(
            f"Java 17 is needed by Spark ({where}): `make java`, or "
            "`apt-get install openjdk-17-jre-headless`"
        )
    return missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tidemq_dev(root: Path) -> Iterator[str]:
    namesrv_port, broker_port = free_port(), free_port()
    args = [*TIDEMQ, "dev", "--namesrv-port", str(namesrv_port)]
    args += ["--broker-port", str(broker_port), "--data-dir", str(root / "data")]
    with (root / "dev.log").open("w") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        for port in (namesrv_port, broker_port):
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), 0.2),
                ):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tidemq dev did not start; see {root / 'dev.log'}")
                time.sleep(0.05)
        yield f"127.0.0.1:{namesrv_port}"
    finally:
        process.terminate()
        process.wait(30)


def create_topics(namesrv: str) -> None:
    with BlockingAdmin(namesrv) as admin:
        deadline = time.monotonic() + 30
        for topic, queues in (("Orders", 4), ("AccountSums", 2)):
            while True:  # until the broker has registered with the name server
                try:
                    admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
                    admin.topic_route(topic)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


def send_orders(namesrv: str, count: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    expected: Counter[str] = Counter()
    batch: list[Message] = []
    with BlockingProducer("pipeline_orders", namesrv) as producer:
        for n in range(count):
            account = rng.choice(ACCOUNTS)
            amount = rng.randint(1, 500)
            ts = EVENT_TIME_START_MS + n * EVENT_TIME_SPAN_MS // count
            expected[account] += amount
            body = json.dumps({"account": account, "amount": amount, "ts": ts}).encode()
            batch.append(Message("Orders", body, keys=account))
            if len(batch) == 128:
                producer.send_batch(batch)
                batch = []
        if batch:
            producer.send_batch(batch)
        late = EVENT_TIME_START_MS + 10 * EVENT_TIME_SPAN_MS
        marker = {"account": MARKER, "amount": 0, "ts": late}
        producer.send(Message("Orders", json.dumps(marker).encode()))
    return expected


def spark_session(master: str, root: Path) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("tidemq-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.warehouse.dir", str(root / "warehouse"))
        .getOrCreate()
    )


def check(spark: Any, namesrv: str, out: Path, expected: Counter[str]) -> bool:
    from pyspark.sql import functions as F

    table = spark.read.parquet(str(out / "sums")).where(F.col("account") != MARKER)
    per_account = table.groupBy("account").agg(F.sum("total").alias("total")).collect()
    from_table = {r.account: r.total for r in per_account}
    messages = (
        spark.read.format("tidemq")
        .option("nameServer", namesrv)
        .option("topic", "AccountSums")
        .load()
        .collect()
    )
    from_topic: Counter[str] = Counter()
    for message in messages:
        row = json.loads(bytes(message.body))
        if row["account"] != MARKER:
            from_topic[row["account"]] += row["total"]
    print(f"{'account':<10} {'sent':>10} {'parquet':>10} {'topic':>10}")
    for account in ACCOUNTS:
        print(
            f"{account:<10} {expected[account]:>10} {from_table.get(account, 0):>10} "
            f"{from_topic[account]:>10}"
        )
    print(f"{table.count()} window rows in the table, {len(messages)} messages on AccountSums")
    return all(expected[a] == from_table.get(a, 0) == from_topic[a] for a in ACCOUNTS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, table)")
    args = parser.parse_args()
    missing = missing_prerequisites()
    if missing:
        for line in missing:
            print(f"examples/pipeline/run.py: {line}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="tidemq-pipeline-"))
    try:
        with tidemq_dev(root) as namesrv:
            create_topics(namesrv)
            expected = send_orders(namesrv, args.orders, args.seed)
            print(f"sent {args.orders} orders to Orders on {namesrv}")
            spark = spark_session(args.master, root)
            spark.sparkContext.setLogLevel("ERROR")
            out = root / "out"
            job_args = job.parse_args(
                ["--name-server", namesrv, "--out", str(out), "--available-now"]
            )
            started = time.monotonic()
            for query in job.start(spark, job_args):
                query.awaitTermination()
            print(f"the job took {time.monotonic() - started:.1f} s on {args.master}")
            ok = check(spark, namesrv, out, expected)
            spark.stop()
        print("OK: every order counted once in both outputs" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
