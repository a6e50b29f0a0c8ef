"""Arbitrary delivery times: the timer wheel of bucket topics (TIMER_DELIVER_MS and friends)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import running_broker
from rel_harness import send_with, wait_for_messages

from tidemq.broker.delay_levels import requested_delivery_ms
from tidemq.broker.schedule import DelayRouter
from tidemq.broker.timer import TIMER_TOPIC_PREFIX, TimerWheel
from tidemq.clock import FakeClock
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import encode_properties
from tidemq.protocol.record import decode_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore

BUCKET_MS = 1_000


def test_requested_delivery_time_properties() -> None:
    assert requested_delivery_ms({}, 1_000) is None
    assert requested_delivery_ms({"TIMER_DELIVER_MS": "5000"}, 1_000) == 5_000
    assert requested_delivery_ms({"TIMER_DELAY_SEC": "3"}, 1_000) == 4_000
    assert requested_delivery_ms({"TIMER_DELAY_MS": "250"}, 1_000) == 1_250
    with pytest.raises(ValueError, match="TIMER_DELAY_MS"):
        requested_delivery_ms({"TIMER_DELAY_MS": "-1"}, 0)


class _World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = FakeClock()
        self.store = self._store()
        self.wheel = self._wheel()

    def _store(self) -> FileMessageStore:
        store = FileMessageStore(
            StoreConfig(root_dir=self.root / "s", commit_log_file_size=1024 * 1024), self.clock
        )
        store.start()
        return store

    def _wheel(self) -> TimerWheel:
        wheel = TimerWheel(self.store, self.clock, self.root / "config", bucket_ms=BUCKET_MS)
        wheel.load()
        self.router = DelayRouter((100,), self.clock, timer=wheel, timer_max_delay_ms=60_000)
        return wheel

    def restart(self) -> None:
        self.wheel.persist()
        self.store.shutdown()
        self.store = self._store()
        self.wheel = self._wheel()

    def send(self, deliver_in_ms: int, body: bytes) -> None:
        deliver = self.clock.now_ms() + deliver_in_ms
        message = MessageToStore(
            topic="T",
            queue_id=0,
            body=body,
            flag=0,
            properties=encode_properties({"TIMER_DELIVER_MS": str(deliver)}),
            sys_flag=0,
            born_timestamp=1,
            born_host=("127.0.0.1", 1),
            store_host=("127.0.0.1", 2),
        )
        assert self.store.put_message(self.router.route(message)).ok

    def delivered(self) -> list[bytes]:
        result = self.store.get_messages("T", 0, 0, 256)
        return [m.body for m in decode_records(b"".join(result.records))]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[_World]:
    w = _World(tmp_path)
    yield w
    w.store.shutdown()


def test_timers_fire_in_time_order_across_buckets(world: _World) -> None:
    for delay in (3_500, 250, 2_100, 900, 251):
        world.send(delay, b"%d" % delay)
    assert world.wheel.pending_buckets == 3  # +0 s, +2 s, +3 s
    assert world.wheel.held_in_memory() == 0  # nothing is read before its bucket opens
    fired: list[bytes] = []
    elapsed = 0
    while len(fired) < 5:
        wait = world.wheel.deliver_due()
        now_fired = world.delivered()
        for body in now_fired[len(fired) :]:
            assert int(body) <= elapsed, "delivered early"
            assert elapsed - int(body) <= 1, "woke late"
        fired = now_fired
        assert wait > 0
        world.clock.advance(wait)
        elapsed += wait
    assert fired == [b"250", b"251", b"900", b"2100", b"3500"]
    world.clock.advance(BUCKET_MS)
    world.wheel.deliver_due()
    assert world.wheel.pending_buckets == 0
    assert not any(t.startswith(TIMER_TOPIC_PREFIX) for t in world.store.topics_and_queues())


def test_only_open_buckets_are_held_in_memory(world: _World) -> None:
    for i in range(200):
        world.send(10_000 + i * 100, b"%d" % i)  # twenty buckets, ten seconds out
    world.wheel.deliver_due()
    assert world.wheel.held_in_memory() == 0
    world.clock.advance(9_000)
    world.wheel.deliver_due()
    assert world.wheel.held_in_memory() == 10  # only the bucket starting at +10 s
    assert world.delivered() == []


def test_an_arrival_due_before_the_heap_head_is_not_skipped(world: _World) -> None:
    world.send(500, b"500")
    world.wheel.deliver_due()
    world.send(200, b"200")
    world.clock.advance(200)
    world.wheel.deliver_due()
    assert world.delivered() == [b"200"]
    world.restart()
    world.clock.advance(300)
    world.wheel.deliver_due()
    assert world.delivered() == [b"200", b"500"]


def test_restart_skips_delivered_timers_and_keeps_pending(world: _World) -> None:
    for delay in (100, 200, 300, 1_500):
        world.send(delay, b"%d" % delay)
    world.clock.advance(200)
    world.wheel.deliver_due()
    assert world.delivered() == [b"100", b"200"]
    world.restart()
    world.wheel.deliver_due()
    assert world.delivered() == [b"100", b"200"]  # nothing twice, nothing early
    world.clock.advance(100)
    world.wheel.deliver_due()
    assert world.delivered() == [b"100", b"200", b"300"]
    world.clock.advance(1_200)
    world.wheel.deliver_due()
    assert world.delivered() == [b"100", b"200", b"300", b"1500"]


async def test_timer_message_over_the_wire(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as broker:
        sent_at = time.monotonic()
        deliver_ms = broker.app.clock.now_ms() + 300
        response = await send_with(broker, "TopicT", b"at", {"TIMER_DELIVER_MS": str(deliver_ms)})
        assert response.code == 0, response.remark
        relative = await send_with(broker, "TopicT", b"rel", {"TIMER_DELAY_MS": "150"})
        assert relative.code == 0
        found, seen_at = await wait_for_messages(broker, "TopicT", 2)
        assert [m.body for m in found] == [b"rel", b"at"]
        assert found[1].store_timestamp >= deliver_ms
        assert (seen_at - sent_at) * 1000 < 300 + 150
        assert "TIMER_DELIVER_MS" not in found[1].property_map()


async def test_delivery_time_beyond_the_horizon_is_refused(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", timerMaxDelaySec="60") as broker:
        too_late = broker.app.clock.now_ms() + 61_000
        response = await send_with(broker, "TopicT", b"x", {"TIMER_DELIVER_MS": str(too_late)})
        assert response.code == ResponseCode.MESSAGE_ILLEGAL
        assert "timerMaxDelaySec" in (response.remark or "")
        past = await send_with(broker, "TopicT", b"now", {"TIMER_DELIVER_MS": "1"})
        assert past.code == 0
        assert broker.app.store.max_offset("TopicT", 0) == 1
