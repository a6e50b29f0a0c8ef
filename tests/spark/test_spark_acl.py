"""The connector against a broker with aclEnable=true: with accessKey/secretKey a batch write
(exactly once), a stream from topic to topic and a batch read all work, on the driver and the
executors; without them, or with a wrong secret, the query fails saying why and the secret shows
nowhere: not in the error, not in the query's plans or progress."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.client import Credentials
from tidemq.client.blocking import BlockingAdmin

from .conftest import ThreadedCluster, wait_until

pytestmark = pytest.mark.spark

ADMIN = Credentials("tidemq-admin", "admin-secret-1")
SECRET = "spark-secret-1"
KEYS = {"accessKey": "spark-job", "secretKey": SECRET}

# The connector's pulls go under its consumerGroup (default TIDEMQ_SPARK_READER): the account
# needs SUB on that group as well as on the topics it reads.
PLAIN_ACL = f"""\
accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: spark-job
    secretKey: {SECRET}
    topicPerms:
      - SparkAclIn=PUB|SUB
      - SparkAclOut=PUB|SUB
    groupPerms:
      - TIDEMQ_SPARK_READER=SUB
"""


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    root = tmp_path_factory.mktemp("acl-cluster")
    acl_file = root / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    settings = {"aclEnable": "true", "aclFilePath": str(acl_file)}
    running = ThreadedCluster(root / "cluster", {"mappedFileSizeCommitLog": "65536", **settings})
    with BlockingAdmin(running.namesrv_addr, credentials=ADMIN) as admin:
        for topic in ("SparkAclIn", "SparkAclOut"):
            admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)

            def routed(topic: str = topic) -> bool:
                try:
                    return bool(admin.topic_route(topic).queue_datas)
                except Exception:
                    return False

            wait_until(routed, f"a route for {topic}")
    yield running
    running.close()


def read(spark: Any, cluster: ThreadedCluster, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("tidemq").option("nameServer", cluster.namesrv_addr)
    return reader.option("topic", topic).options(**options).load().collect()


def test_write_stream_and_read_with_keys(
    spark: Any, acl_cluster: ThreadedCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(f"row-{n}",) for n in range(20)]
    (
        spark.createDataFrame(rows, "body string")
        .repartition(2)
        .write.format("tidemq")
        .option("nameServer", acl_cluster.namesrv_addr)
        .option("topic", "SparkAclIn")
        .options(**KEYS)
        .mode("append")
        .save()
    )  # exactly once (the default): halves, then the driver's END_BATCH, all signed
    query = (
        spark.readStream.format("tidemq")
        .option("nameServer", acl_cluster.namesrv_addr)
        .option("topic", "SparkAclIn")
        .option("startingOffsets", "earliest")
        .options(**KEYS)
        .load()
        .selectExpr("body")
        .writeStream.format("tidemq")
        .option("nameServer", acl_cluster.namesrv_addr)
        .option("topic", "SparkAclOut")
        .option("exactlyOnce", "false")
        .options(**KEYS)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    query.explain(extended=True)
    shown = capsys.readouterr().out + str(query.lastProgress) + str(query.recentProgress)
    assert SECRET not in shown
    got = read(spark, acl_cluster, "SparkAclOut", **KEYS)
    assert sorted(bytes(r.body).decode() for r in got) == sorted(r[0] for r in rows)


@pytest.mark.parametrize(
    ("options", "remark"),
    [
        ({}, "No accessKey is configured"),
        ({"accessKey": "spark-job", "secretKey": "not-the-secret"}, "Check signature failed"),
    ],
    ids=["no-keys", "wrong-secret"],
)
def test_a_read_that_does_not_authenticate_fails_saying_why(
    spark: Any, acl_cluster: ThreadedCluster, options: dict[str, str], remark: str
) -> None:
    with pytest.raises(Exception, match=remark) as failed:
        read(spark, acl_cluster, "SparkAclIn", **options)
    assert "not-the-secret" not in str(failed.value)
