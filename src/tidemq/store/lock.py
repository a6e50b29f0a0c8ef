"""The store lock: one live broker per store directory.

    <root_dir>/lock      the holder's pid as decimal text (informative; the lock is the flock)

Two writers on one store would append over each other's records, and the second one's clean
stop would delete the first one's `abort` marker, so a later crash of the first would be
recovered as a clean stop. RocketMQ takes a file lock on `<store>/lock` at start and refuses
with "Lock failed, MQ already started"; so do we, before anything else opens or modifies the
store (FileMessageStore.start takes it first).

`flock` rather than `fcntl` record locks: a flock belongs to the open file description, so a
second store opened in the same process (tests, `tidemq dev` twice in one interpreter) is
refused too, where POSIX record locks would let one process lock a file twice. The kernel drops
the lock when the holder exits, however it exits (kill -9 included), so a stale `lock` file
never blocks a restart.

The operator tools (`tidemq store verify|dump`) only ask whether a holder is live (`holder_pid`):
they take a shared lock for an instant and let it go, and never create the file.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Final

from tidemq.errors import StoreError

LOCK_FILE_NAME: Final = "lock"
# A pid is at most 7 digits on Linux (pid_max <= 2**22); read a little more, never the world.
_PID_TEXT_BYTES_MAX: Final = 32


class StoreLockedError(StoreError):
    """The store directory is locked by another live store (another broker process)."""


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, _PID_TEXT_BYTES_MAX, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


class StoreLock:
    """The exclusive lock on one store directory, held until `release` (or the process ends)."""

    def __init__(self, root: Path):
        """Take the lock on `root` (which must exist) and write our pid into it.

        Raises:
            StoreLockedError: another live process (or store object) holds it; the message is
                one line naming the directory and the holder's pid.
        """
        self.path = root / LOCK_FILE_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            pid = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = f"pid {pid}" if pid is not None else "pid unknown"
            raise StoreLockedError(
                f"lock failed, MQ already started: store {root} is in use by a live broker "
                f"({holder}); stop it or use another storePathRootDir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (idempotent). The file stays: removing it would race a new holder."""
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def holder_pid(root: Path) -> int | None:
    """The pid of the live process holding `root`'s lock, or None when none does.

    Read-only: opens the file for reading, tries a shared lock without waiting and drops it at
    once. (A broker starting in that instant would be refused; rerunning it succeeds.) A holder
    that did not write its pid yet reads as 0.
    """
    try:
        fd = os.open(root / LOCK_FILE_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            return 0 if pid is None else pid
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
