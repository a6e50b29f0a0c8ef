"""FileMessageStore: put/get, statuses, filters, lookups, disk guard, retention, tools."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from store_helpers import SEGMENT_BYTES, Opener, bodies, fill, message

from tidemq.protocol.message import tag_code
from tidemq.protocol.record import decode_record, decode_records
from tidemq.store import (
    DispatchEvent,
    FileMessageStore,
    GetStatus,
    PutStatus,
    StoreConfig,
)
from tidemq.store.tools import dump, verify


def test_put_get_across_rollovers(opener: Opener) -> None:
    store = opener.open()
    results = [store.put_message(message(i, queue_id=i % 2)) for i in range(120)]
    assert all(r.ok for r in results)
    assert [r.queue_offset for r in results if r.physical_offset >= 0][:4] == [0, 0, 1, 1]
    assert store.max_physical_offset > 3 * SEGMENT_BYTES
    assert len(list((store.config.root_dir / "consumequeue" / "T" / "0").iterdir())) >= 3
    assert store.max_offset("T", 0) == store.max_offset("T", 1) == 60
    got = bodies(store, "T", 0)
    assert got == [message(i).body for i in range(0, 120, 2)]
    for r in results[:5]:
        raw = store.read_record(r.physical_offset)
        assert raw is not None
        assert decode_record(raw).physical_offset == r.physical_offset
    assert store.read_record(store.max_physical_offset) is None
    assert store.read_raw(0, 100) == store.read_record(0)[:100]  # type: ignore[index]
    assert store.topics_and_queues() == {"T": [0, 1]}


def test_get_statuses(opener: Opener) -> None:
    store = opener.open()
    assert store.get_messages("T", 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    fill(store, 5)
    assert store.get_messages("T", 0, 5, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
    r = store.get_messages("T", 0, 9, 32)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (
        GetStatus.OFFSET_OVERFLOW_BADLY,
        5,
        0,
        5,
    )
    r = store.get_messages("T", 0, 1, 2)
    assert (r.status, len(r.records), r.next_begin_offset) == (GetStatus.FOUND, 2, 3)
    r = store.get_messages("T", 0, 0, 32, max_bytes=1)
    assert len(r.records) == 1  # at least one record always fits


def test_tag_filter_and_message_filter(opener: Opener) -> None:
    store = opener.open()
    for i in range(40):
        assert store.put_message(message(i, tags="A" if i % 4 == 0 else "B")).ok
    only_a = frozenset({tag_code("A")})
    r = store.get_messages("T", 0, 0, 32, tag_codes=only_a)
    assert [m.body for m in decode_records(b"".join(r.records))] == [
        message(i).body for i in range(0, 40, 4)
    ]
    assert r.next_begin_offset == 40
    r = store.get_messages("T", 0, 1, 2, tag_codes=frozenset({tag_code("C")}))
    assert (r.status, r.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 40)
    r = store.get_messages("T", 0, 0, 32, message_filter=lambda m: m.body.startswith(b"body-3-"))
    assert [m.body for m in decode_records(b"".join(r.records))] == [message(3).body]


def test_batch_is_consecutive_and_all_or_nothing(opener: Opener) -> None:
    store = opener.open()
    batch = [message(i) for i in range(5)]
    results = store.put_messages(batch)
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    bad = [message(10), message(11, body=b"x" * 5000)]
    results = store.put_messages(bad)
    assert {r.status for r in results} == {PutStatus.MESSAGE_ILLEGAL}
    assert store.max_offset("T", 0) == 5
    mixed = store.put_messages([message(1), message(2, queue_id=1)])
    assert mixed[0].status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_messages([]) == []


def test_illegal_messages(opener: Opener) -> None:
    store = opener.open(message_size_max=100)
    assert store.put_message(message(1, body=b"x" * 101)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message(message(1, topic="t" * 128)).status is PutStatus.MESSAGE_ILLEGAL
    m = message(1)
    m.born_host = ("not-a-host", 1)
    assert store.put_message(m).status is PutStatus.MESSAGE_ILLEGAL
    m = message(1)
    m.properties = "k\x01" + "v" * 32_760
    assert store.put_message(m).status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.max_offset("T", 0) == 0


def test_not_running_refuses(tmp_path: Path, opener: Opener) -> None:
    store = opener.open()
    store.shutdown()
    result = store.put_message(message(1))
    assert result.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "not running" in result.error


def test_disk_full_refusal_keeps_data(tmp_path: Path, opener: Opener) -> None:
    usage = [10.0]
    store = FileMessageStore(
        opener_config := opener_config_for(tmp_path),
        opener.clock,
        disk_usage_probe=lambda _p: usage[0],
    )
    store.start()
    fill(store, 10)
    usage[0] = 91.0
    opener.clock.advance(1_000)
    refused = store.put_message(message(99))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert refused.error == "disk usage 91% exceeds diskMaxUsedSpaceRatio 75%"
    assert len(bodies(store)) == 10
    usage[0] = 50.0
    opener.clock.advance(1_000)
    assert store.put_message(message(10)).ok
    store.shutdown()
    reopened = FileMessageStore(opener_config, opener.clock)
    reopened.start()
    assert len(bodies(reopened)) == 11
    reopened.shutdown()


def opener_config_for(root: Path) -> StoreConfig:
    from store_helpers import make_config

    return make_config(root / "s")


def test_zero_ratio_config_refuses(opener: Opener) -> None:
    store = opener.open(disk_max_used_space_ratio_percent=0)
    assert store.put_message(message(1)).status is PutStatus.SERVICE_NOT_AVAILABLE


def test_query_by_key_keys_and_uniq_key(opener: Opener) -> None:
    store = opener.open()
    for i in range(150):  # over 64 index entries per file: several index files
        m = message(i, keys=f"order-{i % 10} shared", store_timestamp=10_000 + i * 1000)
        assert store.put_message(m).ok
    hits = store.query_by_key("T", "order-3", 100, 0, 10**15)
    assert sorted(decode_record(h).body for h in hits) == sorted(
        message(i).body for i in range(3, 150, 10)
    )
    assert len(store.query_by_key("T", "shared", 7, 0, 10**15)) == 7
    uniq = store.query_by_key("T", "U00000042", 5, 0, 10**15)
    assert [decode_record(h).body for h in uniq] == [message(42).body]
    assert store.query_by_key("Other", "order-3", 5, 0, 10**15) == []
    window = store.query_by_key("T", "order-3", 100, 23_000, 33_000)
    assert sorted(decode_record(h).store_timestamp for h in window) == [23_000, 33_000]


def test_offset_by_time_and_store_times(opener: Opener) -> None:
    store = opener.open()
    assert store.offset_by_time("T", 0, 5) == 0
    assert store.earliest_store_time("T", 0) == -1
    for i, ts in enumerate([1000, 2000, 2000, 3000, 5000]):
        assert store.put_message(message(i, store_timestamp=ts)).ok
    assert store.earliest_store_time("T", 0) == 1000
    assert store.store_time_at("T", 0, 3) == 3000
    assert store.store_time_at("T", 0, 5) is None
    cases = {500: 0, 1000: 0, 1400: 0, 1600: 1, 2000: 1, 2500: 2, 3900: 3, 4100: 4, 9000: 4}
    assert {ts: store.offset_by_time("T", 0, ts) for ts in cases} == cases


def test_dispatch_listener(opener: Opener) -> None:
    store = opener.open()
    events: list[DispatchEvent] = []
    store.add_dispatch_listener(events.append)
    store.add_dispatch_listener(_failing_listener)  # must not break puts
    assert store.put_message(message(1, tags="X")).ok
    assert len(events) == 1
    e = events[0]
    assert (e.topic, e.queue_id, e.queue_offset, e.tags_code) == ("T", 0, 0, tag_code("X"))
    assert e.properties["TAGS"] == "X"


def test_prepared_and_rollback_get_no_queue_entry(opener: Opener) -> None:
    store = opener.open()
    prepared = store.put_message(message(1, sys_flag=0x4))
    assert prepared.ok
    assert prepared.queue_offset == 0
    assert store.max_offset("T", 0) == 0
    assert store.read_record(prepared.physical_offset) is not None
    assert store.put_message(message(2, sys_flag=0x8)).queue_offset == 0
    assert store.max_offset("T", 0) == 1


def test_explicit_tags_code_survives_rebuild(tmp_path: Path, opener: Opener) -> None:
    store = opener.open()
    assert store.put_message(message(1, tags="A", tags_code=123_456)).ok
    r = store.get_messages("T", 0, 0, 1, tag_codes=frozenset({123_456}))
    assert len(r.records) == 1
    store.shutdown()
    (store.config.root_dir / "checkpoint").unlink()
    reopened = opener.open(store.config.root_dir)
    assert reopened.last_recovery is not None
    assert reopened.last_recovery.full_rebuild
    r = reopened.get_messages("T", 0, 0, 1, tag_codes=frozenset({123_456}))
    assert len(r.records) == 1


def test_clean_expired_files(opener: Opener) -> None:
    store = opener.open()
    fill(store, 200)
    segments = sorted((store.config.root_dir / "commitlog").iterdir())
    assert len(segments) >= 5
    now_ms = time.time_ns() // 1_000_000
    old_s = now_ms / 1000 - 73 * 3600
    for path in segments[:3]:
        os.utime(path, (old_s, old_s))
    other_hour = (store.config.delete_when_hour + 1) % 24
    not_now = _ms_at_local_hour(other_hour)
    assert store.clean_expired_files(not_now) == 0
    removed = store.clean_expired_files(now_ms, force=True)
    assert removed >= 4  # three segments and at least one consume-queue file
    assert len(list((store.config.root_dir / "commitlog").iterdir())) == len(segments) - 3
    low = store.min_offset("T", 0)
    assert low > 0
    r = store.get_messages("T", 0, 0, 32)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
    assert bodies(store) == [message(i).body for i in range(low, 200)]
    assert store.clean_expired_files(now_ms, force=True) == 0


def _ms_at_local_hour(hour: int) -> int:
    t = time.localtime()
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, 30, 0, 0, 0, -1)) * 1000)


def test_delete_topic(opener: Opener) -> None:
    store = opener.open()
    fill(store, 5)
    fill(store, 3, topic="U")
    store.delete_topic("T")
    assert store.topics_and_queues() == {"U": [0]}
    assert store.get_messages("T", 0, 0, 1).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert not (store.config.root_dir / "consumequeue" / "T").exists()
    assert store.put_message(message(9)).queue_offset == 0


def test_flush_advances_flushed_offset(opener: Opener) -> None:
    store = opener.open()
    fill(store, 30)
    assert store.flushed_physical_offset < store.max_physical_offset
    assert store.flush() == store.max_physical_offset == store.flushed_physical_offset


def test_verify_and_dump(opener: Opener) -> None:
    store = opener.open()
    fill(store, 50)
    store.flush()
    report = verify(store.config.root_dir)
    assert report.ok, report.problems
    assert report.records == 50
    assert report.end_offset == store.max_physical_offset
    assert not report.clean_stop
    out = io.StringIO()
    assert dump(store.config.root_dir, out, max_records=3) == 3
    assert out.getvalue().count("topic=T") == 3
    out = io.StringIO()
    assert dump(store.config.root_dir, out) == 50
    assert "# end at" in out.getvalue()


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="commit_log_file_size"):
        StoreConfig(root_dir=tmp_path, commit_log_file_size=100)
    with pytest.raises(ValueError, match="delete_when_hour"):
        StoreConfig(root_dir=tmp_path, delete_when_hour=24)
    with pytest.raises(ValueError, match="ratio"):
        StoreConfig(root_dir=tmp_path, disk_max_used_space_ratio_percent=101)


def _failing_listener(event: DispatchEvent) -> None:
    raise RuntimeError(f"listener failure for {event.topic}")
