"""Crash-safe writes of the broker's small JSON config files (topics, groups, consumer offsets).

A file is replaced, never edited: the new content goes to `<name>.tmp`, is fsync'd, then renamed
over the old one, and the directory is fsync'd so the rename itself survives a power cut. A reader
therefore sees either the old or the new file, whole. The previous version is kept as
`<name>.bak` (as RocketMQ's ConfigManager does) so a file damaged by hand can be recovered.

Writing means fsync, which can take tens of milliseconds on a busy disk, so the broker does not
do it on the event loop while serving: a `ConfigWriter` takes the snapshot (bytes) on the loop and
writes it with `asyncio.to_thread`, at most once per CONFIG_WRITE_INTERVAL_MS however many changes
arrive (the newest snapshot wins). Without a running loop (start-up, tools) and at shutdown it
writes synchronously. Snapshots carry a sequence number so an older one never lands after a newer.
The topic table is the exception: an admin change is written (`write_atomic`) before its answer,
on the loop, and auto-created topics go to a journal (topics.py's module doc).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

# Least time between two background writes of one config file. Changes come in bursts (a
# rebalance auto-creates a group and its retry topic per consumer); one write per burst is enough,
# and what a crash can lose in this window (auto-created entries) is re-created by the clients.
CONFIG_WRITE_INTERVAL_MS: Final = 1_000

_UNQUOTED_INT_KEY: Final = re.compile(rb"([{,]\s*)(-?\d+)(\s*:)")


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if path.exists():
        try:
            os.replace(path, path.with_name(path.name + ".bak"))
        except OSError as exc:  # the backup is a convenience; the write must still happen
            log.warning("could not keep a backup of %s: %s", path, exc)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_optional(path: Path) -> bytes | None:
    """The file's bytes; falls back to `<name>.bak` when the file is missing; None if neither."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        if candidate is not path:
            log.warning("%s missing; loading its backup %s", path, candidate)
        return data
    return None


def quote_int_keys(data: bytes) -> bytes:
    """fastjson writes maps with int keys unquoted (`{0:12}`); make that standard JSON."""
    return _UNQUOTED_INT_KEY.sub(rb'\1"\2"\3', data)


class ConfigWriter:
    """Writes one config file: now (`write`) or soon, off the loop and coalesced (`submit`)."""

    def __init__(self, path: Path, *, interval_ms: int = CONFIG_WRITE_INTERVAL_MS) -> None:
        self.path = path
        self._interval_s = interval_ms / 1000
        self._lock = threading.Lock()
        self._seq = 0  # of the newest snapshot taken
        self._written_seq = 0  # of the newest snapshot on disk
        self._pending: tuple[int, bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self.writes = 0

    def write(self, data: bytes) -> None:
        """Write `data` now on this thread (start-up, shutdown, tests); supersedes any pending."""
        self._seq += 1
        self._pending = None
        if self._task is not None:
            self._task.cancel()  # an in-flight write of an older snapshot is skipped or precedes
            self._task = None
        self._write(self._seq, data)

    def submit(self, data: bytes) -> None:
        """Write `data` soon, in a thread; a later submit before then replaces it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write(data)
            return
        self._seq += 1
        self._pending = (self._seq, data)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain(), name=f"write {self.path.name}")

    async def flush(self) -> None:
        """Write what is pending now and stop the background task (shutdown)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        pending, self._pending = self._pending, None
        if pending is not None:
            await asyncio.to_thread(self._write, *pending)

    async def _drain(self) -> None:
        while self._pending is not None:
            (seq, data), self._pending = self._pending, None
            try:
                await asyncio.to_thread(self._write, seq, data)
            except OSError:
                log.exception("could not write %s; retrying", self.path)
                if self._pending is None:
                    self._pending = (seq, data)
            await asyncio.sleep(self._interval_s)

    def _write(self, seq: int, data: bytes) -> None:
        with self._lock:
            if seq <= self._written_seq:
                return  # a newer snapshot is already on disk
            write_atomic(self.path, data)
            self._written_seq = seq
            self.writes += 1
