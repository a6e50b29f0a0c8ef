from __future__ import annotations

import pytest

from tidemq.client.offset_store import (
    InitialOffset,
    LocalOffsetFile,
    OffsetTable,
    decode_offset_file,
    initial_offset_rule,
)
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.message import ConsumeFromWhere

MQ = MessageQueue("T", "broker-a", 0)
MQ2 = MessageQueue("T", "broker-a", 1)


def test_updates_are_monotonic_unless_forced_and_tracked_dirty():
    table = OffsetTable()
    assert table.get(MQ) is None
    table.update(MQ, 5)
    table.update(MQ, 3)  # a late acknowledgement must not move the offset back
    assert table.get(MQ) == 5
    assert table.take_dirty() == {MQ: 5}
    assert table.take_dirty() == {}
    table.update(MQ, 5)
    assert table.take_dirty() == {}  # unchanged: nothing to commit
    table.update(MQ, 2, increase_only=False)
    table.update(MQ2, -1)  # negative offsets are ignored
    assert table.take_dirty() == {MQ: 2}
    table.mark_dirty([MQ, MQ2])
    assert table.take_dirty() == {MQ: 2}
    table.remove(MQ)
    assert table.items() == {}


def test_local_file_round_trip_and_atomic_replace(tmp_path):
    store = LocalOffsetFile.for_group(tmp_path, "10.0.0.1@1#x", "CG")
    assert store.load() == {}
    store.save({MQ: 7, MQ2: 9})
    assert store.load() == {MQ: 7, MQ2: 9}
    store.save({MQ: 8})
    assert store.load() == {MQ: 8}
    assert not store.path.with_suffix(".json.tmp").exists()


def test_corrupt_file_is_ignored(tmp_path):
    store = LocalOffsetFile(tmp_path / "offsets.json")
    store.path.write_text("{not json")
    assert store.load() == {}
    with pytest.raises(ValueError, match="malformed"):
        decode_offset_file(b'{"offsetTable":[{"topic":"T"}]}')


RULES = {
    (ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, False): InitialOffset.MAX,
    (ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, True): InitialOffset.ZERO,
    (
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST,
        False,
    ): InitialOffset.MAX,
    (
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST,
        True,
    ): InitialOffset.ZERO,
    (ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET, False): InitialOffset.MAX,
    (ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET, True): InitialOffset.ZERO,
    (ConsumeFromWhere.CONSUME_FROM_MAX_OFFSET, False): InitialOffset.MAX,
    (ConsumeFromWhere.CONSUME_FROM_MAX_OFFSET, True): InitialOffset.ZERO,
    (ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, False): InitialOffset.ZERO,
    (ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, True): InitialOffset.ZERO,
    (ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, False): InitialOffset.BY_TIMESTAMP,
    (ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, True): InitialOffset.MAX,
}


def test_rule_table_covers_every_value():
    assert {where for where, _ in RULES} == set(ConsumeFromWhere)


@pytest.mark.parametrize(("case", "expected"), list(RULES.items()))
def test_initial_offset_rule(case, expected):
    where, retry = case
    topic = "%RETRY%CG" if retry else "TopicA"
    assert initial_offset_rule(where, topic) is expected
