"""Keeps benchmarks/bench_failover.py from rotting: its quickest form (one failover, one short
cost round of each system) against a real etcd and real broker processes, and the report's
arithmetic on made-up figures."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_failover  # noqa: E402
from sidebyside.common import Options, median_runs  # noqa: E402


@pytest.mark.slow
@pytest.mark.etcd
def test_quick_run_fails_over_loses_nothing_and_compares(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_failover.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert text == "\n" + done.stdout
    assert "error:" not in text
    assert "**lost 0**" in text
    for system in bench_failover.SYSTEMS:
        assert f"| {system.label} | " in text
    assert f"| {bench_failover.REFERENCE} | " in text
    assert "| 1.00x |" in text


def test_report_gives_percentiles_ratios_and_the_loss() -> None:
    args = argparse.Namespace(lease_ttl=2, failovers=4, runs=3, measure_s=3.0)
    runs = [
        {"failover_s": s, "rejoin_s": 3.0, "killed": "broker-a-r1", "successor": "broker-a-r2"}
        for s in (2.0, 2.5, 3.0, 6.0)
    ]
    result = {
        "runs": runs,
        "acked": 10,
        "failed": 1,
        "errors": {},
        "send_rate": 5.0,
        "read": 9,
        "lost": 1,
        "lost_sample": [b"f-1"],
    }
    text = "\n".join(bench_failover.failover_text(result, args))
    assert "| seconds | 3.00 | 6.00 | 6.00 | 2.00 | 1.50x, 3.00x |" in text
    assert "**missed**" in text
    assert "**lost 1**" in text
    medians = {
        bench_failover.REFERENCE: median_runs([{"rate": 100.0}, {"rate": 300.0}]),
        **{s.label: median_runs([{"rate": 80.0}]) for s in bench_failover.SYSTEMS[1:]},
    }
    table = bench_failover.cost_table(medians, Options())
    assert "| 200 (100-300) | 1.00x |" in table
    assert table.count("| 80 (80-80) | 0.40x (0.40-0.40") == 2
