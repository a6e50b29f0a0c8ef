"""examples/pipeline on a standalone Spark master and worker started on loopback from the
pyspark installation, so executors are separate JVMs and Python workers, as on a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
START_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive_workers(webui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except OSError:
        return 0


@contextlib.contextmanager
def standalone_cluster(log_dir: Path) -> Iterator[str]:
    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1"}
    env["PYSPARK_PYTHON"] = sys.executable
    port, webui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master_args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    master_args += ["--port", str(port), "--webui-port", str(webui)]
    worker_args = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
    worker_args += ["--webui-port", str(free_port()), "--cores", "2", "--memory", "2g"]
    worker_args += ["--work-dir", str(log_dir / "work"), master_url]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in (("master", master_args), ("worker", worker_args)):
            with (log_dir / f"{name}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=log)
                )
        deadline = time.monotonic() + START_S
        while alive_workers(webui) < 1:
            assert all(p.poll() is None for p in processes), "master or worker exited"
            assert time.monotonic() < deadline, "the worker did not register with the master"
            time.sleep(0.2)
        yield master_url
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


# A standalone master, a worker and the example's driver are three JVMs on 2 shared cores: the
# example's own limit (300 s below) bounds it, not pytest's default 120 s.
@pytest.mark.timeout(360)
def test_pipeline_example_on_a_standalone_cluster(tmp_path: Path) -> None:
    with standalone_cluster(tmp_path) as master_url:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        result = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "pipeline" / "run.py"),
                "--master",
                master_url,
                "--orders",
                "3000",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert "OK: every order counted once in both outputs" in result.stdout, tail
