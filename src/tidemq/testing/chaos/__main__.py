"""`python -m tidemq.testing.chaos --seed N --faults K --run-dir D [--short]`: one chaos run.

Runs as root for network namespaces (else loopback, partitions skipped); prints one table and
exits 0 iff no acknowledged message was lost, no rolled-back transaction became visible, no
committed one stayed invisible and no ordered key went out of order. runner.py has the phases.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tidemq.testing.chaos.faults import KINDS, SELF_TEST_KINDS
from tidemq.testing.chaos.runner import main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tidemq.testing.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults", type=int, default=None, help="fault steps (default 100; 5 short)"
    )
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--short", action="store_true", help="CI form: few faults, fewer clients")
    parser.add_argument(
        "--mode",
        choices=("controller", "4x"),
        default="controller",
        help="controller: issue 14's failover group; 4x: SYNC_MASTER + 2 SLAVEs (no failover)",
    )
    parser.add_argument("--etcd-members", type=int, choices=(1, 3), default=1)
    parser.add_argument("--loopback", action="store_true", help="no namespaces even as root")
    parser.add_argument(
        "--disk-full",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="brokers' stores on tmpfs, for the disk-full fault (default: on as root)",
    )
    parser.add_argument("--producers", type=int, default=None, help="plain producers (2; 1 short)")
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"fault kinds to draw from, comma-separated (default all; also {SELF_TEST_KINDS})",
    )
    args = parser.parse_args(argv)
    args.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = set(args.kinds) - {*KINDS, *SELF_TEST_KINDS}
    if unknown or not args.kinds:
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {KINDS + SELF_TEST_KINDS}")
    if args.faults is None:
        args.faults = 5 if args.short else 100
    if args.producers is None:
        args.producers = 1 if args.short else 2
    if args.disk_full is None:
        args.disk_full = not args.loopback and _root()
    return args


def _root() -> bool:
    return os.geteuid() == 0


if __name__ == "__main__":
    sys.exit(main(parse_args(sys.argv[1:])))
