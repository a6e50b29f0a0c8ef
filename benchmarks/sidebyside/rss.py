"""The broker RSS case alone, with a backlog of any size (the suite runs it at 2 GiB):

    .venv/bin/python benchmarks/sidebyside/rss.py --backlog-gib 4 [--set commitLogResidentBytes=0]

Starts `tidemq dev` (ASYNC_FLUSH unless --flush), its data in a temporary directory under --dir
(removed afterwards), runs `cases.broker_rss` (write the backlog, then one consumer reads all of
it) and prints the suite's sentence and the figures as JSON. PYTHONPATH=<checkout>/src measures
another source tree (the broker inherits the environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidebyside import cases, servers
from sidebyside.common import Options
from tidemq.broker.config import FLUSH_DISK_TYPES

DISK_HEADROOM = 1.25  # the backlog plus consume queues, index and the disk guard's margin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog-gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--flush", choices=FLUSH_DISK_TYPES, default="ASYNC_FLUSH")
    parser.add_argument("--set", action="append", default=[], help="broker key=value")
    args = parser.parse_args()
    backlog_bytes = int(args.backlog_gib * 2**30)
    free = shutil.disk_usage(args.dir).free
    if free < backlog_bytes * DISK_HEADROOM:
        print(f"{args.dir}: {free / 2**30:.1f} GiB free, too little", file=sys.stderr)
        return 2
    options = Options(runs=1, backlog_bytes=backlog_bytes)
    with (
        tempfile.TemporaryDirectory(prefix="tidemq-rss-", dir=args.dir) as root,
        servers.tidemq(Path(root), args.flush, *args.set) as server,
    ):
        result = asyncio.run(cases.broker_rss(server.address, server.pid, options))
    print(cases.describe_rss(result))
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
