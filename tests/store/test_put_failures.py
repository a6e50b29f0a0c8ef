"""A bad message or a failed dispatch never costs other messages their answer or their record.

Regressions found in review: a flag outside int32 made record encoding raise inside put_each,
failing every send of the loop turn (some already stored); an OSError after the log write
(ENOSPC creating a consume-queue file) answered stored records as failed, and the next put reused
a queue offset those records already carry.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from store_helpers import bodies, make_config, message

from tidemq.clock import FakeClock
from tidemq.store import FileMessageStore
from tidemq.store.consume_queue import ConsumeQueue
from tidemq.store.types import PutStatus


@pytest.fixture
def store(tmp_path: Path) -> FileMessageStore:
    opened = FileMessageStore(make_config(tmp_path, commit_log_file_size=1 << 20), FakeClock())
    opened.start()
    return opened


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("flag", 2**31),
        ("flag", -(2**31) - 1),
        ("sys_flag", 2**40),
        ("queue_id", 2**31),
        ("reconsume_times", 2**31),
        ("born_timestamp", 2**63),
        ("prepared_transaction_offset", -(2**63) - 1),
    ],
)
def test_a_field_outside_the_record_is_refused_alone(
    store: FileMessageStore, field: str, value: int
) -> None:
    bad = message(1, **{field: value})
    results = store.put_each([message(0), bad, message(2)])
    assert [r.status for r in results] == [
        PutStatus.PUT_OK,
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.PUT_OK,
    ]
    assert "outside" in results[1].error
    assert store.put_message(bad).status is PutStatus.MESSAGE_ILLEGAL
    assert bodies(store) == [message(0).body, message(2).body]
    store.shutdown()


def test_the_limits_themselves_are_stored(store: FileMessageStore) -> None:
    edge = message(0, flag=2**31 - 1, sys_flag=0, reconsume_times=-(2**31))
    assert store.put_message(edge).status is PutStatus.PUT_OK
    store.shutdown()


def test_a_dispatch_failure_keeps_the_stored_answers_and_stops_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path, commit_log_file_size=1 << 20)
    store = FileMessageStore(config, FakeClock())
    store.start()
    assert store.put_message(message(0, queue_id=1)).status is PutStatus.PUT_OK
    real_put_run = ConsumeQueue.put_run

    def no_space(self: ConsumeQueue, start: int, entries: list[tuple[int, int, int]]) -> None:
        if self.queue_id == 1:
            raise OSError(errno.ENOSPC, "injected: no space for a consume-queue file")
        real_put_run(self, start, entries)

    monkeypatch.setattr(ConsumeQueue, "put_run", no_space)
    results = store.put_each([message(1, queue_id=0), message(2, queue_id=1)])
    # Both records are in the log (one run): answered as stored, not as failed.
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.PUT_OK]
    monkeypatch.setattr(ConsumeQueue, "put_run", real_put_run)
    # No more writes: queue 1's next offset would collide with the record the log holds.
    refused = store.put_message(message(3, queue_id=1))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "re-dispatched" in refused.error  # retried with backoff (dispatch_retry.py)
    store.shutdown()

    again = FileMessageStore(config, FakeClock())
    again.start()  # recovery dispatches what the failed run left undispatched
    assert bodies(again, queue_id=1) == [message(0, queue_id=1).body, message(2, queue_id=1).body]
    assert bodies(again) == [message(1, queue_id=0).body]
    after = again.put_message(message(4, queue_id=1))
    assert after.status is PutStatus.PUT_OK
    assert after.queue_offset == 2
    again.shutdown()
