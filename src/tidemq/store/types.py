"""What goes into and comes out of the store: put/get requests, results and dispatch events."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(slots=True)
class MessageToStore:
    topic: str
    queue_id: int
    body: bytes
    flag: int
    properties: str
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_host: tuple[str, int]
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    # None: the store's clock at append time.
    store_timestamp: int | None = None
    # None: the Java hash of the TAGS property. Set explicitly, e.g. a delay topic's deliver time;
    # the store then keeps it in the record (property __TAGSCODE#) so recovery restores it.
    tags_code: int | None = None
    # The caller's decode_properties(properties), to spare the store decoding it again: used only
    # while `properties` is still the very string object it was decoded from (else decoded anew).
    parsed: tuple[str, dict[str, str]] | None = None


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutResult(NamedTuple):
    """What a put made of one message. A NamedTuple rather than a frozen dataclass: as
    immutable, and built in a third of the time (one per stored message)."""

    status: PutStatus
    physical_offset: int = -1
    queue_offset: int = -1
    size: int = 0
    store_timestamp: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    # Raw stored records; b"".join(records) is a PULL body.
    records: list[bytes] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0


class DispatchEvent(NamedTuple):
    """One record turned into a consume-queue entry (sent to dispatch listeners). A NamedTuple
    for the same reason as PutResult."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    properties: dict[str, str]
