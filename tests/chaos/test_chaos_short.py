"""The chaos suite's short seeded form (CI): a controller-mode group under five fault steps.

Seed 4's five steps partition the master from everyone, restart the whole group, partition the
master from etcd only, pause the master past its lease while a slave is killed, and kill the
master. The run is a separate process (`python -m tidemq.testing.chaos`), as `make chaos` runs
it: it enters a network namespace and must not take this test process with it. The test asserts
the checker's verdict and that the faults really happened; the run's table is in the output and
its logs under the run directory (kept when the test fails).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.testing.chaos import netns
from tidemq.testing.chaos.nodes import ETCD_BIN, unmount_stale

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SEED = 4
# The group's mode; "4x" (SYNC_MASTER + SLAVEs, no failover) exercises the harness alone.
MODE = os.environ.get("TIDEMQ_CHAOS_MODE", "controller")
FAULT_STEPS = 5
# Start-up, five steps of at most ~14 s each, the drain; far less on an idle machine.
RUN_TIMEOUT_S = 280
# An interrupted runner stops its clients and servers and removes its namespaces.
CLEANUP_TIMEOUT_S = 60


def run_chaos(command: list[str]) -> tuple[int, str, str]:
    """Run the runner; past the time limit interrupt it (its own clean-up runs), and if even
    that hangs, kill it and remove what it left (its namespaces, processes and mounts)."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as runner:
        try:
            stdout, stderr = runner.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            runner.send_signal(signal.SIGINT)
            try:
                stdout, stderr = runner.communicate(timeout=CLEANUP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                runner.kill()
                stdout, stderr = runner.communicate()
                netns.cleanup_stale()
                unmount_stale()
            pytest.fail(f"the chaos run took over {RUN_TIMEOUT_S} s:\n{stdout[-6000:]}")
    return runner.returncode, stdout, stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + CLEANUP_TIMEOUT_S + 20)
def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    if shutil.which(ETCD_BIN) is None:
        pytest.skip(f"{ETCD_BIN} is not installed (Debian etcd-server)")
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "tidemq.testing.chaos", "--short"]
    command += ["--seed", str(SEED), "--faults", str(FAULT_STEPS), "--run-dir", str(run_dir)]
    command += ["--mode", MODE]

    returncode, stdout, stderr = run_chaos(command)

    print(stdout[-6000:], stderr[-4000:])
    assert (run_dir / "verdict.json").exists(), stderr[-4000:]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["lost"] == []
    assert verdict["resurrected"] == []
    assert verdict["committed_invisible"] == []
    assert verdict["phantoms"] == []
    assert verdict["order_violations"] == []
    assert verdict["ok"] is True
    assert returncode == 0
    assert verdict["acked"] > 100
    assert verdict["committed"] > 10
    faults = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    applied = [f for f in faults if f["skipped"] is None]
    assert len(faults) == FAULT_STEPS + 1  # one step mixes two faults
    if json.loads((run_dir / "run.json").read_text())["namespaces"]:
        assert len(applied) == len(faults), faults
    else:  # loopback: no partitions, and no tmpfs stores for a disk-full slave
        skipped = {f["kind"] for f in faults if f["skipped"] is not None}
        assert skipped <= {"partition_master", "partition_master_etcd", "disk_full_slave"}
    # After the last fault healed, the group acknowledged sends again.
    assert verdict["recoveries"][-1]["seconds"] is not None
