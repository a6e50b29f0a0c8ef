"""Keeps benchmarks/bench_queues.py from rotting: a real name server and broker process, a few
dozen auto-created topics, and every figure line of the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_queues.py"

pytestmark = pytest.mark.slow


def test_the_report_names_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--topics", "40", "--in-flight", "8", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "40 topics auto-created" in out, out
    assert ": 40 queues" in out, out
    labels = ("create:", "disk (du):", "broker fds:", "broker RSS:", "after SIGTERM:", "kill -9:")
    for label in labels:
        assert label in out, out
    assert list(tmp_path.iterdir()) == []  # the store is removed at the end
