"""The checkpoint: how far the commit log and the derived files are known to be on disk.

    checkpoint (36 bytes, rewritten in place: within one sector, so a write is all or nothing
    in practice; the CRC catches a torn one, which then counts as a lost checkpoint)
    +------------+-------------+---------------+-------------------+---------------------+
    | magic: u32 | version:u16 | reserved: u16 | log_flushed: i64  | logic_flushed: i64  |
    +------------+-------------+---------------+-------------------+---------------------+
    | timestamp_ms: i64        | crc32 of the 32 bytes before: u32 |
    +--------------------------+-----------------------------------+

`log_flushed`: commit-log bytes below it are durable. `logic_flushed`: every record below it
has its consume-queue and index entries durable, so recovery re-dispatches from the segment
holding it. Without a valid checkpoint, recovery rebuilds from the first segment.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

CHECKPOINT_MAGIC: Final = 0x7D1DE0C9
CHECKPOINT_VERSION: Final = 1
_BODY: Final = struct.Struct(">IHHqqq")
assert _BODY.size == 32
_CRC: Final = struct.Struct(">I")
CHECKPOINT_SIZE: Final = _BODY.size + _CRC.size
assert CHECKPOINT_SIZE == 36


@dataclass(frozen=True, slots=True)
class Checkpoint:
    log_flushed_offset: int
    logic_flushed_offset: int
    timestamp_ms: int


def encode_checkpoint(cp: Checkpoint) -> bytes:
    head = _BODY.pack(
        CHECKPOINT_MAGIC,
        CHECKPOINT_VERSION,
        0,
        cp.log_flushed_offset,
        cp.logic_flushed_offset,
        cp.timestamp_ms,
    )
    return head + _CRC.pack(zlib.crc32(head))


def decode_checkpoint(data: bytes) -> Checkpoint | None:
    if len(data) != CHECKPOINT_SIZE:
        return None
    head, (crc,) = data[: _BODY.size], _CRC.unpack_from(data, _BODY.size)
    if zlib.crc32(head) != crc:
        return None
    magic, version, _reserved, log_flushed, logic_flushed, ts = _BODY.unpack(head)
    if magic != CHECKPOINT_MAGIC or version != CHECKPOINT_VERSION:
        return None
    if log_flushed < 0 or logic_flushed < 0:
        return None
    return Checkpoint(log_flushed, logic_flushed, ts)


def read_checkpoint(path: Path) -> Checkpoint | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    cp = decode_checkpoint(data)
    if cp is None:
        logger.warning("checkpoint %s is damaged; treating it as lost", path)
    return cp


class CheckpointFile:
    """The checkpoint file, kept open and overwritten in place."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self._fd, CHECKPOINT_SIZE)
        self.last: Checkpoint | None = None

    def write(self, cp: Checkpoint) -> None:
        if cp == self.last:
            return
        data = encode_checkpoint(cp)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)
        self.last = cp

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
