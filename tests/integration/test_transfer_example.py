"""examples/transfer/run.py end to end with a small count: service A killed at three points,
restarted, and both databases balance (the script exits 0 only then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RUN = Path(__file__).resolve().parents[2] / "examples" / "transfer" / "run.py"


def test_transfer_example_balances_with_service_a_killed() -> None:
    done = subprocess.run(
        [sys.executable, str(RUN), "--transfers", "60", "--kills", "3", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("killed service A at transfer") == 3, done.stdout
    assert "balanced: A + B = 10000000" in done.stdout, done.stdout
    assert "in 60 transfers" in done.stdout, done.stdout
