"""The store: a synchronous, single-writer commit-log engine (RocketMQ's layout, §7).

Never imports asyncio. The broker owns one FileMessageStore; `tools` reads a store directory
without opening it for writing (`tidemq store verify|dump`).
"""

from tidemq.store.config import CorruptPolicy, FlushDiskType, StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.recovery import RecoveryReport
from tidemq.store.types import (
    DispatchEvent,
    GetResult,
    GetStatus,
    MessageToStore,
    PutResult,
    PutStatus,
)

__all__ = [
    "CorruptPolicy",
    "DispatchEvent",
    "FileMessageStore",
    "FlushDiskType",
    "GetResult",
    "GetStatus",
    "MessageToStore",
    "PutResult",
    "PutStatus",
    "RecoveryReport",
    "StoreConfig",
]
