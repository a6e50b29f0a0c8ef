"""Keeps benchmarks/bench_security.py from rotting: three real `tidemq dev` processes (plain, ACL,
TLS), a fraction of a second of pipelined produce against each, and the report's ratio lines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_security  # noqa: E402

pytestmark = pytest.mark.slow


async def test_each_variant_is_measured_and_compared_to_plain() -> None:
    args = argparse.Namespace(runs=1, seconds=0.3, window=64)
    text = await bench_security.run(args)
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert set(lines) == {"plain", "acl", "tls"}, text
    assert "not measured" not in text, text
    assert "1.00x" in lines["plain"], text
    for name in ("acl", "tls"):
        assert f">= {bench_security.TARGETS[name]}x" in lines[name], text
