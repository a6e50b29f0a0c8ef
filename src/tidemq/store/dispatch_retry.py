"""Re-dispatch after a failed dispatch: a full disk must not need a restart.

A put writes its records to the commit log, then dispatches them (consume-queue entries, index
entries, listeners; store/append.py). When the dispatch fails after the log write (ENOSPC
creating a consume-queue or index file), the records are stored and answered as stored, but
not readable, and the store takes no more writes: the next queue offsets would collide with
the ones the written records carry. Recovery at the next start would dispatch them; here the
store does it by itself once the disk has room again:

    put ──▶ log write ok ──▶ dispatch fails ──▶ broken (sends: SERVICE_NOT_AVAILABLE)
                                                  │  retry after 100 ms, 200 ms, ... 5 s
                                                  ▼
           scan the log from the first undispatched record (LogScanner: the recovery's scan,
           CRCs checked) and dispatch each record as recovery does (idempotent: entries
           already written are left as they are) ──▶ ok: listeners told, writes resume
                                                     fails: next try after twice the wait

Retries are driven from the store's single writer: each refused send tries when one is due,
and the broker ticks `FileMessageStore.retry_dispatch` every DISPATCH_RETRY_INTERVAL_MS_MIN, so
an acknowledged message becomes readable without any send (and without a restart) at most
DISPATCH_RETRY_INTERVAL_MS_MAX after space comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from tidemq.errors import StoreError
from tidemq.protocol import message as props
from tidemq.protocol.record import CRC_PROPERTY, StoredMessage
from tidemq.store import dispatch as dsp
from tidemq.store.append import DispatchListener, Listeners, send_events, wanting
from tidemq.store.commit_log import CommitLog, LogScanner
from tidemq.store.types import DispatchEvent

logger = logging.getLogger(__name__)

# The first retry soon after the failure: space often comes back within one cleanup pass.
DISPATCH_RETRY_INTERVAL_MS_MIN: Final = 100
# The wait doubles per failed retry up to this: once space is back, a stored message waits at
# most this long to be readable, and a disk that stays full costs one log line per wait.
DISPATCH_RETRY_INTERVAL_MS_MAX: Final = 5_000
assert DISPATCH_RETRY_INTERVAL_MS_MIN <= DISPATCH_RETRY_INTERVAL_MS_MAX


class DispatchRetry:
    """When the next retry is due, with exponential backoff between failed ones."""

    __slots__ = ("attempts", "due_ms", "interval_ms")

    def __init__(self) -> None:
        self.due_ms = 0.0
        self.interval_ms: float = DISPATCH_RETRY_INTERVAL_MS_MIN
        self.attempts = 0

    def start(self, now_ms: float) -> None:
        """A dispatch just failed: the first retry after the shortest wait."""
        self.attempts = 0
        self.interval_ms = DISPATCH_RETRY_INTERVAL_MS_MIN
        self.due_ms = now_ms + self.interval_ms

    def is_due(self, now_ms: float) -> bool:
        return now_ms >= self.due_ms

    def failed(self, now_ms: float) -> None:
        """A retry failed: wait twice as long (capped) before the next."""
        self.attempts += 1
        self.interval_ms = min(self.interval_ms * 2, DISPATCH_RETRY_INTERVAL_MS_MAX)
        self.due_ms = now_ms + self.interval_ms


def redispatch_from(
    log: CommitLog, start: int, dispatch: Callable[[StoredMessage], object]
) -> list[StoredMessage]:
    """Dispatch every record from `start` (a record boundary) to the log's end, in order;
    returns them.

    Raises:
        OSError: a dispatch failed (the disk is still full); entries written so far stay, and
            the next call writes the rest.
        StoreError: the scan stopped before the log's end: a record written by this process
            fails its CRC (memory or disk corruption), which no retry mends.
    """
    scanner = LogScanner(log, start)
    scanned: list[StoredMessage] = []
    for message in scanner.records():
        dispatch(message)
        scanned.append(message)
    last = log.files.last_file()
    # A full last segment (a slave's log may end so, store/replica.py) ends at its marker.
    at_marker = (
        scanner.stop_reason == "end"
        and last is not None
        and last.wrote == last.size
        and last.start_offset <= scanner.end_offset
    )
    if scanner.end_offset != log.max_offset and not at_marker:
        raise StoreError(
            f"re-dispatch stopped at commit-log offset {scanner.end_offset} before the end "
            f"{log.max_offset}: {scanner.stop_reason}"
        )
    return scanned


def notify_listeners(listeners: Listeners, messages: list[StoredMessage]) -> None:
    """Send the dispatch events the put path sent for `messages`, in order (pull hold
    wake-ups, delay and timer scheduling), once they are re-dispatched from the log. The
    event's properties are the put's: without the pairs the store added to the record (its CRC,
    an explicit tags code); a slave's append builds the same events
    (`Appender.dispatch_placed_run`)."""
    wanted: dict[str, list[DispatchListener]] = {}  # asked once per topic, as a put does
    events: list[tuple[DispatchEvent, list[DispatchListener]]] = []
    for message in messages:
        if message.sys_flag & dsp.TX_MASK in (dsp.TX_PREPARED, dsp.TX_ROLLBACK):
            continue
        targets = wanted.get(message.topic)
        if targets is None:
            targets = wanted[message.topic] = wanting(listeners, message.topic)
        if not targets:
            continue  # nobody wants this topic's events: no event built
        properties = props.decode_properties(message.properties)
        properties.pop(CRC_PROPERTY, None)
        tags_code = dsp.tags_code_of(properties)
        properties.pop(dsp.TAGS_CODE_PROPERTY, None)
        event = DispatchEvent(
            message.topic,
            message.queue_id,
            message.queue_offset,
            message.physical_offset,
            message.total_size,
            tags_code,
            message.store_timestamp,
            properties,
        )
        events.append((event, targets))
    send_events(events)
