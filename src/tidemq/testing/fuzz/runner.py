"""The long fuzz run: every target for a share of a time budget, in chunks of examples.

Each chunk is one Hypothesis run with a fresh seed (printed, so a chunk can be replayed), no
example database and no deadline; a check that runs longer than `hang_seconds` is interrupted by
an alarm and counts as a finding. Hypothesis stops a run at its first failure and shrinks it; the
minimal case is the last one the check saw fail, so that is the one saved:

    <failures-dir>/<target>-<signature hash>.txt   repr of the case, the error, the seed
    <failures-dir>/<target>-<signature hash>.bin   the mutated bytes, when the case has them

A finding's signature is its exception type and the place it was raised, so the same bug found
in ten chunks is one distinct failure, saved once. A hang (a BaseException) is not shrunk: it
ends its chunk at once. The report counts generated examples apart from the checks that only
shrink or replay a failure ("shrinks"), so a failing target's rate is not inflated by them.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, seed, settings

from tidemq.testing.fuzz.targets import TARGETS, Target

# Examples per Hypothesis run: the first run is short; later ones are sized from the rate seen so
# far to last about CHUNK_SECONDS (and never past the target's share of the budget).
CHUNK_EXAMPLES_FIRST: Final = 100
CHUNK_EXAMPLES_MAX: Final = 5_000
CHUNK_SECONDS: Final = 20.0


class Hang(BaseException):
    """A check ran past the runner's per-example time limit. A BaseException, so no `except
    Exception` in the code under test (or in Hypothesis, which then does not shrink a hang:
    each shrink step would take the whole limit) can swallow it."""


@dataclass
class TargetReport:
    name: str
    # Cases Hypothesis generated (each checked once), and the further checks of a failing run:
    # shrink steps and the final replay.
    examples: int = 0
    shrink_checks: int = 0
    chunks: int = 0
    seconds: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)  # signature hash -> first line


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise Hang(f"check ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def signature(exc: BaseException) -> str:
    """Exception type and where it was raised (file:line of the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    message = re.sub(r"\d+", "N", str(exc).splitlines()[0] if str(exc) else "")[:80]
    return f"{type(exc).__name__} at {where}: {message}"


def _save(
    directory: Path, target: str, sig: str, case: Any, exc: BaseException, run_seed: int
) -> str:
    digest = hashlib.sha256(sig.encode()).hexdigest()[:12]
    directory.mkdir(parents=True, exist_ok=True)
    error = "".join(traceback.format_exception(exc))
    text = f"target: {target}\nseed: {run_seed}\nsignature: {sig}\n\ncase:\n{case!r}\n\n{error}"
    (directory / f"{target}-{digest}.txt").write_text(text)
    data = getattr(case, "data", None)
    if isinstance(data, bytes):
        (directory / f"{target}-{digest}.bin").write_bytes(data)
    return digest


def _chunk(
    target: Target, report: TargetReport, hang_seconds: float, examples: int
) -> tuple[int, BaseException | None, Any]:
    """One Hypothesis run of `target`: (seed, the final failure or None, its case)."""
    run_seed = random.randrange(2**32)
    last: list[Any] = [None, None]

    def check(case: Any) -> None:
        # Generation stops at a run's first failure (report_multiple_bugs=False); every check
        # after it is a shrink step or the replay of the minimal case, not a new example.
        if last[1] is None:
            report.examples += 1
        else:
            report.shrink_checks += 1
        try:
            with _alarm(hang_seconds):
                target.check(case)
        except BaseException as exc:
            last[:] = [case, exc]
            raise

    run = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )(seed(run_seed)(given(target.cases)(check)))
    try:
        run()
    except (Exception, Hang) as exc:
        return run_seed, last[1] or exc, last[0]
    return run_seed, None, None


def fuzz_target(
    target: Target, seconds: float, failures_dir: Path, hang_seconds: float
) -> TargetReport:
    report = TargetReport(target.name)
    started = time.monotonic()
    seen: set[str] = set()
    examples = CHUNK_EXAMPLES_FIRST
    while (elapsed := time.monotonic() - started) < seconds:
        if checks := report.examples + report.shrink_checks:
            rate = checks / elapsed
            left = min(CHUNK_SECONDS, seconds - elapsed)
            examples = max(10, min(CHUNK_EXAMPLES_MAX, int(rate * left)))
        run_seed, exc, case = _chunk(target, report, hang_seconds, examples)
        report.chunks += 1
        if exc is not None:
            sig = signature(exc)
            if sig not in seen:
                seen.add(sig)
                digest = _save(failures_dir, target.name, sig, case, exc, run_seed)
                report.failures[digest] = sig
                print(f"  {target.name}: FAILURE {digest} (seed {run_seed}): {sig}", flush=True)
    report.seconds = time.monotonic() - started
    return report


def main_exit_code(reports: list[TargetReport]) -> int:
    """1 when any target failed, else 0."""
    return 1 if any(r.failures for r in reports) else 0


def run(
    names: list[str], budget_seconds: float, failures_dir: Path, hang_seconds: float
) -> list[TargetReport]:
    """Every named target for an equal share of the budget; prints one line per target."""
    share = budget_seconds / len(names)
    reports = []
    for name in names:
        print(f"fuzzing {name} for {share:.0f} s ...", flush=True)
        reports.append(fuzz_target(TARGETS[name], share, failures_dir, hang_seconds))
    columns = ("target", "examples", "shrinks", "chunks", "seconds", "failures")
    print("\n{:<14} {:>10} {:>8} {:>7} {:>8} {:>9}".format(*columns))
    for r in reports:
        row = (r.name, r.examples, r.shrink_checks, r.chunks, f"{r.seconds:.0f}", len(r.failures))
        print("{:<14} {:>10} {:>8} {:>7} {:>8} {:>9}".format(*row))
    total = sum(r.examples for r in reports)
    shrinks = sum(r.shrink_checks for r in reports)
    failures = sum(len(r.failures) for r in reports)
    print("{:<14} {:>10} {:>8} {:>7} {:>8} {:>9}".format("total", total, shrinks, "", "", failures))
    if failures:
        print(f"\nfailing inputs saved in {failures_dir}")
    return reports
