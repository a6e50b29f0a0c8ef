"""Crash-safe truncation of a stopped store's commit log (a slave dropping divergent data).

A slave that follows a new master may hold records the new master never had (the old master's
last writes that no sync-set member acknowledged). It must cut its log back to where the two
diverged (store/epochs.py says where) before it replicates again. The cut touches several files,
and a crash half-way must not leave a store that recovers to a different log, or refuses to
start. So the target is written down first, every step is idempotent, and a start that finds
the note redoes all of them before recovery:

    truncate_store(root, config, offset)          hook step after it
      check   the store is stopped (its lock);
              `offset` is a record boundary <= the log end (headers walked from its segment's
              start); offset == the log end: nothing to do, return
      1.      touch `abort`; write `truncate` = offset      "marked"
              (atomic: tmp, fsync, rename, dir fsync)
      2.      zero the commit log from offset to the end    "zeroed"
              of its segment (synced)
      3.      delete later segments, newest first;          "deleted" (after each one)
              fsync commitlog/
      4.      checkpoint := min(itself, offset)             "checkpoint"
      5.      epochs: cut_after(offset); dir fsync          "epochs"
      6.      unlink `truncate`; dir fsync                  "done"
      (steps 2-5 sync even when they find nothing to change: see _finish)

    FileMessageStore.start
      `truncate` present -> steps 2-6 again (redo_pending) -> recovery, as after a crash

Consume queues and the index are left to recovery (store/recovery.py). Step 4 puts the
checkpoint's offsets at or below the cut, so recovery's scan starts there, stops at the cut
(zeros follow), and drops every consume-queue entry pointing at or past it (recovery step 5).
Without step 4 a checkpoint past the cut would start the scan inside the zeroed range and
take that position for the log end. Stale index entries are harmless: a lookup checks the record
it points at (index.py). `abort` makes the next start a crash recovery whatever happens later;
the store's own clean stop removes it again.

The steps are synchronous file work: the store must be stopped. `truncate_store` takes the
store lock (store/lock.py), so a live store in any process makes it fail at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tidemq.errors import StoreError
from tidemq.protocol import record as rec
from tidemq.store.checkpoint import Checkpoint, CheckpointFile, read_checkpoint
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import StoreConfig
from tidemq.store.epochs import EpochFile, fsync_dir, write_atomic
from tidemq.store.lock import StoreLock
from tidemq.store.mapped_file import MappedFile

logger = logging.getLogger(__name__)

TRUNCATE_FILE_NAME: Final = "truncate"
ABORT_FILE_NAME: Final = "abort"  # FileMessageStore's: present at start = not a clean stop
# The hook points, in order (module docstring). Tests kill a process at each.
STEPS: Final = ("marked", "zeroed", "deleted", "checkpoint", "epochs", "done")

Hook = Callable[[str], None]


def pending_truncation(root: Path) -> int | None:
    """The offset of a truncation begun and not finished under `root`, None when there is none.

    Raises:
        StoreError: the `truncate` file is not a decimal offset (it is written atomically, so
            this is damage or a hand edit: guessing an offset could cut acknowledged data).
    """
    path = Path(root) / TRUNCATE_FILE_NAME
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise StoreError(f"truncation marker {path} is malformed: {text[:40]!r}")
    return int(text)


def truncate_store(
    root: Path, config: StoreConfig, offset: int, *, hook: Hook | None = None
) -> bool:
    """Cut the stopped store under `root` so that its log ends at `offset`; False when it
    already does (nothing was touched), True after a truncation.

    `hook(step)` is called after each step of the module docstring (tests stop there).

    Raises:
        StoreLockedError: the store is running (in this process or another).
        StoreError: `offset` is not a record boundary of the log, lies beyond its end or below
            its first segment; a truncation is pending for another offset (start the store once
            to finish it); or a file could not be written.
    """
    root = Path(root)
    if not root.is_dir():
        if offset == 0:
            return False
        raise StoreError(f"cannot truncate {root} to {offset}: no store there")
    lock = StoreLock(root)
    try:
        pending = pending_truncation(root)
        if pending is not None and pending != offset:
            raise StoreError(
                f"cannot truncate {root} to {offset}: a truncation to {pending} is pending "
                "(start the store once to finish it)"
            )
        if pending is None and not _check_offset(root, config, offset):
            return False
        (root / ABORT_FILE_NAME).touch()
        write_atomic(root / TRUNCATE_FILE_NAME, f"{offset}\n".encode("ascii"))
        _step(hook, "marked")
        _finish(root, config, offset, hook)
        return True
    finally:
        lock.release()


def redo_pending(root: Path, config: StoreConfig, *, hook: Hook | None = None) -> int | None:
    """Finish a pending truncation (steps 2-6 again; each is idempotent). The caller holds the
    store lock: FileMessageStore.start calls it first, before reading anything. Returns the
    offset cut to, None when nothing was pending."""
    root = Path(root)
    offset = pending_truncation(root)
    if offset is None:
        return None
    logger.warning("finishing the truncation of %s to commit-log offset %d", root, offset)
    (root / ABORT_FILE_NAME).touch()  # it was, before the marker; the start must see a crash
    _finish(root, config, offset, hook)
    return offset


def _step(hook: Hook | None, name: str) -> None:
    assert name in STEPS
    if hook is not None:
        hook(name)


def _open_log(root: Path, config: StoreConfig) -> CommitLog:
    log = CommitLog(root / "commitlog", config.commit_log_file_size, resident_bytes=0)
    log.load()
    return log


def _check_offset(root: Path, config: StoreConfig, offset: int) -> bool:
    """True when `offset` is a record boundary before the log's end, False when it is the end.

    Raises StoreError otherwise (module docstring)."""
    log = _open_log(root, config)
    try:
        files = log.files.files
        if not files:
            if offset == 0:
                return False
            raise StoreError(f"cannot truncate {root} to {offset}: its commit log is empty")
        last = files[-1]
        if offset == last.end_offset:  # the end if the last segment ends with its marker
            _walk_to(last, offset, root)
            return False
        mf = log.files.find_file(offset)
        if mf is None:
            raise StoreError(
                f"cannot truncate {root} to {offset}: outside the commit log "
                f"[{files[0].start_offset}, {files[-1].end_offset})"
            )
        _walk_to(mf, offset, root)
        later = any(f.start_offset > offset for f in files)
        pos = offset - mf.start_offset
        return later or rec.record_head_at(mf.mm, pos) != (0, 0)
    finally:
        log.close()


def _walk_to(mf: MappedFile, offset: int, root: Path) -> None:
    """Hop record headers from the start of `mf` (always a record boundary) to `offset`;
    raise StoreError unless one lands exactly on it (or `offset` is the segment's end and a
    blank marker leads there). Headers only: records below the cut are
    kept as they are, and their CRCs are checked by recovery and every read."""
    target = offset - mf.start_offset
    pos = 0
    while pos < target:
        size, magic = rec.record_head_at(mf.mm, pos)
        remaining = mf.size - pos
        if magic == rec.MAGIC_RECORD and (
            rec.RECORD_FIXED_SIZE <= size <= remaining - rec.BLANK_MARKER_SIZE
        ):
            pos += size
            continue
        if magic == rec.BLANK_MAGIC and size == remaining:
            if target == mf.size:  # the marker leads to the segment's end: a boundary too
                return
            what = f"the blank marker at {mf.start_offset + pos} ending segment {mf.path.name}"
        elif (size, magic) == (0, 0):
            what = f"the log end {mf.start_offset + pos}"
        else:
            what = f"damaged bytes at {mf.start_offset + pos}"
        raise StoreError(f"cannot truncate {root} to {offset}: it lies past {what}")
    if pos != target:
        raise StoreError(
            f"cannot truncate {root} to {offset}: not a record boundary (a record of "
            f"segment {mf.path.name} spans it, ending at {mf.start_offset + pos})"
        )


def _finish(root: Path, config: StoreConfig, offset: int, hook: Hook | None) -> None:
    """Steps 2-6: the marker is in place, so a crash anywhere here is finished at start.

    Each step syncs even when it finds its work done: a killed run may have changed the bytes
    (in the page cache) without syncing them, and a redo that skipped the sync would remove the
    marker while a power loss could still bring the old bytes back."""
    _cut_log(root, config, offset, hook)
    _lower_checkpoint(root / "checkpoint", offset)
    _step(hook, "checkpoint")
    EpochFile.for_store(root).cut_after(offset)
    fsync_dir(root)  # its rename may be an earlier, killed run's: durable before the marker goes
    _step(hook, "epochs")
    (root / TRUNCATE_FILE_NAME).unlink(missing_ok=True)
    fsync_dir(root)
    logger.warning("truncated the commit log of %s to offset %d", root, offset)
    _step(hook, "done")


def _cut_log(root: Path, config: StoreConfig, offset: int, hook: Hook | None) -> None:
    """Steps 2-3. Zeroing first, then deleting newest first: a crash in between leaves a
    contiguous run of segments, whose redo is the same work again."""
    log = _open_log(root, config)
    try:
        files = log.files.files
        holding = next((f for f in files if f.start_offset <= offset < f.end_offset), None)
        if holding is not None:
            holding.zero_from(offset - holding.start_offset)
            holding.flush_all()  # zero_from syncs only what it changed (see _finish)
        _step(hook, "zeroed")
        later = [f for f in files if f.start_offset > offset]
        for mf in reversed(later):
            mf.destroy()
            _step(hook, "deleted")
        if files:
            fsync_dir(log.files.directory)
        if later:
            logger.warning("deleted %d commit-log segments after offset %d", len(later), offset)
    finally:
        log.close()


def _lower_checkpoint(path: Path, offset: int) -> None:
    """Step 4: no checkpoint offset above the cut (module docstring). A missing or damaged
    checkpoint stays so: recovery then rebuilds from the first segment anyway."""
    cp = read_checkpoint(path)
    if cp is None:
        return
    lowered = Checkpoint(
        min(cp.log_flushed_offset, offset), min(cp.logic_flushed_offset, offset), cp.timestamp_ms
    )
    checkpoint = CheckpointFile(path)  # written (and synced) even if unchanged: see _finish
    try:
        checkpoint.write(lowered)
    finally:
        checkpoint.close()
