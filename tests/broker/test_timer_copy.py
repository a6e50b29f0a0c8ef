"""The timer wheel's watermarks copied to a slave (GET_ALL_DELAY_OFFSET's TideMQ key, timer.py's
module doc): merged max per bucket, held until the slave's log holds what they cover, persisted;
and over a real master/slave pair, a slave started as master on its store (what a promotion
does) does not deliver again a timer its old master delivered."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from broker_harness import Harness, eventually, running_broker

from tidemq.broker.slave_sync import LOG_OFFSET_KEY
from tidemq.broker.timer import (
    TIMER_PROGRESS_FILE,
    TIMER_PROGRESS_KEY,
    TOMBSTONE_KEEP_MS,
    TimerWheel,
)
from tidemq.clock import FakeClock, SystemClock
from tidemq.errors import ProtocolError
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore

BUCKET_MS = 1_000
TIMEOUT_S = 10.0
TOPIC = "TopicTimerCopy"


class _Slave:
    """A slave's timer wheel on a real store (nothing runs: a slave delivers no timers)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = FakeClock()
        self.store = FileMessageStore(
            StoreConfig(root_dir=root / "s", commit_log_file_size=1024 * 1024), self.clock
        )
        self.store.start()
        self.wheel = self.load_wheel()

    def load_wheel(self) -> TimerWheel:
        wheel = TimerWheel(self.store, self.clock, self.root / "config", bucket_ms=BUCKET_MS)
        wheel.load()
        return wheel

    def grow_log(self) -> int:
        """One more record in the log (what replication brings); the new log end."""
        message = MessageToStore(
            topic="T",
            queue_id=0,
            body=b"x",
            flag=0,
            properties="",
            sys_flag=0,
            born_timestamp=1,
            born_host=("127.0.0.1", 1),
            store_host=("127.0.0.1", 2),
        )
        assert self.store.put_message(message).ok
        return self.store.max_physical_offset

    def marks(self) -> dict[str, int]:
        marks: dict[str, int] = self.wheel.progress_doc()["watermarks"]
        return marks


def doc(log_offset: int, marks: dict[int, int], bucket_ms: int = BUCKET_MS) -> dict[str, object]:
    watermarks = {str(k): v for k, v in marks.items()}
    return {"bucketMs": bucket_ms, "logOffset": log_offset, "watermarks": watermarks}


@pytest.fixture
def slave(tmp_path: Path) -> Iterator[_Slave]:
    s = _Slave(tmp_path)
    yield s
    s.store.shutdown()


def test_a_copy_merges_the_highest_watermark_per_bucket_and_persists(slave: _Slave) -> None:
    end = slave.grow_log()
    assert slave.wheel.copy_progress(doc(end, {1_000: 1_500, 2_000: 2_000}))
    assert slave.marks() == {"1000": 1_500, "2000": 2_000}
    # A stale answer (a slower round, or a master that restarted from an older persist) never
    # moves a watermark back; a newer one moves it on.
    assert not slave.wheel.copy_progress(doc(end, {1_000: 1_200}))
    assert slave.wheel.copy_progress(doc(end, {1_000: 1_800, 3_000: 3_100}))
    assert slave.marks() == {"1000": 1_800, "2000": 2_000, "3000": 3_100}
    slave.wheel.persist_if_dirty()  # the broker's periodic persistence, or its stop
    slave.wheel.persist()
    on_disk = orjson.loads((slave.root / "config" / TIMER_PROGRESS_FILE).read_bytes())
    assert on_disk["watermarks"] == {"1000": 1_800, "2000": 2_000, "3000": 3_100}
    assert slave.load_wheel().progress_doc()["watermarks"] == on_disk["watermarks"]


def test_a_copy_waits_until_the_slaves_log_holds_the_deliveries(slave: _Slave) -> None:
    """Watermarks ahead of the slave's log would skip timers whose deliveries it lacks."""
    first = slave.grow_log()
    assert not slave.wheel.copy_progress(doc(first + 100, {1_000: 1_400}))
    assert not slave.wheel.copy_progress(doc(first + 500, {1_000: 1_600}))  # still held: older
    assert slave.marks() == {}
    while slave.store.max_physical_offset < first + 100:
        slave.grow_log()
    # The held copy is reachable now; this round's copy is not yet, and waits in its place.
    assert slave.wheel.copy_progress(doc(first + 10_000, {1_000: 1_900}))
    assert slave.marks() == {"1000": 1_400}
    while slave.store.max_physical_offset < first + 10_000:
        slave.grow_log()
    assert slave.wheel.copy_progress(doc(first + 20_000, {1_000: 2_000}))
    assert slave.marks() == {"1000": 1_900}


def test_an_open_bucket_of_the_master_outlives_the_tombstone_horizon(slave: _Slave) -> None:
    """A bucket the master still delivers (behind by hours) keeps its watermark on the slave;
    one the master closed ages out like a local tombstone."""
    start = slave.clock.now_ms() - slave.clock.now_ms() % BUCKET_MS
    end = slave.grow_log()
    slave.wheel.copy_progress(doc(end, {start: start + 100, start + BUCKET_MS: start + 2_000}))
    slave.clock.advance(TOMBSTONE_KEEP_MS + 10 * BUCKET_MS)
    slave.wheel.persist()
    assert slave.marks() == {str(start): start + 100}
    slave.wheel.copy_progress(doc(end, {start: start + BUCKET_MS}))  # closed on the master
    slave.wheel.persist()
    assert slave.marks() == {}


def test_watermarks_beyond_a_shorter_log_are_dropped_at_load(
    slave: _Slave, caplog: pytest.LogCaptureFixture
) -> None:
    """A log truncated below what the watermarks cover (following a new master) lacks some of
    their deliveries: the timers are delivered again rather than skipped."""
    end = slave.grow_log()
    slave.wheel.copy_progress(doc(end, {1_000: 1_500}))
    slave.wheel.persist()
    assert slave.load_wheel().progress_doc()["watermarks"] == {"1000": 1_500}  # same log
    shorter = FileMessageStore(StoreConfig(root_dir=slave.root / "other"), slave.clock)
    shorter.start()
    try:
        wheel = TimerWheel(shorter, slave.clock, slave.root / "config", bucket_ms=BUCKET_MS)
        with caplog.at_level(logging.WARNING, logger="tidemq.broker.timer"):
            wheel.load()
        assert wheel.progress_doc()["watermarks"] == {}
        assert f"covers the log up to {end} but the log ends at 0" in caplog.text
    finally:
        shorter.shutdown()


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2],
        {"bucketMs": BUCKET_MS, "watermarks": {}},
        {"bucketMs": BUCKET_MS, "logOffset": 0, "watermarks": {"x": 1}},
        {"bucketMs": BUCKET_MS, "logOffset": 0, "watermarks": [1]},
        doc(0, {1_000: 1_500}, bucket_ms=600_000),
    ],
)
def test_a_bad_copy_changes_nothing(slave: _Slave, bad: object) -> None:
    end = slave.grow_log()
    slave.wheel.copy_progress(doc(end, {1_000: 1_100}))
    with pytest.raises(ProtocolError):
        slave.wheel.copy_progress(bad)
    assert slave.marks() == {"1000": 1_100}


@dataclass
class Group:
    master: Harness
    slave: Harness


@contextlib.asynccontextmanager
async def broker_group(root: Path) -> AsyncIterator[Group]:
    """A master and its slave (registered through a name server, copying every 100 ms)."""
    namesrv = NamesrvApp(NamesrvConfig(listen_port=0), SystemClock())
    await namesrv.start()
    common = {
        "namesrvAddr": f"127.0.0.1:{namesrv.port}",
        "haSecret": "timer-copy-secret",
        "haSendHeartbeatInterval": "200",
        "slaveSyncIntervalMs": "100",
    }
    try:
        async with (
            running_broker(root / "master", brokerRole="SYNC_MASTER", **common) as master,
            running_broker(root / "slave", brokerRole="SLAVE", brokerId="1", **common) as slave,
        ):
            yield Group(master, slave)
    finally:
        await namesrv.stop()


async def test_a_promoted_slave_does_not_deliver_a_copied_timer_again(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        master = group.master.app
        await eventually(
            lambda: (
                master.replication.master is not None and bool(master.replication.master.slaves())
            ),
            TIMEOUT_S,
        )
        deliver_ms = SystemClock().now_ms() + 300
        props = {"TIMER_DELIVER_MS": str(deliver_ms)}
        sent = await group.master.send(TOPIC, b"once", properties=props)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        await eventually(lambda: master.timer.delivered == 1, TIMEOUT_S)
        # The master's answer to 45 keeps RocketMQ's key and adds TideMQ's (slave_sync.py).
        answer = await group.master.call(RemotingCommand(code=RequestCode.GET_ALL_DELAY_OFFSET))
        keys = ["offsetTable", LOG_OFFSET_KEY, TIMER_PROGRESS_KEY]
        assert list(orjson.loads(answer.body)) == keys
        bucket = str(master.timer.bucket_of(deliver_ms))
        slave = group.slave.app
        await eventually(
            lambda: slave.timer.progress_doc()["watermarks"].get(bucket, 0) > deliver_ms,
            TIMEOUT_S,
        )
        await eventually(lambda: slave.store.max_offset(TOPIC, 0) == 1, TIMEOUT_S)  # replicated
    # The slave's store started as a master, as a promotion does: the timer is not due again.
    async with running_broker(tmp_path / "slave") as promoted:
        timer = promoted.app.timer
        assert timer.progress_doc()["watermarks"][bucket] > deliver_ms
        timer.deliver_due()  # a whole pass over the open bucket, now
        assert timer.delivered == 0
        assert timer.held_in_memory() == 0
        assert promoted.app.store.max_offset(TOPIC, 0) == 1
