"""SlaveSync against a real master over loopback: the four tables copied, the measured staleness
bound (interval + one round trip), a failed copy keeps the last tables with rate-limited lines,
and the bodies of 45 and 201 in RocketMQ's shapes."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from broker_harness import Harness, eventually, running_broker

from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import ScheduleService
from tidemq.broker.slave_sync import SlaveSync
from tidemq.broker.topics import TopicTable
from tidemq.clock import SystemClock
from tidemq.errors import ProtocolError
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.store.message_store import FileMessageStore

INTERVAL_MS = 100
# What the loopback round trip and a loaded test machine may add to the interval.
ROUND_TRIP_ALLOWANCE_MS = 150


@dataclass
class Copy:
    sync: SlaveSync
    topics: TopicTable
    groups: SubscriptionGroupTable
    offsets: ConsumerOffsetTable
    schedule: ScheduleService


@contextlib.asynccontextmanager
async def slave_tables(root: Path, master_addr: str | None) -> AsyncIterator[Copy]:
    """A slave's four tables (no store traffic) and a SlaveSync copying into them."""
    clock = SystemClock()
    config_dir = root / "config"
    topics = TopicTable(
        config_dir,
        clock,
        cluster_name="DefaultCluster",
        broker_name="broker-a",
        auto_create_topic_enable=True,
        default_topic_queue_nums=4,
    )
    groups = SubscriptionGroupTable(config_dir, clock, auto_create=True)
    offsets = ConsumerOffsetTable(config_dir)
    schedule = ScheduleService(_unused_store(), (1000,), clock, config_dir)
    client = RemotingClient(clock=clock)
    sync = SlaveSync(
        client, topics, groups, offsets, schedule, clock, interval_ms=INTERVAL_MS, timeout_ms=500
    )
    sync.set_master(master_addr)
    try:
        yield Copy(sync, topics, groups, offsets, schedule)
    finally:
        await sync.stop()
        await client.close()
        await topics.flush()
        await groups.flush()


def _unused_store() -> FileMessageStore:
    # The schedule service never runs here: only its progress table is copied.
    return None  # type: ignore[return-value]


async def test_one_round_copies_the_four_tables(tmp_path: Path, broker: Harness) -> None:
    master = broker.app
    assert (await broker.send("TopicCopy", b"m")).code == ResponseCode.SUCCESS
    master.offsets.commit("G1", "TopicCopy", 0, 1)
    master.groups.find_or_create("G1")
    master.schedule.replace_progress(b'{"offsetTable":{"2":9}}')
    async with slave_tables(tmp_path, broker.addr) as copy:
        assert await copy.sync.sync_once()
        assert copy.topics.snapshot() == master.topics.snapshot()
        assert copy.topics.data_version == master.topics.data_version
        assert copy.offsets.query("G1", "TopicCopy", 0) == 1
        assert copy.groups.snapshot() == master.groups.snapshot()
        assert copy.schedule.progress(2) == 9
        assert copy.offsets.dirty  # written by the slave's own periodic persistence
        # Nothing changed on the master: a second round replaces nothing.
        version = copy.topics.data_version
        assert await copy.sync.sync_once()
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
            assert await copy.sync.sync_once()
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


async def test_delay_and_group_bodies_have_rocketmqs_shapes(broker: Harness) -> None:
    # fastjson's unquoted keys, as a RocketMQ master answers 45, are read too.
    assert broker.app.schedule.replace_progress(b'{"offsetTable":{1:3}}')
    delay = await broker.call(RemotingCommand(code=RequestCode.GET_ALL_DELAY_OFFSET))
    assert delay.code == ResponseCode.SUCCESS
    assert orjson.loads(delay.body) == {"offsetTable": {"1": 3}}
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
