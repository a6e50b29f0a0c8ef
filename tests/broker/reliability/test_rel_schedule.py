"""Delay levels: parsing, parking in SCHEDULE_TOPIC_XXXX, timely delivery, restart safety (§9)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from broker_harness import running_broker
from rel_harness import FAST_LEVELS, wait_for_messages

from tidemq.broker.config import ConfigError
from tidemq.broker.config_file import load_broker_config
from tidemq.broker.delay_levels import DELAY_LEVELS_DEFAULT, parse_delay_levels
from tidemq.broker.schedule import IDLE_WAIT_MS, DelayRouter, ScheduleService
from tidemq.clock import FakeClock
from tidemq.protocol.message import SCHEDULE_TOPIC_XXXX, encode_properties
from tidemq.protocol.record import decode_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore


def test_default_levels_are_rocketmqs_eighteen() -> None:
    levels = parse_delay_levels(DELAY_LEVELS_DEFAULT)
    assert len(levels) == 18
    assert levels[0] == 1_000
    assert levels[2] == 10_000
    assert levels[-1] == 7_200_000
    assert parse_delay_levels("100ms 2s 1m 1h 1d") == (100, 2_000, 60_000, 3_600_000, 86_400_000)


@pytest.mark.parametrize("text", ["", "1x", "0s", "1s " * 19, "-1s", "1.5s"])
def test_bad_level_tables_are_refused_at_load(text: str) -> None:
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        load_broker_config(None, {}, {"messageDelayLevel": text})


def _message(topic: str, props: dict[str, str], sys_flag: int = 0) -> MessageToStore:
    return MessageToStore(
        topic=topic,
        queue_id=1,
        body=b"b",
        flag=0,
        properties=encode_properties(props),
        sys_flag=sys_flag,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
    )


def test_router_parks_by_level_and_clamps() -> None:
    clock = FakeClock()
    router = DelayRouter((100, 200, 300), clock)
    parked = router.route(_message("T", {"DELAY": "2", "TAGS": "a"}))
    assert (parked.topic, parked.queue_id, parked.tags_code) == (
        SCHEDULE_TOPIC_XXXX,
        1,
        clock.now_ms() + 200,
    )
    assert "REAL_TOPIC\x01T" in parked.properties
    assert "REAL_QID\x011" in parked.properties
    clamped = router.route(_message("T", {"DELAY": "99"}))
    assert clamped.queue_id == 2
    assert "DELAY\x013" in clamped.properties
    for props in ({}, {"DELAY": "0"}, {"DELAY": "-2"}):
        assert router.route(_message("T", props)).topic == "T"
    # A half message (PREPARED) is never parked; its commit is.
    assert router.route(_message("T", {"DELAY": "1"}, sys_flag=0x4)).topic == "T"


@pytest.fixture
def fake_world(tmp_path: Path) -> Iterator[tuple[FileMessageStore, FakeClock]]:
    clock = FakeClock()
    store = FileMessageStore(
        StoreConfig(root_dir=tmp_path / "s", commit_log_file_size=64 * 1024), clock
    )
    store.start()
    yield store, clock
    store.shutdown()


def test_service_sleeps_until_the_earliest_head(
    fake_world: tuple[FileMessageStore, FakeClock], tmp_path: Path
) -> None:
    store, clock = fake_world
    router = DelayRouter((100, 300), clock)
    service = ScheduleService(store, (100, 300), clock, tmp_path / "config")
    assert service.deliver_due() == IDLE_WAIT_MS
    store.put_message(router.route(_message("T", {"DELAY": "2"})))
    clock.advance(50)
    store.put_message(router.route(_message("T", {"DELAY": "1"})))
    assert service.deliver_due() == 100  # level 1's head is due at 50 + 100
    clock.advance(99)
    assert service.deliver_due() == 1
    assert store.max_offset("T", 1) == 0
    clock.advance(1)
    assert service.deliver_due() == 150  # level 2's head: due at 300, now 150
    assert store.max_offset("T", 1) == 1
    clock.advance(150)
    service.deliver_due()
    assert store.max_offset("T", 1) == 2
    assert service.delivered == 2
    records = decode_records(b"".join(store.get_messages("T", 1, 0, 8).records))
    assert [r.property_map().get("DELAY") for r in records] == [None, None]
    assert all(r.property_map()["REAL_TOPIC"] == "T" for r in records)
    service.persist()
    table = orjson.loads((tmp_path / "config" / "delayOffset.json").read_bytes())
    # The log end the progress covers (checked at load: test_schedule_truncated.py).
    assert table == {"offsetTable": {"1": 1, "2": 1}, "logOffset": store.max_physical_offset}


async def test_delayed_send_is_delivered_on_time(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", messageDelayLevel=FAST_LEVELS) as broker:
        sent_at = time.monotonic()
        response = await broker.send("TopicD", b"later", properties={"DELAY": "3", "TAGS": "t"})
        assert response.code == 0, response.remark
        assert broker.app.store.max_offset("TopicD", 0) == 0
        [message], seen_at = await wait_for_messages(broker, "TopicD")
        elapsed_ms = (seen_at - sent_at) * 1000
        assert 300 <= elapsed_ms < 300 + 150, elapsed_ms
        assert message.body == b"later"
        assert message.property_map()["TAGS"] == "t"
        # Tag filtering on the real topic works: the tags code is the hash of TAGS again.
        filtered = await broker.pull("TopicD", subscription="t")
        assert filtered.code == 0


async def test_restart_with_pending_delays_loses_nothing_and_is_not_early(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    levels = "100ms 700ms"
    async with running_broker(root, messageDelayLevel=levels) as broker:
        await broker.send("TopicP", b"quick", properties={"DELAY": "1"})
        await wait_for_messages(broker, "TopicP")
        sent_at = time.monotonic()
        for i in range(5):
            response = await broker.send("TopicP", b"slow%d" % i, properties={"DELAY": "2"})
            assert response.code == 0
    assert (root / "config" / "delayOffset.json").exists()
    async with running_broker(root, messageDelayLevel=levels) as broker:
        assert broker.app.store.max_offset("TopicP", 0) == 1
        found, seen_at = await wait_for_messages(broker, "TopicP", 6)
        assert (seen_at - sent_at) * 1000 >= 700
        assert sorted(m.body for m in found) == [b"quick"] + [b"slow%d" % i for i in range(5)]
        assert broker.app.schedule.progress(1) == 1  # the quick one was not re-delivered
