"""Crash-safe writes of the broker's small JSON config files (topics, groups, consumer offsets).

A file is replaced, never edited: the new content goes to `<name>.tmp`, is fsync'd, then renamed
over the old one, and the directory is fsync'd so the rename itself survives a power cut. A reader
therefore sees either the old or the new file, whole. The previous version is kept as
`<name>.bak` (as RocketMQ's ConfigManager does) so a file damaged by hand can be recovered.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

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
