"""Copies of 43 and 45 wait for the slave's log (slave_sync.py's "Progress never ahead of the
log"): a real master answers with its log end ("tidemqLogOffset"), a real slave store is fed its
log up to chosen record boundaries (slave_tables.py), and the slave's consumer offsets, delay
progress and check-back progress never point past what its log holds. An answer without the key
(a RocketMQ master) is applied at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from broker_harness import Harness, eventually, running_broker
from slave_tables import Copy, slave_tables

from tidemq.broker.slave_sync import LOG_OFFSET_KEY
from tidemq.broker.transaction import half as hm
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.message import SCHEDULE_TOPIC_XXXX, TRANS_CHECK_GROUP, SysFlag
from tidemq.remoting.client import RemotingClient
from tidemq.testing import eventually_async

OFFSETS = RequestCode.GET_ALL_CONSUMER_OFFSET
DELAYS = RequestCode.GET_ALL_DELAY_OFFSET
TOPIC = "TopicHold"


async def test_a_copy_ahead_of_the_log_is_held_until_the_log_gets_there(
    tmp_path: Path, broker: Harness
) -> None:
    for i in range(3):
        assert (await broker.send(TOPIC, b"%d" % i)).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GH", TOPIC, 0, 3)
    broker.app.schedule.replace_progress(b'{"offsetTable":{"1":4}}')
    first_end = broker.app.store.read_record(0)
    assert first_end is not None
    async with slave_tables(tmp_path, broker.addr) as copy:
        assert await copy.sync.sync_once()  # a good round: the copies are held, not refused
        assert copy.offsets.query("GH", TOPIC, 0) is None
        assert copy.schedule.progress(1) == 0
        assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (1, 1)
        copy.catch_up(broker, len(first_end))  # one of three messages: still short
        assert await copy.sync.sync_once()
        assert copy.offsets.query("GH", TOPIC, 0) is None
        assert copy.store.max_offset(TOPIC, 0) == 1
        copy.catch_up(broker)
        assert await copy.sync.sync_once()
        assert copy.offsets.query("GH", TOPIC, 0) == 3
        assert copy.schedule.progress(1) == 4
        assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (0, 0)


async def test_stop_applies_what_the_log_reached_and_a_new_master_drops_the_rest(
    tmp_path: Path, broker: Harness
) -> None:
    """A promotion stops the slave's BrokerApp first: its tables are the freshest its log
    covers. Another master's copies are of another log: dropped."""
    assert (await broker.send(TOPIC, b"m")).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GH", TOPIC, 0, 1)
    async with slave_tables(tmp_path / "a", broker.addr) as copy:
        assert await copy.sync.sync_once()
        assert copy.sync.held(OFFSETS) == 1
        copy.catch_up(broker)
        await copy.sync.stop()
        assert copy.offsets.query("GH", TOPIC, 0) == 1
    async with slave_tables(tmp_path / "b", broker.addr) as copy:
        assert await copy.sync.sync_once()
        copy.sync.set_master("127.0.0.1:1")
        assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (0, 0)
        copy.catch_up(broker)
        await copy.sync.stop()
        assert copy.offsets.query("GH", TOPIC, 0) is None


async def test_a_lagging_slave_applies_its_oldest_copy_once_reached(
    tmp_path: Path, broker: Harness
) -> None:
    """The oldest held copy is kept: a slave always behind the newest one still moves on."""
    ends = []
    async with slave_tables(tmp_path, broker.addr) as copy:
        for i in range(1, 4):
            assert (await broker.send(TOPIC, b"%d" % i)).code == ResponseCode.SUCCESS
            broker.app.offsets.commit("GL", TOPIC, 0, i)
            ends.append(broker.app.store.max_physical_offset)
            assert await copy.sync.sync_once()
        assert copy.sync.held(OFFSETS) == 2  # the first and the third
        copy.catch_up(broker, ends[1])  # past the first and the second
        assert (await broker.send(TOPIC, b"4")).code == ResponseCode.SUCCESS
        broker.app.offsets.commit("GL", TOPIC, 0, 4)
        assert await copy.sync.sync_once()
        assert copy.offsets.query("GL", TOPIC, 0) == 1  # the first: the second was let go
        copy.catch_up(broker)
        assert await copy.sync.sync_once()
        assert copy.offsets.query("GL", TOPIC, 0) == 4


async def test_a_copy_read_before_a_push_is_dropped(tmp_path: Path, broker: Harness) -> None:
    """A held copy of 43 read before this slave pushed its commit would look like a reset on
    the master (its older value) and undo the commit: the push drops it."""
    for i in range(3):
        assert (await broker.send(TOPIC, b"%d" % i)).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GP", TOPIC, 0, 1)
    async with slave_tables(tmp_path, broker.addr) as copy:
        assert await copy.round(broker)
        copy.offsets.commit("GP", TOPIC, 0, 3, pending=True)
        assert (await broker.send(TOPIC, b"3")).code == ResponseCode.SUCCESS
        first_end = broker.app.store.max_physical_offset
        assert await copy.sync.sync_once()  # held: nothing applied, nothing pushed
        assert broker.app.offsets.query("GP", TOPIC, 0) == 1
        assert (await broker.send(TOPIC, b"4")).code == ResponseCode.SUCCESS
        copy.catch_up(broker, first_end)
        # The held copy is applied (the master has 1: push 3); this round's, held, is older
        # than the push.
        assert await copy.sync.sync_once()
        assert broker.app.offsets.query("GP", TOPIC, 0) == 3
        assert copy.sync.held(OFFSETS) == 0
        copy.catch_up(broker)
        await copy.sync.stop()
        assert copy.offsets.query("GP", TOPIC, 0) == 3


class Rewriting(RemotingClient):
    """Answers of 43 and 45 rewritten by `edit` (a RocketMQ master's, a broken one)."""

    def __init__(self, edit: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self.edit = edit

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: float) -> RemotingCommand:
        answer = await super().invoke(addr, cmd, timeout_ms)
        if cmd.code in (OFFSETS, DELAYS) and answer.code == ResponseCode.SUCCESS:
            doc = orjson.loads(answer.body)
            self.edit(doc)
            answer.body = orjson.dumps(doc)
        return answer


def _keyless(doc: dict[str, Any]) -> None:
    del doc[LOG_OFFSET_KEY]


async def test_an_answer_without_the_key_is_applied_at_once(
    tmp_path: Path, broker: Harness
) -> None:
    assert (await broker.send(TOPIC, b"m")).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GU", TOPIC, 0, 1)
    broker.app.schedule.replace_progress(b'{"offsetTable":{"1":2}}')
    async with slave_tables(tmp_path, broker.addr, Rewriting(_keyless)) as copy:
        assert copy.store.max_physical_offset == 0
        assert await copy.sync.sync_once()
        assert copy.offsets.query("GU", TOPIC, 0) == 1
        assert copy.schedule.progress(1) == 2


@pytest.mark.parametrize("bad", ["12", -1, True, 1.5])
async def test_a_bad_key_is_a_failed_copy(tmp_path: Path, broker: Harness, bad: object) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc[LOG_OFFSET_KEY] = bad

    broker.app.offsets.commit("GB", TOPIC, 0, 1)
    async with slave_tables(tmp_path, broker.addr, Rewriting(edit)) as copy:
        assert not await copy.sync.sync_once()
        assert copy.offsets.query("GB", TOPIC, 0) is None
        assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (0, 0)


async def test_delay_progress_never_passes_the_re_stored_message(tmp_path: Path) -> None:
    """F2: the master's level progress moves once the due message is re-stored; a slave without
    that message keeps its old progress, or, promoted, it would never deliver it."""
    async with running_broker(tmp_path / "master", messageDelayLevel="1s") as master:
        sent = await master.send(TOPIC, b"later", properties={"DELAY": "1"})
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        parked_end = master.app.store.max_physical_offset
        await eventually(lambda: master.app.schedule.delivered == 1, 5.0)
        assert master.app.schedule.progress(1) == 1
        async with slave_tables(tmp_path / "slave", master.addr) as copy:
            copy.catch_up(master, parked_end)
            assert copy.store.max_offset(SCHEDULE_TOPIC_XXXX, 0) == 1
            for _ in range(3):
                assert await copy.sync.sync_once()
                assert copy.schedule.progress(1) == 0
            assert copy.store.max_offset(TOPIC, 0) == 0
            await _check_applied_with_its_record(
                copy, master, lambda: copy.schedule.progress(1) == 1, TOPIC
            )


async def test_check_back_progress_never_passes_its_copies(tmp_path: Path) -> None:
    """F3: a check-back pass puts a half back at the queue's end and moves CID_RMQ_SYS_TRANS's
    half offset past the original; a slave without the copy keeps the old offset, or, promoted,
    it would never check that transaction back."""
    settings = {"transactionTimeOut": "1", "transactionCheckInterval": "3600000"}
    async with running_broker(tmp_path / "master", **settings) as master:
        props = {"TRAN_MSG": "true", "PGROUP": "PG_HOLD"}
        sent = await master.send(TOPIC, b"half", properties=props, sys_flag=SysFlag.PREPARED)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        half_end = master.app.store.max_physical_offset
        check_back = master.app.check_back
        assert check_back is not None

        async def passed() -> bool:  # due after 1 ms; nobody to ask: put back, not counted
            return (await check_back.run_once()).half_offset == 1

        await eventually_async(passed, 5.0)
        assert master.app.store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID) == 2

        def half_offset() -> int | None:
            return copy.offsets.query(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID)

        async with slave_tables(tmp_path / "slave", master.addr) as copy:
            copy.catch_up(master, half_end)
            for _ in range(3):
                assert await copy.sync.sync_once()
                assert half_offset() in (None, 0)
            await _check_applied_with_its_record(
                copy, master, lambda: half_offset() == 1, hm.HALF_TOPIC
            )
            assert copy.store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID) == 2


async def _check_applied_with_its_record(
    copy: Copy, master: Harness, applied: Callable[[], bool], topic: str
) -> None:
    """Once the slave's log holds the rest of the master's, the copy is applied."""
    assert not applied()
    copy.catch_up(master)
    assert copy.store.max_offset(topic, 0) >= 1
    assert await copy.sync.sync_once()
    assert applied()
