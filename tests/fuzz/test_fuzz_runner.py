"""`make fuzz`'s runner: it counts examples, saves each distinct failure once, and stops hangs."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import strategies as st

from tidemq.testing.fuzz.runner import fuzz_target, main_exit_code
from tidemq.testing.fuzz.targets import Target


def _fails_on_big_numbers(value: int) -> None:
    if value > 1000:
        raise ValueError(f"{value} is too big")


def test_a_failure_is_saved_once_with_its_minimal_case(tmp_path: Path) -> None:
    target = Target("toy", st.integers(0, 10**6), _fails_on_big_numbers)
    report = fuzz_target(target, seconds=1.0, failures_dir=tmp_path, hang_seconds=5.0)
    assert report.examples > 0
    assert len(report.failures) == 1
    [saved] = tmp_path.glob("toy-*.txt")
    text = saved.read_text()
    assert "ValueError" in text
    assert "\n1001\n" in text  # shrunk to the smallest failing value
    assert main_exit_code([report]) == 1
    # Shrinking to 1001 took further checks: they are not counted as generated examples.
    assert report.shrink_checks > 0


def test_a_passing_target_reports_no_failure(tmp_path: Path) -> None:
    target = Target("fine", st.integers(), lambda value: None)
    report = fuzz_target(target, seconds=0.5, failures_dir=tmp_path, hang_seconds=5.0)
    assert report.examples > 0
    assert report.shrink_checks == 0
    assert not report.failures
    assert not list(tmp_path.iterdir())
    assert main_exit_code([report]) == 0


def test_a_check_that_hangs_is_a_failure(tmp_path: Path) -> None:
    def hangs(value: int) -> None:
        if value == 7:
            time.sleep(60)

    target = Target("hangs", st.just(7), hangs)
    started = time.monotonic()
    report = fuzz_target(target, seconds=0.1, failures_dir=tmp_path, hang_seconds=0.2)
    assert time.monotonic() - started < 30
    assert [sig for sig in report.failures.values() if sig.startswith("Hang")]


def test_a_hang_is_not_swallowed_by_a_broad_except(tmp_path: Path) -> None:
    def hides_errors(value: int) -> None:
        try:
            time.sleep(60)
        except Exception:  # the code under test may do this; the runner's alarm gets through
            pass

    target = Target("hides", st.just(0), hides_errors)
    started = time.monotonic()
    report = fuzz_target(target, seconds=0.1, failures_dir=tmp_path, hang_seconds=0.2)
    assert time.monotonic() - started < 30
    assert [sig for sig in report.failures.values() if sig.startswith("Hang")]
    # A hang ends its chunk at once: no shrinking (each step would take the whole limit).
    assert report.shrink_checks == 0
