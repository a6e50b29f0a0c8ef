"""The epoch file: which master epoch wrote which stretch of this replica's commit log.

    <root_dir>/epochs           one line per epoch, oldest first
    +--------------------------+
    | 1 0                      |   epoch 1 wrote from offset 0
    | 2 81920                  |   epoch 2 from 81920 (its master was promoted at that log end)
    | 4 163840                 |   epoch 4 from 163840: its data ends the log
    +--------------------------+
      "<epoch> <startOffset>\\n", epoch strictly increasing, start non-decreasing

In controller mode (issue 14) a promoted master appends (its epoch, its max offset), and a slave
about to follow the master of epoch E compares its entries with the group's history to find
where its log diverged, truncates there (store/truncate.py) and appends (E, its new end). So
the file is the only record of whose data a replica holds: it must never be half written. Every
change writes the whole file to `epochs.tmp`, syncs it, renames it over `epochs` and syncs the
directory: a crash leaves the old file or the new one, never a mix. A missing file is an empty
history (a replica that never took part in an election); a malformed one refuses to load,
since guessing would let a replica keep divergent data.

Synchronous and small (the group keeps at most a few hundred epochs): the file is read at
construction and rewritten whole on each change.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final, NamedTuple

from tidemq.errors import StoreError

EPOCH_FILE_NAME: Final = "epochs"
_LINE: Final = re.compile(r"(\d+) (\d+)")


class Epoch(NamedTuple):
    epoch: int
    start: int  # the commit-log offset of the epoch's first byte on this replica


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable (the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` all at once: tmp file, fsync, rename, directory fsync.

    A reader (or a restart after a crash at any point) sees the old content or the new one.
    A stale `<name>.tmp` from an earlier crash is overwritten.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _check_next(last: Epoch | None, epoch: int, start: int) -> str | None:
    """Why (epoch, start) may not follow `last`, or None when it may."""
    if epoch < 1:
        return f"epoch {epoch} < 1"
    if start < 0:
        return f"start offset {start} < 0"
    if last is not None and epoch <= last.epoch:
        return f"epoch {epoch} does not follow epoch {last.epoch}"
    if last is not None and start < last.start:
        return f"epoch {epoch} starts at {start}, before epoch {last.epoch}'s start {last.start}"
    return None


def _parse(path: Path, text: str) -> list[Epoch]:
    entries: list[Epoch] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    for number, line in enumerate(lines, 1):
        match = _LINE.fullmatch(line)
        if match is None:
            raise StoreError(
                f"epoch file {path} line {number} is malformed: {line[:80]!r} "
                "(expected '<epoch> <startOffset>')"
            )
        epoch, start = int(match.group(1)), int(match.group(2))
        problem = _check_next(entries[-1] if entries else None, epoch, start)
        if problem is not None:
            raise StoreError(f"epoch file {path} line {number} is invalid: {problem}")
        entries.append(Epoch(epoch, start))
    return entries


class EpochFile:
    """The epoch history of one replica, loaded from `path` at construction.

    Raises (constructor):
        StoreError: the file exists but a line is malformed or breaks the order rules; the
            message names the file and the line.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            text = ""
        except UnicodeDecodeError as exc:
            raise StoreError(f"epoch file {self.path} is not ASCII text: {exc}") from None
        self._entries = _parse(self.path, text)

    @classmethod
    def for_store(cls, root: Path) -> EpochFile:
        """The epoch file of the store under `root` (`<root>/epochs`)."""
        return cls(Path(root) / EPOCH_FILE_NAME)

    @property
    def entries(self) -> tuple[Epoch, ...]:
        return tuple(self._entries)

    @property
    def last_epoch(self) -> int:
        """The newest epoch, 0 for an empty history (epochs start at 1)."""
        return self._entries[-1].epoch if self._entries else 0

    def append(self, epoch: int, start: int) -> None:
        """Record that `epoch` writes from `start` on, and make it durable before returning.

        Raises:
            ValueError: `epoch` is not above the last epoch, or `start` is below its start.
        """
        problem = _check_next(self._entries[-1] if self._entries else None, epoch, start)
        if problem is not None:
            raise ValueError(f"cannot append to {self.path}: {problem}")
        self._write([*self._entries, Epoch(epoch, start)])

    def cut_after(self, offset: int) -> int:
        """Forget the epochs that start after `offset` (the log was truncated to `offset`), and
        keep the one covering it. Returns how many were dropped; writes only when one was, so
        redoing a truncation (store/truncate.py) changes nothing the second time."""
        kept = [e for e in self._entries if e.start <= offset]
        dropped = len(self._entries) - len(kept)
        if dropped:
            self._write(kept)
        return dropped

    def _write(self, entries: list[Epoch]) -> None:
        text = "".join(f"{e.epoch} {e.start}\n" for e in entries)
        write_atomic(self.path, text.encode("ascii"))
        self._entries = entries
