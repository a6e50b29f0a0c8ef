"""SlaveSync against a real master over loopback: the four tables copied, the measured staleness
bound (interval + one round trip), a failed copy keeps the last tables with rate-limited lines,
the bodies of 43, 45 and 201 in RocketMQ's shapes (plus TideMQ's keys), and consumer offsets
committed on the slave kept across the master's copies and pushed to it (broker/offsets.py's
merge rule). The slave's tables sit on a real store whose log `Copy.round` first brings up to the
master's (slave_tables.py); test_slave_sync_hold.py covers copies ahead of that log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest
from broker_harness import Harness, eventually, running_broker
from slave_tables import INTERVAL_MS, slave_tables

from tidemq.broker.offsets import decode_offsets
from tidemq.broker.schedule import decode_progress
from tidemq.broker.slave_sync import LOG_OFFSET_KEY
from tidemq.broker.timer import TIMER_PROGRESS_KEY
from tidemq.clock import SystemClock
from tidemq.errors import ProtocolError
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient

# What the loopback round trip and a loaded test machine may add to the interval.
ROUND_TRIP_ALLOWANCE_MS = 150


async def test_one_round_copies_the_four_tables(tmp_path: Path, broker: Harness) -> None:
    master = broker.app
    assert (await broker.send("TopicCopy", b"m")).code == ResponseCode.SUCCESS
    master.offsets.commit("G1", "TopicCopy", 0, 1)
    master.groups.find_or_create("G1")
    master.schedule.replace_progress(b'{"offsetTable":{"2":9}}')
    async with slave_tables(tmp_path, broker.addr) as copy:
        assert await copy.round(broker)
        assert copy.topics.snapshot() == master.topics.snapshot()
        assert copy.topics.data_version == master.topics.data_version
        assert copy.offsets.query("G1", "TopicCopy", 0) == 1
        assert copy.groups.snapshot() == master.groups.snapshot()
        assert copy.schedule.progress(2) == 9
        assert copy.offsets.dirty  # written by the slave's own periodic persistence
        # Nothing changed on the master: a second round replaces nothing.
        version = copy.topics.data_version
        assert await copy.round(broker)
        assert copy.topics.data_version is version


async def test_staleness_is_at_most_the_interval_plus_a_round_trip(
    tmp_path: Path, broker: Harness
) -> None:
    """Measured: each change on the master is on the slave within INTERVAL_MS plus one loopback
    round trip (the bound slave_sync.py states)."""
    async with slave_tables(tmp_path, broker.addr) as copy:
        copy.sync.start()
        await eventually(lambda: copy.sync.last_synced_ms > 0, 5.0)
        lags_ms: list[float] = []
        for i in range(5):
            name = f"TopicLag{i}"
            began = time.monotonic()
            broker.app.topics.put(
                TopicConfig(topic_name=name, read_queue_nums=1, write_queue_nums=1, perm=6)
            )
            await eventually(lambda name=name: name in copy.topics, 5.0)  # type: ignore[misc]
            lags_ms.append((time.monotonic() - began) * 1000)
        assert max(lags_ms) <= INTERVAL_MS + ROUND_TRIP_ALLOWANCE_MS, lags_ms


async def test_a_failed_copy_keeps_the_last_tables_and_logs_a_few_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(tmp_path / "master") as broker:
        broker.app.offsets.commit("G2", "TopicKeep", 0, 4)
        addr = broker.addr
        async with slave_tables(tmp_path / "slave", addr) as copy:
            assert await copy.round(broker)
    # The master is gone: every round fails, the tables stay, the log gets a few lines.
    async with slave_tables(tmp_path / "slave2", addr) as copy:
        copy.offsets.commit("G2", "TopicKeep", 0, 4)
        with caplog.at_level(logging.WARNING, logger="tidemq.broker.slave_sync"):
            for _ in range(10):
                assert not await copy.sync.sync_once()
        assert copy.offsets.query("G2", "TopicKeep", 0) == 4
        lines = [r for r in caplog.records if r.name == "tidemq.broker.slave_sync"]
        assert 1 <= len(lines) <= 3
        assert "serving the last tables (never copied)" in lines[0].getMessage()


async def test_a_bad_body_changes_nothing_of_that_table(tmp_path: Path) -> None:
    async with slave_tables(tmp_path, None) as copy:
        copy.offsets.commit("G3", "T", 0, 2)
        with pytest.raises(ProtocolError, match="not a consumer offset table"):
            copy.offsets.copy_from_master(b"[1, 2]")
        with pytest.raises(ProtocolError, match="not a delay offset table"):
            copy.schedule.replace_progress(b'{"offsetTable": {"x": 1}}')
        with pytest.raises(ProtocolError, match="not a subscription group table"):
            copy.groups.replace_all(b'{"subscriptionGroupTable": {"G": {}}}')
        assert copy.offsets.query("G3", "T", 0) == 2
        assert not await copy.sync.sync_once()  # no master known: nothing to do


async def test_offset_delay_and_group_bodies_have_rocketmqs_shapes(broker: Harness) -> None:
    assert (await broker.send("TopicShape", b"m")).code == ResponseCode.SUCCESS
    log_end = broker.app.store.max_physical_offset
    assert log_end > 0
    # fastjson's unquoted keys, as a RocketMQ master answers 45, are read too.
    assert broker.app.schedule.replace_progress(b'{"offsetTable":{1:3}}')
    delay = await broker.call(RemotingCommand(code=RequestCode.GET_ALL_DELAY_OFFSET))
    assert delay.code == ResponseCode.SUCCESS
    delays = orjson.loads(delay.body)
    # TideMQ's extensions for its slaves (test_timer_copy.py, test_slave_sync_hold.py), next to
    # RocketMQ's key as it is; the log end first, so it is no older than the table.
    assert list(delays) == ["offsetTable", LOG_OFFSET_KEY, TIMER_PROGRESS_KEY]
    assert set(delays.pop(TIMER_PROGRESS_KEY)) == {"bucketMs", "logOffset", "watermarks"}
    assert delays == {"offsetTable": {"1": 3}, LOG_OFFSET_KEY: log_end}
    # Our own parsers read only RocketMQ's key (so do fastjson's wrappers).
    assert decode_progress(delay.body) == {1: 3}
    broker.app.offsets.commit("GS", "TopicShape", 0, 1)
    offset = await broker.call(RemotingCommand(code=RequestCode.GET_ALL_CONSUMER_OFFSET))
    assert orjson.loads(offset.body) == {
        "offsetTable": {"TopicShape@GS": {"0": 1}},
        LOG_OFFSET_KEY: log_end,
    }
    assert decode_offsets(offset.body) == {"TopicShape@GS": {0: 1}}
    broker.app.groups.find_or_create("G4")
    groups = await broker.call(RemotingCommand(code=RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert groups.code == ResponseCode.SUCCESS
    doc = orjson.loads(groups.body)
    assert set(doc) == {"dataVersion", "subscriptionGroupTable"}
    assert doc["subscriptionGroupTable"]["G4"] == {
        "groupName": "G4",
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }


class FlakyPushes(RemotingClient):
    """A client whose first `failures` UPDATE_CONSUMER_OFFSET requests fail to connect."""

    def __init__(self, failures: int) -> None:
        super().__init__(clock=SystemClock())
        self.failures = failures

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: float) -> RemotingCommand:
        if cmd.code == RequestCode.UPDATE_CONSUMER_OFFSET and self.failures > 0:
            self.failures -= 1
            raise OSError("connection refused (test)")
        return await super().invoke(addr, cmd, timeout_ms)


async def fill(broker: Harness, topic: str, counts: dict[int, int]) -> None:
    for queue_id, count in counts.items():
        for i in range(count):
            sent = await broker.send(topic, b"%d" % i, queue_id=queue_id)
            assert sent.code == ResponseCode.SUCCESS


async def test_commits_made_on_the_slave_survive_the_masters_return(tmp_path: Path) -> None:
    """The slave copied {0:10,1:10}; while the master was down consumers committed
    {0:50,1:50,2:30} on the slave; the master comes back with its old table: the slave keeps its
    values (queue 2 included) and the master gets them."""
    slave_offsets = {0: 50, 1: 50, 2: 30}
    async with slave_tables(tmp_path / "slave", None) as copy:
        async with running_broker(tmp_path / "master") as master:
            await fill(master, "TopicOut", slave_offsets)
            for queue_id in (0, 1):
                master.app.offsets.commit("GO", "TopicOut", queue_id, 10)
            copy.sync.set_master(master.addr)
            assert await copy.round(master)
            assert copy.offsets.offsets("GO", "TopicOut") == {0: 10, 1: 10}
        for queue_id, offset in slave_offsets.items():  # the master is down
            copy.offsets.commit("GO", "TopicOut", queue_id, offset, pending=True)
        assert not await copy.sync.sync_once()
        assert copy.offsets.pending_count == 3
        async with running_broker(tmp_path / "master") as master:  # back, same store
            assert master.app.offsets.offsets("GO", "TopicOut") == {0: 10, 1: 10}
            copy.sync.set_master(master.addr)
            assert await copy.round(master)
            assert copy.offsets.offsets("GO", "TopicOut") == slave_offsets
            assert master.app.offsets.offsets("GO", "TopicOut") == slave_offsets  # pushed
            assert await copy.round(master)
            assert copy.offsets.offsets("GO", "TopicOut") == slave_offsets
            assert copy.offsets.pending_count == 0  # settled: the master has them


async def test_the_masters_moves_win_over_pending_commits(tmp_path: Path, broker: Harness) -> None:
    """A pending value below the master's is settled by it; one the master changed since the
    last copy (an admin reset) gives way to the master's; neither is pushed."""
    await fill(broker, "TopicMove", {0: 40, 1: 40})
    master = broker.app.offsets
    master.commit("GM", "TopicMove", 0, 10)
    master.commit("GM", "TopicMove", 1, 10)
    async with slave_tables(tmp_path, broker.addr) as copy:
        assert await copy.round(broker)
        copy.offsets.commit("GM", "TopicMove", 0, 30, pending=True)
        copy.offsets.commit("GM", "TopicMove", 1, 20, pending=True)
        master.commit("GM", "TopicMove", 0, 5)  # reset on the master
        master.commit("GM", "TopicMove", 1, 35)  # consumed further there
        assert await copy.round(broker)
        assert copy.offsets.offsets("GM", "TopicMove") == {0: 5, 1: 35}
        assert copy.offsets.pending_count == 0
        assert master.offsets("GM", "TopicMove") == {0: 5, 1: 35}


async def test_a_failed_push_goes_again_next_round_with_one_log_line(
    tmp_path: Path, broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(broker, "TopicPush", {0: 40})
    broker.app.offsets.commit("GP", "TopicPush", 0, 10)
    client = FlakyPushes(failures=3)
    async with slave_tables(tmp_path, broker.addr, client) as copy:
        assert await copy.round(broker)
        copy.offsets.commit("GP", "TopicPush", 0, 40, pending=True)
        with caplog.at_level(logging.WARNING, logger="tidemq.broker.slave_sync"):
            for _ in range(3):
                assert await copy.round(broker)  # the tables are copied; the push fails
                assert broker.app.offsets.query("GP", "TopicPush", 0) == 10
                assert copy.offsets.query("GP", "TopicPush", 0) == 40
        lines = [r.getMessage() for r in caplog.records if r.name == "tidemq.broker.slave_sync"]
        assert len(lines) == 1, lines
        assert "pushing 1 of 1 consumer offsets" in lines[0]
        assert await copy.round(broker)
        assert broker.app.offsets.query("GP", "TopicPush", 0) == 40
        assert await copy.round(broker)
        assert copy.offsets.pending_count == 0


async def test_a_push_the_master_refuses_is_dropped(tmp_path: Path, broker: Harness) -> None:
    async with slave_tables(tmp_path, broker.addr) as copy:
        copy.offsets.commit("GR", "TopicNowhere", 0, 7, pending=True)
        assert await copy.round(broker)  # TOPIC_NOT_EXIST on the master
        assert copy.offsets.pending_count == 0
        assert copy.offsets.query("GR", "TopicNowhere", 0) == 7  # only the slave has the pair
        assert broker.app.offsets.query("GR", "TopicNowhere", 0) is None
