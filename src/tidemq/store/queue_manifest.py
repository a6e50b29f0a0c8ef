"""The queue manifest: which consume queues the store has.

    consumequeue/.queues      one "topic/queueId" line per queue (topic names have no '.')

A restart scans the commit log from the checkpoint itself, so it costs the records written
after it (none after a clean stop), not the records of the segment holding it. That segment
scan used to be what noticed a consume queue lost since (its records re-dispatched as STARTED).
The manifest keeps that: when a queue it names is missing, recovery falls back to re-dispatching
from the start of that segment (recovery.scan_start), which notices. It is rewritten by the
first flush after queues are created (before that flush's checkpoint), when a topic is
deleted, at the end of a start and at a stop; not synced: a lost
update only leaves a queue out of the check (a subset is still checked), and no manifest at all
(a store written before it) means the fallback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

QUEUE_MANIFEST_NAME: Final = ".queues"


def queue_dirs(cq_root: Path) -> list[tuple[str, int]]:
    """(topic, queue id) of every queue directory under `cq_root`, sorted. One scandir per
    directory (its entries say which are directories without a stat each): a start with
    10,000 queues lists 10,000 directories."""
    found: list[tuple[str, int]] = []
    try:
        topics = [e for e in os.scandir(cq_root) if e.is_dir()]
    except FileNotFoundError:
        return found
    for topic in topics:
        found.extend(
            (topic.name, int(q.name))
            for q in os.scandir(topic.path)
            if q.name.isdigit() and q.is_dir()
        )
    found.sort()
    return found


def write(cq_root: Path, queues: Iterable[tuple[str, int]]) -> None:
    """Name every queue, atomically (a torn manifest would only cost a longer scan, but a
    rename is cheap). A write that fails (a full disk) must not fail the put or the stop that
    made it: the old manifest is removed instead (unlinking needs no space), so the next start
    takes the longer scan."""
    path = cq_root / QUEUE_MANIFEST_NAME
    temporary = path.with_name(path.name + ".tmp")
    try:
        cq_root.mkdir(parents=True, exist_ok=True)
        temporary.write_text("".join(f"{t}/{q}\n" for t, q in sorted(queues)))
        temporary.replace(path)
    except OSError as exc:
        logger.warning("queue manifest %s not written (%s): the next start scans more", path, exc)
        path.unlink(missing_ok=True)
        temporary.unlink(missing_ok=True)


def complete(cq_root: Path, loaded: Iterable[tuple[str, int]]) -> bool:
    """Whether every queue the manifest names is among `loaded` (False without a manifest)."""
    try:
        text = (cq_root / QUEUE_MANIFEST_NAME).read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return False
    present = set(loaded)
    for line in text.splitlines():
        topic, _, queue_id = line.rpartition("/")
        if not queue_id.isdigit() or (topic, int(queue_id)) not in present:
            logger.warning("consume queue %s of the last clean stop is missing", line)
            return False
    return True
