"""Keeps the side-by-side suite (benchmarks/run_suite.py) from rotting.

The TideMQ-only part always runs: a real `tidemq dev` process, the produce, batch and consume
cases for about a second, and the report's ratio arithmetic. The whole quick suite, peers
included, runs only where `make bench-deps` installed the peer brokers.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from sidebyside import cases, report, servers  # noqa: E402
from sidebyside.common import Options, median_runs  # noqa: E402
from sidebyside.drivers import DRIVERS  # noqa: E402

pytestmark = pytest.mark.slow

TINY = Options(
    runs=1,
    quick=True,
    measure_s=0.3,
    count_sync=200,
    count_pipelined=2000,
    count_consume=1000,
    peers=(),
)


async def test_tidemq_cases_measure_and_consume_everything(tmp_path: Path) -> None:
    with servers.tidemq(tmp_path, "ASYNC_FLUSH") as server:
        driver = DRIVERS["tidemq"](server.address, TINY)
        await driver.connect()
        try:
            pipelined = await cases.measured(cases.produce_pipelined, driver, TINY, 1024)
            batched = await cases.measured(cases.produce_batched, driver, TINY)
            consumed = await cases.measured(cases.consume, driver, TINY)
        finally:
            await driver.close()
    assert pipelined["rate"] > 0, pipelined
    assert batched["rate"] > 0, batched
    assert consumed["count"] == consumed["prefilled"] > 0, consumed
    assert "cpu_foreign" in consumed


def test_report_compares_only_equal_durability() -> None:
    def row(system: str, rate: float) -> dict[str, object]:
        return {
            "case": "c",
            "system": system,
            "durability": "",
            "key": "rate",
            "median": median_runs([{"rate": rate}]),
        }

    rows = [
        row("redis", 100.0),
        row("redis-always", 50.0),
        row("rabbitmq", 10.0),
        row("tidemq ASYNC_FLUSH", 200.0),
        row("tidemq SYNC_FLUSH", 25.0),
    ]
    machine = {"seq_write_mib_s": 1.0, "fdatasync_64k_per_s": 16.0}
    text = report.table(rows, machine)
    assert rows[3]["vs_peer"] == "2.00x"  # against Redis everysec, not Redis always
    assert rows[4]["vs_peer"] == "0.50x"  # against Redis always, the best synchronous peer
    assert rows[4]["vs_disk"] == "0.02x group commit"
    assert rows[3]["vs_disk"].endswith("seq write")
    assert text.count("\n") == len(rows) + 1


_PEERS_INSTALLED = all(
    shutil.which(name) for name in ("redis-server", "nats-server", "rabbitmq-server")
) and all(importlib.util.find_spec(name) for name in ("redis", "nats", "aio_pika"))


@pytest.mark.skipif(
    not _PEERS_INSTALLED or not os.environ.get("TIDEMQ_BENCH_SMOKE"),
    reason="runs the peer brokers for minutes: set TIDEMQ_BENCH_SMOKE=1 after make bench-deps",
)
def test_quick_suite_with_peers_runs_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_suite.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    for system in ("redis", "redis-always", "nats", "rabbitmq", "tidemq SYNC_FLUSH"):
        assert f"| {system} |" in text
    assert "error:" not in text


def test_case_filter_selects_by_part_of_the_name() -> None:
    import run_suite

    everything = run_suite.Run(TINY)
    assert everything.wants("produce batched")
    picky = run_suite.Run(TINY, ("latency @500/s", "capacity"))
    assert picky.wants("end-to-end latency @500/s")
    assert not picky.wants("end-to-end latency @5000/s")
    assert picky.wants("server capacity (50 clients x 16 in flight)")
    assert not picky.wants("produce batched")
