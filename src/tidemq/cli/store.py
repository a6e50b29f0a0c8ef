"""Offline store tools: `tidemq store verify DIR` and `tidemq store dump DIR` (both --json).

They read the same record code as the broker (protocol/record.py through store/tools.py) and never
write, so they are safe on a live or a crashed store directory. On a live one they say so first:
its tail moves while they read, and its `abort` marker means "running", not "crashed".

`verify` reads the whole commit log, which takes a while on a big store: on a terminal it draws
a bar with the elapsed time on stderr meanwhile (cli/progress.py). With --json, `dump` writes
one document holding every record (bounded by --limit), for scripts; the text form streams.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tidemq.cli.output import add_json_flag, emit_json, wants_json
from tidemq.cli.progress import track
from tidemq.protocol import record as rec
from tidemq.store import tools
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.lock import holder_pid
from tidemq.store.mapped_file import SEGMENT_NAME_DIGITS


def add_parsers(verbs: Any) -> None:
    store = verbs.add_parser("store", help="inspect a broker's store directory (read-only)")
    actions = store.add_subparsers(dest="action", required=True)
    verify = actions.add_parser("verify", help="check every record's layout and CRC")
    verify.add_argument("dir", type=Path)
    add_json_flag(verify).set_defaults(run=run_verify)
    dump = actions.add_parser("dump", help="print the records of the commit log")
    dump.add_argument("dir", type=Path)
    dump.add_argument("--limit", type=int, default=None, help="at most this many records")
    add_json_flag(dump).set_defaults(run=run_dump)


def _live_line(directory: Path, pid: int | None) -> str | None:
    if pid is None:
        return None
    return (
        f"note: a live broker (pid {pid or 'unknown'}) holds {directory}; reading it read-only, "
        "its tail may move meanwhile"
    )


def run_verify(args: argparse.Namespace) -> int:
    # The total is unknown: segments are preallocated, the log's end is found by reading it.
    with track("verifying bytes", None) as bar:
        report = tools.verify(args.dir, bar.advance)
    live = _live_line(args.dir, report.live_pid)
    if wants_json(args):
        emit_json(
            {
                "ok": report.ok,
                "segments": report.segments,
                "records": report.records,
                "first_offset": report.first_offset,
                "end_offset": report.end_offset,
                "stop_reason": report.stop_reason,
                "trailing_garbage": report.trailing_garbage,
                "later_segments": report.later_segments,
                "clean_stop": report.clean_stop,
                "consume_queues": report.consume_queues,
                "live_pid": report.live_pid,
                "problems": report.problems,
            }
        )
        return 0 if report.ok else 1
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
    if wants_json(args):
        if live is not None:
            print(live, file=sys.stderr)
        emit_json(_dump_document(args.dir, args.limit))
        return 0
    if live is not None:
        print(f"# {live}")
    tools.dump(args.dir, sys.stdout, max_records=args.limit)
    return 0


def _dump_document(directory: Path, limit: int | None) -> dict[str, Any]:
    """The records `dump` would print, as one JSON document (bodies left out, as in the text
    form; their size is there)."""
    segments = sorted(
        path
        for path in (directory / "commitlog").glob("*")
        if len(path.name) == SEGMENT_NAME_DIGITS and path.name.isdigit()
    )
    size = segments[0].stat().st_size if segments else None
    if size is None:
        return {"records": [], "limited": False, "end_offset": 0, "stop_reason": "no commit log"}
    log = CommitLog(directory / "commitlog", size, read_only=True)
    log.load()
    records: list[dict[str, Any]] = []
    try:
        scanner = LogScanner(log, log.min_offset)
        for m in scanner.records():
            if limit is not None and len(records) >= limit:
                return {"records": records, "limited": True}
            properties = {k: v for k, v in m.property_map().items() if k != rec.CRC_PROPERTY}
            records.append(
                {
                    "physical_offset": m.physical_offset,
                    "total_size": m.total_size,
                    "topic": m.topic,
                    "queue_id": m.queue_id,
                    "queue_offset": m.queue_offset,
                    "sys_flag": m.sys_flag,
                    "store_timestamp": m.store_timestamp,
                    "born_host": f"{m.born_host[0]}:{m.born_host[1]}",
                    "body_size": len(m.body),
                    "properties": properties,
                }
            )
        return {
            "records": records,
            "limited": False,
            "end_offset": scanner.end_offset,
            "stop_reason": scanner.stop_reason,
        }
    finally:
        log.close()
