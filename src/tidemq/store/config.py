"""StoreConfig: the knobs of one FileMessageStore, validated at construction."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tidemq.limits import (
    COMMIT_LOG_FILE_SIZE_DEFAULT,
    CONSUME_QUEUE_FILE_ENTRIES_DEFAULT,
    MESSAGE_BODY_SIZE_MAX,
)

# Commit-log bytes behind the write position kept mapped in the broker's resident set: tail
# consumers read them without a page fault. Older flushed pages are released (commit_log.py).
COMMIT_LOG_RESIDENT_BYTES_DEFAULT: Final = 64 * 1024 * 1024


class CorruptPolicy(enum.Enum):
    """What recovery does with a corrupt record that is not a torn tail (see recovery.py)."""

    # Refuse to start, naming the segment and offset, so an operator can run `store verify`.
    REFUSE = "refuse"
    # Move the damaged segment (a copy) and every later one into <root>/quarantine/, keep the
    # valid prefix and start. Records after the damage are unavailable until restored by hand.
    QUARANTINE = "quarantine"


class FlushDiskType(enum.Enum):
    """RocketMQ flushDiskType. The store only reports; the broker's FlushService acts on it."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


@dataclass(frozen=True)
class StoreConfig:
    root_dir: Path
    # Segment size of the commit log (RocketMQ mapedFileSizeCommitLog).
    commit_log_file_size: int = COMMIT_LOG_FILE_SIZE_DEFAULT
    # Entries per consume-queue file (20 bytes each).
    consume_queue_file_entries: int = CONSUME_QUEUE_FILE_ENTRIES_DEFAULT
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    # Commit-log segments untouched for this long are deleted (RocketMQ fileReservedTime).
    file_reserved_time_hours: float = 72.0
    # Local hour of day at which expired segments are deleted (RocketMQ deleteWhen).
    delete_when_hour: int = 4
    # Above this disk usage puts are refused and expired files deleted at any hour.
    disk_max_used_space_ratio_percent: int = 75
    # Largest body accepted (RocketMQ maxMessageSize).
    message_size_max: int = MESSAGE_BODY_SIZE_MAX
    # Hash slots and entries per index file: 40 + 4 * slots + 20 * entries bytes (~8.4 MiB).
    index_slot_count: int = 100_000
    index_entry_count: int = 400_000
    # Corruption below the flushed offset or before valid records: refuse, or quarantine.
    corrupt_policy: CorruptPolicy = CorruptPolicy.REFUSE
    # Mapped commit-log tail kept resident (RSS); flushed pages further back are released.
    commit_log_resident_bytes: int = COMMIT_LOG_RESIDENT_BYTES_DEFAULT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root_dir", Path(self.root_dir))
        if self.commit_log_file_size < 4096:
            raise ValueError(f"commit_log_file_size {self.commit_log_file_size} < 4096 bytes")
        if self.commit_log_file_size > 2**31 - 1:
            # The blank marker and record sizes are int32.
            raise ValueError(f"commit_log_file_size {self.commit_log_file_size} >= 2 GiB")
        if self.consume_queue_file_entries < 1:
            raise ValueError("consume_queue_file_entries must be >= 1")
        if self.file_reserved_time_hours <= 0:
            raise ValueError("file_reserved_time_hours must be > 0")
        if not 0 <= self.delete_when_hour <= 23:
            raise ValueError(f"delete_when_hour {self.delete_when_hour} outside 0..23")
        if not 0 <= self.disk_max_used_space_ratio_percent <= 100:
            raise ValueError("disk_max_used_space_ratio_percent outside 0..100")
        if self.message_size_max < 1:
            raise ValueError("message_size_max must be >= 1")
        if self.index_slot_count < 1 or self.index_entry_count < 2:
            raise ValueError("index_slot_count must be >= 1 and index_entry_count >= 2")
        if self.commit_log_resident_bytes < 0:
            raise ValueError("commit_log_resident_bytes must be >= 0")
