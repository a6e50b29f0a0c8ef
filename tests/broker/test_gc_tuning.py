"""GC pauses timed through gc.callbacks and exported; the tuning a server applies once started
(freeze what start-up allocated, raise the thresholds); TIDEMQ_GC_TUNING turns it off."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import running_broker
from test_metrics import PROM, parse, scrape, value

from tidemq.metrics.gc_pauses import (
    GC_PAUSE_BOUNDS_S,
    GEN0_THRESHOLD,
    GcPauses,
    gc_tuning_wanted,
    process_gc_pauses,
    tune_after_start,
)
from tidemq.metrics.loop_lag import LoopLagMonitor
from tidemq.testing.processes import free_port

START_TIMEOUT_S = 30.0


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """The test process's collector as it was: tuning is process-wide."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_real_collection_is_timed_by_generation() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect(1)
        gc.collect()
    finally:
        pauses.uninstall()
    assert sum(pauses.counts[1]) >= 1
    assert sum(pauses.counts[2]) >= 1
    assert pauses.sums[2] > 0
    assert pauses.total_s >= pauses.sums[2]
    seen = [sum(counts) for counts in pauses.counts]
    gc.collect()
    assert [sum(counts) for counts in pauses.counts] == seen  # uninstalled: no longer fed


def test_pauses_land_in_their_buckets() -> None:
    pauses = GcPauses()
    pauses.record(0, 0.0002)
    pauses.record(2, 0.3)
    pauses.record(2, 2.0)
    assert pauses.counts[0][0] == 1
    assert pauses.counts[2][GC_PAUSE_BOUNDS_S.index(0.5)] == 1
    assert pauses.counts[2][-1] == 1  # over the last bound: +Inf
    assert pauses.max_s == [0.0002, 0.0, 2.0]
    assert pauses.total_s == pytest.approx(2.3002)


def test_the_setting_is_on_off_or_refused() -> None:
    assert gc_tuning_wanted({}) is True
    assert gc_tuning_wanted({"TIDEMQ_GC_TUNING": "off"}) is False
    assert gc_tuning_wanted({"TIDEMQ_GC_TUNING": " ON "}) is True
    with pytest.raises(ValueError, match="expected on or off"):
        gc_tuning_wanted({"TIDEMQ_GC_TUNING": "false"})


def test_tuning_freezes_survivors_and_raises_the_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    tune_after_start()
    assert gc.get_freeze_count() > 1000  # at least the modules the test process imported
    assert gc.get_threshold()[0] == GEN0_THRESHOLD


async def test_loop_lag_warning_says_how_much_was_gc(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor("broker test")
    with caplog.at_level(logging.WARNING, logger="tidemq.metrics.loop_lag"):
        monitor.record(0.2, 0.15)
    assert "200 ms late (garbage collection: 150 ms meanwhile" in caplog.text


async def test_broker_exports_gc_pauses(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", **PROM) as broker:
        before = sum(process_gc_pauses().counts[2])
        gc.collect()
        _, text = await scrape(broker)
    samples = parse(text)
    count = value(samples, "tidemq_gc_pause_seconds_count", generation="2")
    assert count >= before + 1
    assert value(samples, "tidemq_gc_pause_seconds_sum", generation="2") > 0
    assert value(samples, "tidemq_gc_pause_seconds_bucket", generation="2", le="+Inf") == count


def _namesrv(tmp_path: Path, env_value: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidemq.cli.main",
            "--log-level",
            "INFO",
            "namesrv",
            "--port",
            str(free_port()),
        ],
        cwd=tmp_path,
        env={**os.environ, "TIDEMQ_GC_TUNING": env_value},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


def _lines_until_ready(process: subprocess.Popen[str]) -> list[str]:
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        assert line, "".join(lines)  # the process ended before it was ready
        lines.append(line)
        if "ready; Ctrl-C to stop" in line:
            return lines
    raise AssertionError("".join(lines))


@pytest.mark.parametrize(("env_value", "tuned"), [("on", True), ("off", False)])
def test_a_started_server_is_tuned_unless_turned_off(
    tmp_path: Path, env_value: str, tuned: bool
) -> None:
    process = _namesrv(tmp_path, env_value)
    try:
        lines = _lines_until_ready(process)
    finally:
        process.terminate()
        process.communicate(timeout=START_TIMEOUT_S)  # and closes the pipe
    assert any("start-up objects frozen" in line for line in lines) is tuned, lines


def test_a_bad_value_stops_the_start(tmp_path: Path) -> None:
    process = _namesrv(tmp_path, "sometimes")
    _, stderr = process.communicate(timeout=START_TIMEOUT_S)
    assert process.returncode == 2
    assert "tidemq namesrv: TIDEMQ_GC_TUNING='sometimes': expected on or off" in stderr
