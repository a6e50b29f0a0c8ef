"""A master and its slave in one process, over loopback, with a real name server (issue 13 items
3 to 5): the slave learns its master from the name server, follows it, refuses writes (sends with
SERVICE_NOT_AVAILABLE, transaction ends with SLAVE_NOT_AVAILABLE, as upstream), serves pulls,
offsets and runtime info, and runs no check-back, schedule or timer; a SYNC_MASTER answers
SUCCESS once its slave has a send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from broker_harness import Harness, eventually, messages, running_broker

from tidemq.broker.replication import MASTER_SWITCH_ROUNDS
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.bodies import KVTable
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    PullMessageResponseHeader,
    PullSysFlag,
)
from tidemq.protocol.headers_query import (
    ConsumerSendMsgBackRequestHeader,
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tidemq.protocol.headers_tx import EndBatchRequestHeader, EndTransactionRequestHeader
from tidemq.protocol.message import BatchItem, encode_batch

SECRET = "slave-refusals-secret"
TIMEOUT_S = 10.0
SUSPENDED = PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND
HOLD_MS = 300
YEAR_MS = 365 * 86_400_000


@dataclass
class Group:
    master: Harness
    slave: Harness


@contextlib.asynccontextmanager
async def broker_group(root: Path, role: str = "SYNC_MASTER") -> AsyncIterator[Group]:
    namesrv = NamesrvApp(NamesrvConfig(listen_port=0), SystemClock())
    await namesrv.start()
    common = {
        "namesrvAddr": f"127.0.0.1:{namesrv.port}",
        "haSecret": SECRET,
        "haSendHeartbeatInterval": "200",
        "haHousekeepingInterval": "2000",
        "slaveSyncIntervalMs": "100",
    }
    try:
        async with (
            running_broker(root / "master", brokerRole=role, **common) as master,
            running_broker(root / "slave", brokerRole="SLAVE", brokerId="1", **common) as slave,
        ):
            yield Group(master, slave)
    finally:
        await namesrv.stop()


async def runtime_info(broker: Harness) -> dict[str, str]:
    answer = await broker.call(RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO))
    assert answer.code == ResponseCode.SUCCESS
    return KVTable.from_json(answer.body).table


async def following(group: Group) -> None:
    """Until the slave streams from its master (the master counts it)."""
    master = group.master.app.replication.master
    assert master is not None
    await eventually(lambda: len(master.slaves()) == 1, TIMEOUT_S)


async def test_a_sync_master_answers_success_once_its_slave_has_the_send(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        await following(group)
        answer = await group.master.send("TopicHA", b"replicated")
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        store = group.slave.app.store
        assert store.max_physical_offset >= group.master.app.store.max_physical_offset
        info = await runtime_info(group.master)
        assert info["brokerRole"] == "SYNC_MASTER"
        assert info["haSlaveCount"] == "1"
        addr, broker_id, acked, lag_bytes, _lag_ms = info["haSlaves"].split(",")
        assert (broker_id, acked) == ("1", info["commitLogMaxOffset"])
        assert lag_bytes == "0"
        assert addr.startswith("127.0.0.1:")
        slave_info = await runtime_info(group.slave)
        assert slave_info["brokerRole"] == "SLAVE"
        assert slave_info["haConnected"] == "true"
        assert slave_info["haMasterAddr"] == group.master.app.replication.ha_address()
        assert slave_info["haRefusedReason"] == ""
        assert slave_info["haReplicaOffset"] == info["commitLogMaxOffset"]
        config = await group.slave.call(RemotingCommand(code=RequestCode.GET_BROKER_CONFIG))
        assert b"haSecret=<redacted>" in config.body
        assert SECRET.encode() not in config.body


async def test_the_slave_refuses_every_write(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        await following(group)
        sent = await group.master.send("TopicRO", b"m")
        assert sent.code == ResponseCode.SUCCESS
        slave = group.slave
        await eventually(lambda: "TopicRO" in slave.app.topics, TIMEOUT_S)
        answers = [
            await slave.send("TopicRO", b"x"),
            await slave.send("TopicRO", b"x", code=RequestCode.SEND_MESSAGE_V2),
            await slave.send(
                "TopicRO",
                encode_batch([BatchItem(flag=0, body=b"b", properties="")]),
                code=RequestCode.SEND_BATCH_MESSAGE,
                batch=True,
            ),
            await slave.call(_send_back(slave.app.store.max_physical_offset)),
            await slave.call(_end_transaction()),
            await slave.call(_end_batch()),
        ]
        # Sends and send-back as upstream's put on a slave (SERVICE_NOT_AVAILABLE: a send
        # status code such as SLAVE_NOT_AVAILABLE would promise a msgId the answer lacks);
        # the transaction ends as upstream's EndTransactionProcessor.
        codes = [answer.code for answer in answers]
        assert (
            codes
            == [ResponseCode.SERVICE_NOT_AVAILABLE] * 4 + [ResponseCode.SLAVE_NOT_AVAILABLE] * 2
        ), [answer.remark for answer in answers]
        for answer in answers:
            assert "is a slave" in (answer.remark or "")
        # Nothing was written: the slave's log is still byte for byte its master's.
        assert slave.app.store.max_physical_offset == group.master.app.store.max_physical_offset
        assert slave.app.store.replica_mode


async def test_the_slave_refuses_admin_writes(tmp_path: Path) -> None:
    """Topic create/delete on a slave would be undone by its next copy of the master's table
    (slave_sync.py): refused like sends."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        assert (await group.master.send("TopicAdmin", b"m")).code == ResponseCode.SUCCESS
        slave = group.slave
        await eventually(lambda: "TopicAdmin" in slave.app.topics, TIMEOUT_S)
        create = CreateTopicRequestHeader(
            topic="TopicOnSlave", read_queue_nums=4, write_queue_nums=4
        )
        delete = DeleteTopicRequestHeader(topic="TopicAdmin")
        answers = [
            await slave.call(
                RemotingCommand(
                    code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=create.to_fields()
                )
            ),
            await slave.call(
                RemotingCommand(
                    code=RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields=delete.to_fields()
                )
            ),
        ]
        for answer in answers:
            assert answer.code == ResponseCode.SLAVE_NOT_AVAILABLE, answer.remark
            assert "is a slave" in (answer.remark or "")
        assert "TopicOnSlave" not in slave.app.topics
        assert "TopicAdmin" in slave.app.topics
        store = slave.app.store
        assert sum(store.max_offset("TopicAdmin", queue_id) for queue_id in range(16)) == 1


async def test_name_servers_that_disagree_do_not_drop_a_following_link(tmp_path: Path) -> None:
    """A stale name server naming another master, answer after answer between the true one's:
    the slave keeps its link and its metadata source (replication.py, MasterChoice)."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        replication = group.slave.app.replication
        ha_slave, sync = replication.slave, replication.sync
        assert ha_slave is not None
        assert sync is not None
        await eventually(lambda: ha_slave.following, TIMEOUT_S)  # past the VERDICT, its side
        master_addr, ha_addr = sync.master_addr, ha_slave.state().master_addr
        assert master_addr is not None
        link = ha_slave._link
        stale = ("127.0.0.1:1", "127.0.0.1:2")
        for _ in range(5):
            replication.on_master(*stale)
            replication.on_master(master_addr, ha_addr)
        assert ha_slave._link is link
        assert ha_slave.state().connected
        assert (sync.master_addr, ha_slave.state().master_addr) == (master_addr, ha_addr)
        # Every name server naming the other one for MASTER_SWITCH_ROUNDS rounds: it switches.
        for _ in range(MASTER_SWITCH_ROUNDS):
            replication.on_master(*stale)
        assert (sync.master_addr, ha_slave.state().master_addr) == stale
        # Not following any more (nothing listens there): the true master is taken back at once.
        await eventually(lambda: not ha_slave.following, TIMEOUT_S)
        replication.on_master(master_addr, ha_addr)
        assert (sync.master_addr, ha_slave.state().master_addr) == (master_addr, ha_addr)
        await eventually(lambda: ha_slave.state().connected, TIMEOUT_S)


async def test_the_slave_serves_pulls_offsets_and_suggests_the_master(tmp_path: Path) -> None:
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        for i in range(3):
            assert (await group.master.send("TopicRead", b"%d" % i)).code == ResponseCode.SUCCESS
        slave = group.slave
        await eventually(
            lambda: (
                slave.app.store.max_offset("TopicRead", 0) == 3 and "TopicRead" in slave.app.topics
            ),
            TIMEOUT_S,
        )
        pulled = await slave.pull("TopicRead")
        assert pulled.code == ResponseCode.SUCCESS
        assert [m.body for m in messages(pulled)] == [b"0", b"1", b"2"]
        header = PullMessageResponseHeader.from_fields(pulled.ext_fields)
        assert header.suggest_which_broker_id == 0
        update = UpdateConsumerOffsetRequestHeader(
            consumer_group="CG", topic="TopicRead", queue_id=0, commit_offset=2
        )
        committed = await slave.call(
            RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=update.to_fields())
        )
        assert committed.code == ResponseCode.SUCCESS
        query = QueryConsumerOffsetRequestHeader(consumer_group="CG", topic="TopicRead", queue_id=0)
        queried = await slave.call(
            RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=query.to_fields())
        )
        assert queried.code == ResponseCode.SUCCESS
        assert queried.ext_fields["offset"] == "2"


async def test_a_slave_behind_keeps_the_consumers_offset(tmp_path: Path) -> None:
    """An offset the slave does not hold yet (the consumer read it from the master) is neither
    moved back by a pull nor clamped by a commit: either would deliver those messages again. The
    pull answers 19 with the offset kept, and holds like one past the end (no spinning on 20)."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        assert (await group.master.send("TopicAhead", b"0")).code == ResponseCode.SUCCESS
        slave = group.slave
        await eventually(lambda: slave.app.store.max_offset("TopicAhead", 0) == 1, TIMEOUT_S)
        await eventually(lambda: "TopicAhead" in slave.app.topics, TIMEOUT_S)
        pulled = await slave.pull("TopicAhead", offset=10)
        assert pulled.code == ResponseCode.PULL_NOT_FOUND
        header = PullMessageResponseHeader.from_fields(pulled.ext_fields)
        assert header.next_begin_offset == 10
        assert header.suggest_which_broker_id == 0
        assert header.max_offset == 1
        began = time.monotonic()
        held = await slave.pull("TopicAhead", offset=10, sys_flag=SUSPENDED, suspend_ms=HOLD_MS)
        assert time.monotonic() - began >= HOLD_MS / 1000 * 0.9  # held to its timeout
        assert held.code == ResponseCode.PULL_NOT_FOUND
        assert PullMessageResponseHeader.from_fields(held.ext_fields).next_begin_offset == 10
        # Queues the slave has no record of yet (no consume queue): the same.
        for queue_id in (1, 3):
            empty = await slave.pull("TopicAhead", queue_id=queue_id, offset=5)
            assert empty.code == ResponseCode.PULL_NOT_FOUND
            assert PullMessageResponseHeader.from_fields(empty.ext_fields).next_begin_offset == 5
        on_master = await group.master.pull("TopicAhead", offset=10)
        assert on_master.code == ResponseCode.PULL_OFFSET_MOVED  # a master corrects it
        update = UpdateConsumerOffsetRequestHeader(
            consumer_group="CG", topic="TopicAhead", queue_id=0, commit_offset=10
        )
        committed = await slave.call(
            RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=update.to_fields())
        )
        assert committed.code == ResponseCode.SUCCESS
        query = QueryConsumerOffsetRequestHeader(
            consumer_group="CG", topic="TopicAhead", queue_id=0
        )
        queried = await slave.call(
            RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=query.to_fields())
        )
        assert queried.ext_fields["offset"] == "10"


async def test_a_held_pull_past_the_slaves_end_wakes_at_its_offset(tmp_path: Path) -> None:
    """A pull at 4 on a slave holding 1 record is not woken by the replicated records 1 to 3
    (each is skipped by the hold), and is answered as soon as record 4 arrives."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        master, slave = group.master, group.slave
        assert (await master.send("TopicWake", b"0")).code == ResponseCode.SUCCESS
        await eventually(lambda: slave.app.store.max_offset("TopicWake", 0) == 1, TIMEOUT_S)
        await eventually(lambda: "TopicWake" in slave.app.topics, TIMEOUT_S)
        pull = asyncio.create_task(
            slave.pull(
                "TopicWake", offset=4, sys_flag=SUSPENDED, suspend_ms=20_000, timeout_ms=30_000
            )
        )
        hold = slave.app.pull_hold
        await eventually(lambda: hold.held_count == 1, TIMEOUT_S)
        for i in (1, 2, 3):
            assert (await master.send("TopicWake", b"%d" % i)).code == ResponseCode.SUCCESS
        await eventually(lambda: slave.app.store.max_offset("TopicWake", 0) == 4, TIMEOUT_S)
        await asyncio.sleep(0.2)  # a wake would have been answered by now
        assert not pull.done()
        assert hold.held_count == 1
        began = time.monotonic()
        assert (await master.send("TopicWake", b"4")).code == ResponseCode.SUCCESS
        pulled = await asyncio.wait_for(pull, TIMEOUT_S)
        assert time.monotonic() - began < 5.0
        assert pulled.code == ResponseCode.SUCCESS
        assert [m.body for m in messages(pulled)] == [b"4"]
        assert hold.held_count == 0


async def test_a_slave_moves_an_offset_below_its_min_as_a_master_does(tmp_path: Path) -> None:
    """Below what retention left on the slave the offset moves up to the slave's min (held at
    the requested offset, a new group consuming from the first offset would stall forever)."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        master, slave = group.master, group.slave
        body = b"x" * 8_000  # 40 of them fill five 64 KiB commit-log segments
        for _ in range(40):
            assert (await master.send("TopicTrim", body)).code == ResponseCode.SUCCESS
        store = slave.app.store
        await eventually(lambda: store.max_offset("TopicTrim", 0) == 40, TIMEOUT_S)
        await eventually(lambda: "TopicTrim" in slave.app.topics, TIMEOUT_S)
        # A year from now every segment but the one being written is past its retention.
        assert store.clean_expired_files(int(time.time() * 1000) + YEAR_MS, force=True) > 0
        low = store.min_offset("TopicTrim", 0)
        assert 0 < low < 40
        began = time.monotonic()
        pulled = await slave.pull("TopicTrim", offset=0, sys_flag=SUSPENDED, suspend_ms=HOLD_MS)
        assert time.monotonic() - began < HOLD_MS / 1000  # answered at once, not held
        assert pulled.code == ResponseCode.PULL_OFFSET_MOVED
        header = PullMessageResponseHeader.from_fields(pulled.ext_fields)
        assert (header.next_begin_offset, header.min_offset) == (low, low)
        assert header.suggest_which_broker_id == 0


async def test_a_commit_on_the_slave_survives_its_copies_and_reaches_the_master(
    tmp_path: Path,
) -> None:
    """UPDATE_CONSUMER_OFFSET on a slave is pending: the copies of the master's older table (every
    100 ms here) keep it, and the slave pushes it to the master."""
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        await following(group)
        master, slave = group.master, group.slave
        for i in range(5):
            assert (await master.send("TopicPend", b"%d" % i)).code == ResponseCode.SUCCESS
        master.app.offsets.commit("CG", "TopicPend", 0, 1)
        sync = slave.app.replication.sync
        assert sync is not None
        await eventually(lambda: slave.app.offsets.query("CG", "TopicPend", 0) == 1, TIMEOUT_S)
        update = UpdateConsumerOffsetRequestHeader(
            consumer_group="CG", topic="TopicPend", queue_id=0, commit_offset=4
        )
        committed = await slave.call(
            RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=update.to_fields())
        )
        assert committed.code == ResponseCode.SUCCESS
        await eventually(lambda: master.app.offsets.query("CG", "TopicPend", 0) == 4, TIMEOUT_S)
        rounds = sync.rounds
        await eventually(lambda: sync.rounds >= rounds + 2, TIMEOUT_S)
        assert slave.app.offsets.query("CG", "TopicPend", 0) == 4
        assert slave.app.offsets.pending_count == 0  # settled: the master has it


async def test_the_slave_runs_no_master_services(tmp_path: Path) -> None:
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        app = group.slave.app
        assert app.check_back is not None
        assert not app.check_back._periodic.running
        assert app.schedule._task is None
        assert app.timer._task is None
        assert app.replication.master is None
        assert app.replication.slave is not None
        assert group.master.app.replication.slave is None


async def test_the_slave_copies_the_masters_metadata(tmp_path: Path) -> None:
    async with broker_group(tmp_path, role="ASYNC_MASTER") as group:
        master = group.master.app
        await group.master.send("TopicMeta", b"m")
        master.offsets.commit("GroupMeta", "TopicMeta", 0, 1)
        master.groups.find_or_create("GroupMeta")
        master.schedule.replace_progress(b'{"offsetTable":{"3":7}}')
        slave = group.slave.app

        def copied() -> bool:
            return (
                slave.topics.get("TopicMeta") == master.topics.get("TopicMeta")
                and slave.offsets.query("GroupMeta", "TopicMeta", 0) == 1
                and slave.groups.get("GroupMeta") is not None
                and slave.schedule.progress(3) == 7
            )

        await eventually(copied, TIMEOUT_S)
        assert slave.topics.data_version == master.topics.data_version
        body = orjson.loads(master.groups.to_json())
        assert body["subscriptionGroupTable"]["GroupMeta"]["groupName"] == "GroupMeta"


def _send_back(offset: int) -> RemotingCommand:
    header = ConsumerSendMsgBackRequestHeader(offset=offset, group="CG")
    return RemotingCommand(code=RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=header.to_fields())


def _end_transaction() -> RemotingCommand:
    header = EndTransactionRequestHeader(
        producer_group="PG",
        tran_state_table_offset=0,
        commit_log_offset=0,
        commit_or_rollback=8,
        msg_id="M",
    )
    return RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())


def _end_batch() -> RemotingCommand:
    header = EndBatchRequestHeader(sink_id="sink", batch_id=1, commit_or_rollback=8)
    return RemotingCommand(
        code=RequestCode.TIDEMQ_END_BATCH,
        ext_fields=header.to_fields(),
        body=orjson.dumps({"txns": []}),
    )


async def test_an_async_master_listens_for_slaves_only_with_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tidemq.broker.replication"):
        async with running_broker(tmp_path / "plain") as plain:
            assert plain.app.replication.master is None
            assert plain.app.replication.ha_address() == f"127.0.0.1:{plain.app.port + 1}"
    assert "no haSecret: no HA listener" in caplog.text
    async with running_broker(tmp_path / "ha", haSecret=SECRET) as with_secret:
        master = with_secret.app.replication.master
        assert master is not None
        assert with_secret.app.replication.ha_address() == f"127.0.0.1:{master.port}"
        assert master.port != with_secret.app.port
        # ASYNC_MASTER: a send is answered after the local write, slave or none.
        assert (await with_secret.send("TopicAsync", b"m")).code == ResponseCode.SUCCESS
