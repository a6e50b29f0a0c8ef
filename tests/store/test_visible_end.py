"""ConsumeQueue.max_offset_within: a queue's end as a controller-mode master shows it (only the
records that end at or below its confirm offset), read back over a short unconfirmed tail and
binary-searched over a long one; and the store's get answering that end (store/get.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import CQ_ENTRIES, Opener, message

from tidemq.store.consume_queue import WITHIN_TAIL_SCAN_ENTRIES, ConsumeQueue, PutAt
from tidemq.store.types import GetStatus

RECORD = 100  # entry i: a record at 100 * i, ending at 100 * (i + 1)


def queue(tmp_path: Path, count: int, start: int = 0) -> ConsumeQueue:
    cq = ConsumeQueue(tmp_path, "T", 0, CQ_ENTRIES)
    for i in range(start, start + count):
        cq.put_at(i, RECORD * i, RECORD, 0)
    return cq


@pytest.mark.parametrize("start", [0, 5])
def test_the_visible_end_is_past_the_last_record_below_the_limit(
    tmp_path: Path, start: int
) -> None:
    count = 4 * WITHIN_TAIL_SCAN_ENTRIES  # tails both shorter and longer than the scan
    cq = queue(tmp_path, count, start)
    assert (cq.min_offset, cq.max_offset) == (start, start + count)
    for limit in range(0, RECORD * (start + count + 2), 37):
        # The entries whose record ends at or below the limit, counted by brute force.
        expected = start + sum(RECORD * (i + 1) <= limit for i in range(start, start + count))
        assert cq.max_offset_within(limit) == expected, limit
    cq.close()


def test_a_long_unconfirmed_tail_is_binary_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq = queue(tmp_path, 1000)
    reads: list[int] = []
    real = ConsumeQueue._ends_within

    def counted(self: ConsumeQueue, index: int, log_end: int) -> bool:
        reads.append(index)
        return real(self, index, log_end)

    monkeypatch.setattr(ConsumeQueue, "_ends_within", counted)
    assert cq.max_offset_within(RECORD * 1000) == 1000
    assert reads == [999]  # all confirmed: one read
    reads.clear()
    assert cq.max_offset_within(RECORD * 997) == 997
    assert reads == [999, 998, 997, 996]
    reads.clear()
    assert cq.max_offset_within(0) == 0  # before the first confirm: nothing shows
    assert len(reads) <= WITHIN_TAIL_SCAN_ENTRIES + 11
    cq.close()


def test_an_unused_entry_counts_as_past_the_limit(tmp_path: Path) -> None:
    cq = queue(tmp_path, 3)
    assert cq.put_at(4, RECORD * 4, RECORD, 0) == PutAt.GAP  # entry 3 unused
    assert cq.max_offset_within(RECORD * 5) == 5
    assert cq.max_offset_within(RECORD * 4) == 3  # entry 4 past it, 3 unused, 2 shown
    empty = ConsumeQueue(tmp_path, "E", 0, CQ_ENTRIES)
    assert empty.max_offset_within(10**9) == 0
    cq.close()


def test_a_limited_get_names_the_visible_end(opener: Opener) -> None:
    store = opener.open()
    puts = [store.put_message(message(i)) for i in range(5)]
    ends = [put.physical_offset + put.size for put in puts]
    whole = store.get_messages("T", 0, 0, 1)
    assert (whole.status, whole.max_offset) == (GetStatus.FOUND, 5)
    # Not cut short by the limit (max count reached first): the visible end, not the queue's.
    first = store.get_messages("T", 0, 0, 1, phys_limit=ends[2])
    assert (first.status, first.next_begin_offset, first.max_offset) == (GetStatus.FOUND, 1, 3)
    # Past the queue's end: moved to the visible end, not the queue's.
    badly = store.get_messages("T", 0, 9, 1, phys_limit=ends[2])
    assert badly.status == GetStatus.OFFSET_OVERFLOW_BADLY
    assert (badly.next_begin_offset, badly.max_offset) == (3, 3)
    unlimited = store.get_messages("T", 0, 9, 1)
    assert (unlimited.next_begin_offset, unlimited.max_offset) == (5, 5)
    assert store.visible_max_offset("T", 0, ends[2]) == 3
    assert store.visible_max_offset("T", 0, ends[4]) == store.max_offset("T", 0) == 5
    assert store.visible_max_offset("Nope", 0, ends[4]) == 0
