"""Keeps benchmarks/bench_restart.py from rotting: a tiny run reports every figure and cleans up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_restart.py"

pytestmark = pytest.mark.slow


def test_a_tiny_restart_benchmark_reports_and_removes_its_stores(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            *("--store-gib", "0.01", "--segment-mib", "8", "--repeat", "1"),
            *("--dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    lines = out.splitlines()
    assert sum(line.startswith("broker restart (spawn -> port accepts)") for line in lines) == 2
    assert sum(line.startswith("store start in-process:") for line in lines) == 2
    assert "0 records scanned" in out  # clean stops: the scan starts at the checkpoint
    assert list(tmp_path.iterdir()) == []
