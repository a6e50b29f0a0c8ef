"""Run a store truncation and SIGKILL this process at one of its steps (test_truncate.py).

    python truncate_kill.py ROOT SEGMENT_BYTES OFFSET STEP truncate|redo

`truncate`: truncate_store(ROOT, ..., OFFSET); `redo`: finish a pending one as a store start
does (redo_pending), without starting the store. The kill comes the first time the hook names
STEP, so the files are exactly as a crash there leaves them (the page cache survives a kill).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tidemq.store.config import StoreConfig
from tidemq.store.truncate import redo_pending, truncate_store


def main(argv: list[str]) -> int:
    root, segment_bytes, offset, step, mode = argv
    config = StoreConfig(root_dir=Path(root), commit_log_file_size=int(segment_bytes))

    def hook(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    if mode == "truncate":
        truncate_store(config.root_dir, config, int(offset), hook=hook)
    else:
        redo_pending(config.root_dir, config, hook=hook)
    return 0  # the step never came


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
