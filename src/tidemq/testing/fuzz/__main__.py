"""`python -m tidemq.testing.fuzz --budget-seconds N [--targets a,b] [--failures-dir D]`.

The daily long run of the fuzz targets (`make fuzz`, which then runs the network fuzz test for a
few random seeds): prints per target the examples generated, the further checks that only shrink
or replay a failure, and the distinct failures, saves each failing input under the failures
folder, and exits 1 when any target failed (2 on bad arguments). runner.py has the loop;
targets.py the targets.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tidemq.testing.fuzz.runner import main_exit_code, run
from tidemq.testing.fuzz.targets import TARGETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidemq.testing.fuzz", description=__doc__)
    parser.add_argument("--budget-seconds", type=float, default=600.0)
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--failures-dir", type=Path, default=Path("fuzz-failures"))
    parser.add_argument(
        "--hang-seconds", type=float, default=10.0, help="one check longer than this is a hang"
    )
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    reports = run(names, args.budget_seconds, args.failures_dir, args.hang_seconds)
    return main_exit_code(reports)


if __name__ == "__main__":
    sys.exit(main())
