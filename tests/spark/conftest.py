"""Spark test wiring: one SparkSession for the whole run and a TideMQ cluster per module.

The session is `local[2,2]`: two task threads and two attempts per task, so the retry paths the
connector must survive really run. The cluster runs on its own event-loop thread, because Spark
calls block the test's thread while executor processes talk to the brokers over loopback.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tidemq.client.blocking import BlockingAdmin, BlockingProducer  # noqa: E402
from tidemq.client.message import Message  # noqa: E402
from tidemq.protocol.bodies import MessageQueue  # noqa: E402
from tidemq.testing import local_cluster  # noqa: E402
from tidemq.testing.cluster import LocalCluster  # noqa: E402

WAIT_S = 30.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll `condition` (a state another thread or process changes) until true or timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ThreadedCluster:
    """`local_cluster` on a private event-loop thread, usable from blocking test code."""

    def __init__(self, root: Path, settings: dict[str, str]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._context = local_cluster(root, broker_settings=settings)
        self.cluster: LocalCluster = self.run(self._context.__aenter__())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(WAIT_S)

    def call(self, function: Callable[[], T]) -> T:
        """Run `function` on the cluster's loop thread (the brokers' single writer)."""

        async def wrapper() -> T:
            return function()

        return self.run(wrapper())

    @property
    def namesrv_addr(self) -> str:
        return self.cluster.namesrv_addr

    def close(self) -> None:
        self.run(self._context.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is needed for the Spark tests (make java)")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from tidemq.spark import TideMQDataSource

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("tidemq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(TideMQDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    running = ThreadedCluster(
        tmp_path_factory.mktemp("cluster"), {"mappedFileSizeCommitLog": "65536"}
    )
    yield running
    running.close()


def create_topic(namesrv_addr: str, topic: str, queues: int) -> list[MessageQueue]:
    """Create `topic` with `queues` queues and wait until the name server routes it."""
    with BlockingAdmin(namesrv_addr) as admin:
        admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)

        def routed() -> bool:
            try:
                route = admin.topic_route(topic)
            except Exception:
                return False
            return sum(data.read_queue_nums for data in route.queue_datas) == queues

        wait_until(routed, f"a route for {topic}")
    return [MessageQueue(topic=topic, broker_name="broker-a", queue_id=i) for i in range(queues)]


def send(
    namesrv_addr: str, queue: MessageQueue, count: int, *, first: int = 0, **fields: Any
) -> None:
    """Send `count` messages with bodies b"<queue>-<n>" to one queue."""
    with BlockingProducer("SparkTestProducer", namesrv_addr) as producer:
        for n in range(first, first + count):
            body = f"{queue.queue_id}-{n}".encode()
            producer.send(Message(queue.topic, body, **fields), queue=queue)
