"""Offline store tools: `tidemq store verify DIR` and `tidemq store dump DIR`.

They read the same record code as the broker (protocol/record.py through store/tools.py) and never
write, so they are safe on a live or a crashed store directory. On a live one they say so first:
its tail moves while they read, and its `abort` marker means "running", not "crashed".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tidemq.store import tools
from tidemq.store.lock import holder_pid


def add_parsers(verbs: Any) -> None:
    store = verbs.add_parser("store", help="inspect a broker's store directory (read-only)")
    actions = store.add_subparsers(dest="action", required=True)
    verify = actions.add_parser("verify", help="check every record's layout and CRC")
    verify.add_argument("dir", type=Path)
    verify.set_defaults(run=run_verify)
    dump = actions.add_parser("dump", help="print the records of the commit log")
    dump.add_argument("dir", type=Path)
    dump.add_argument("--limit", type=int, default=None, help="at most this many records")
    dump.set_defaults(run=run_dump)


def _live_line(directory: Path, pid: int | None) -> str | None:
    if pid is None:
        return None
    return (
        f"note: a live broker (pid {pid or 'unknown'}) holds {directory}; reading it read-only, "
        "its tail may move meanwhile"
    )


def run_verify(args: argparse.Namespace) -> int:
    report = tools.verify(args.dir)
    live = _live_line(args.dir, report.live_pid)
    if live is not None:
        print(live)
        state = "running"
    else:
        state = "clean stop" if report.clean_stop else "not stopped cleanly"
    print(
        f"{report.records} records in {report.segments} segment(s), "
        f"offsets [{report.first_offset}, {report.end_offset}); "
        f"{report.consume_queues} consume queue(s); {state}"
    )
    for problem in report.problems:
        print(f"problem: {problem}")
    print("OK" if report.ok else f"{len(report.problems)} problem(s)")
    return 0 if report.ok else 1


def run_dump(args: argparse.Namespace) -> int:
    live = _live_line(args.dir, holder_pid(args.dir))
    if live is not None:
        print(f"# {live}")
    tools.dump(args.dir, sys.stdout, max_records=args.limit)
    return 0
