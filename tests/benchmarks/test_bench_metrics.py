"""Keeps benchmarks/bench_metrics.py from rotting: two real `tidemq dev` processes (metrics off
and on, scraped), a fraction of a second of pipelined produce against each, and the scrape-cost
figure of a broker with 10,000 queues."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_metrics  # noqa: E402

pytestmark = pytest.mark.slow


async def test_off_and_on_are_compared_and_a_scrape_is_timed() -> None:
    args = argparse.Namespace(runs=1, seconds=0.3, window=64, scrape_every=0.1, scrapes=2)
    text = await bench_metrics.run(args)
    lines = text.splitlines()
    assert lines[1].startswith("off "), text
    assert lines[2].startswith("on "), text
    assert "scrapes)" in lines[2], text
    assert "(0 scrapes)" not in lines[2], text
    assert lines[3].startswith("on/off "), text
    assert "target >= 0.97x" in lines[3], text
    assert lines[4].startswith("scrape of 10,000 queues"), text
