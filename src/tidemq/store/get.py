"""The store's read path: a consume queue's entries from an offset turned into stored records.

    consume queue  | entry i | entry i+1 | ...            (physical offset, size, tags code)
                        │ below the log's first segment: MESSAGE_WAS_REMOVING (skipped)
                        │ tags code not wanted / filter refuses: skipped
                        ▼
    commit log     record bytes, whole-record CRC checked (a bad one is logged, never served)
                        ▼
    GetResult      FOUND records (b"".join = a PULL body), next offset, the queue's min/max

A get reads at most GET_SCAN_ENTRIES_MAX entries, so a filter that matches nothing costs a
bounded scan; the next offset then points after them. `offset_by_time` searches the queue by
store time for SEARCH_OFFSET_BY_TIMESTAMP.

`phys_limit` (a controller-mode master's confirm offset, issue 14): a record that does not end
at or below it is not on every replica yet, so the get stops before it. If it is the first
entry, the queue looks as if it ended at `offset` (OFFSET_OVERFLOW_ONE, max offset `offset`): the
pull is held like one at the queue's end and nothing in the answer moves the consumer.

    entries  | i | i+1 | i+2 |  i+3 ...        phys + size of i+2 > phys_limit
    served   | i | i+1 |                      next offset i+2, max offset i+2

Every other answer under a limit names the queue's end as visible
(ConsumeQueue.max_offset_within), never the entries past it: a consumer moved or started there
would skip the records a failover then writes at those offsets (the unconfirmed ones are cut
off the log and their queue offsets reused).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from tidemq.errors import CorruptRecordError
from tidemq.limits import PULL_MESSAGE_COUNT_MAX
from tidemq.protocol import record as rec
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import ConsumeQueue
from tidemq.store.types import GetResult, GetStatus

logger = logging.getLogger(__name__)

# A filtered pull reads at most this many consume-queue entries (RocketMQ maxFilterMessageCount).
GET_SCAN_ENTRIES_MAX: Final = 16_000


def get_messages(
    cq: ConsumeQueue,
    log: CommitLog,
    offset: int,
    max_count: int,
    max_bytes: int,
    tag_codes: frozenset[int] | None,
    message_filter: Callable[[rec.StoredMessage], bool] | None,
    phys_limit: int | None = None,
) -> GetResult:
    """FileMessageStore.get_messages for the queue `cq`; records ending past `phys_limit`
    (None: no limit) are not served (module doc)."""
    lo, hi = cq.min_offset, cq.max_offset
    if hi == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, lo, hi)
    if phys_limit is not None and phys_limit >= log.max_offset:
        phys_limit = None  # everything is visible: the loop pays one identity test per entry
    if offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, hi)
    if offset < lo or offset > hi:
        end = hi if phys_limit is None else cq.max_offset_within(phys_limit)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], lo, lo, end)
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], end, lo, end)
    max_count = max(1, min(max_count, PULL_MESSAGE_COUNT_MAX))
    records: list[bytes] = []
    total = 0
    next_offset = offset
    removing = False
    log_min = log.min_offset
    for index, phys, size, tags in cq.entries(offset, GET_SCAN_ENTRIES_MAX):
        if len(records) >= max_count or (records and total + size > max_bytes):
            break
        if phys_limit is not None and phys + size > phys_limit:
            if index == offset:
                return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, offset)
            hi = index  # the queue as visible ends here
            break
        next_offset = index + 1
        if phys < log_min:
            removing = True
            continue
        if tag_codes is not None and tags not in tag_codes:
            continue
        data = log.read(phys, size)
        try:
            if data is None:
                raise CorruptRecordError(f"no record of {size} bytes at {phys}")
            rec.check_record(data)
            if message_filter is not None and not message_filter(rec.decode_record(data)):
                continue
        except CorruptRecordError as exc:
            logger.error("%s/%d offset %d not served: %s", cq.topic, cq.queue_id, index, exc)
            continue
        records.append(data)
        total += size
    else:
        next_offset = min(offset + GET_SCAN_ENTRIES_MAX, hi)
    if phys_limit is not None and hi == cq.max_offset:  # not cut short: the visible end
        hi = cq.max_offset_within(phys_limit)
    if records:
        status = GetStatus.FOUND
    elif removing:
        status = GetStatus.MESSAGE_WAS_REMOVING
    else:
        status = GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, records, next_offset, lo, hi)


def offset_by_time(lo: int, hi: int, timestamp_ms: int, time_at: Callable[[int], int]) -> int:
    """Of the offsets [lo, hi) (hi > lo), whose store times `time_at` gives (-1: unknown), the
    one whose time equals `timestamp_ms` (the first such), else the nearer neighbour (the
    earlier on a tie); the first/last offset outside the range."""
    first, end = lo, hi  # find the first offset with time >= target
    while lo < hi:
        mid = (lo + hi) // 2
        if time_at(mid) < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    if lo == end:
        return end - 1
    if lo == first or time_at(lo) == timestamp_ms:
        return lo
    before, after = time_at(lo - 1), time_at(lo)
    return lo if after - timestamp_ms < timestamp_ms - before else lo - 1
