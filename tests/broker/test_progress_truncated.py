"""A slave's copied progress across a master change and a truncation (issue 14): the timer's
held copy goes with the other held copies (SlaveSync.reset_held), and the delay levels'
progress and the check-back's CID_RMQ_SYS_TRANS offsets record the log end they cover and are
dropped at load when the log is shorter (schedule.py, offsets.py), on real stores."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from broker_harness import Harness, running_broker
from slave_tables import Copy, slave_tables

from tidemq.broker.app import store_config
from tidemq.broker.offsets import OFFSETS_FILE, ConsumerOffsetTable
from tidemq.broker.schedule import DELAY_OFFSET_FILE, ScheduleService, park
from tidemq.broker.timer import TIMER_BUCKET_MS, TimerWheel
from tidemq.broker.transaction import half as hm
from tidemq.clock import FakeClock
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import SCHEDULE_TOPIC_XXXX, TRANS_CHECK_GROUP, SysFlag
from tidemq.remoting.client import RemotingClient
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.truncate import truncate_store
from tidemq.store.types import MessageToStore

OFFSETS = RequestCode.GET_ALL_CONSUMER_OFFSET
DELAYS = RequestCode.GET_ALL_DELAY_OFFSET
TOPIC = "TopicCut"
BUCKET_MS = TIMER_BUCKET_MS  # the master's: its copies' width


def _message(topic: str = TOPIC, properties: str = "") -> MessageToStore:
    return MessageToStore(
        topic=topic,
        queue_id=0,
        body=b"x",
        flag=0,
        properties=properties,
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
    )


def _timer_doc(log_offset: int, marks: dict[int, int]) -> dict[str, object]:
    watermarks = {str(k): v for k, v in marks.items()}
    return {"bucketMs": BUCKET_MS, "logOffset": log_offset, "watermarks": watermarks}


@pytest.fixture
async def copy(tmp_path: Path, broker: Harness) -> AsyncIterator[Copy]:
    async with slave_tables(tmp_path, broker.addr) as tables:
        yield tables


# -- (A) the timer's held copy ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["set_master", "reset_held"])
async def test_a_new_master_or_epoch_drops_every_held_copy(
    copy: Copy, broker: Harness, tmp_path: Path, how: str
) -> None:
    """A copy of the old master's log, merged once this log passed its offset with the new
    master's records, would skip timers (and levels, halves) the new master never had."""
    assert (await broker.send(TOPIC, b"m")).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GR", TOPIC, 0, 1)
    wheel = TimerWheel(copy.store, FakeClock(), tmp_path / "wheel", bucket_ms=BUCKET_MS)
    copy.sync._timer = wheel  # what Replication passes a slave's SlaveSync
    # The old master's timer copy, ahead of this empty log: held (the oldest stays held).
    assert not wheel.copy_progress(_timer_doc(1, {BUCKET_MS: BUCKET_MS + 400}))
    assert await copy.sync.sync_once()  # the master's 43 and 45: ahead of this log too
    assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (1, 1)
    if how == "set_master":
        copy.sync.set_master("127.0.0.1:1")
    else:
        copy.sync.reset_held()  # an epoch change, the same master address
    assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (0, 0)
    copy.catch_up(broker)  # the log passes the old copies' offsets
    # The new master's first copy: the old one would have been merged here before it.
    assert not wheel.copy_progress(_timer_doc(1, {}))
    assert wheel.progress_doc()["watermarks"] == {}
    await copy.sync.stop()
    assert copy.offsets.query("GR", TOPIC, 0) is None


class ResettingMidRound(RemotingClient):
    """The epoch changes while a round's requests are out (failover.py's reset_held)."""

    def __init__(self) -> None:
        super().__init__()
        self.copy: Copy | None = None

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: float) -> RemotingCommand:
        answer = await super().invoke(addr, cmd, timeout_ms)
        if cmd.code == OFFSETS and self.copy is not None:
            self.copy.sync.reset_held()
        return answer


async def test_an_answer_of_a_round_begun_before_a_reset_is_dropped(
    tmp_path: Path, broker: Harness
) -> None:
    assert (await broker.send(TOPIC, b"m")).code == ResponseCode.SUCCESS
    broker.app.offsets.commit("GM", TOPIC, 0, 1)
    client = ResettingMidRound()
    async with slave_tables(tmp_path, broker.addr, client) as copy:
        client.copy = copy
        assert not await copy.sync.sync_once()
        assert (copy.sync.held(OFFSETS), copy.sync.held(DELAYS)) == (0, 0)
        client.copy = None
        copy.catch_up(broker)
        assert await copy.sync.sync_once()  # the next round copies as before
        assert copy.offsets.query("GM", TOPIC, 0) == 1


# -- (B) delay levels -----------------------------------------------------------------------------


class _Levels:
    """A delay level's queue on a real store, its ScheduleService loaded from `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = FakeClock()
        self.config = StoreConfig(root_dir=root / "store", commit_log_file_size=1024 * 1024)
        self.store = self.open_store()
        self.service = self.load()

    def open_store(self) -> FileMessageStore:
        store = FileMessageStore(self.config, self.clock)
        store.start()
        return store

    def load(self) -> ScheduleService:
        service = ScheduleService(self.store, (1_000,), self.clock, self.root / "config")
        service.load()
        return service

    def park(self) -> None:
        parked = park(_message(), {}, SCHEDULE_TOPIC_XXXX, 0, self.clock.now_ms() + 1_000)
        assert self.store.put_message(parked).ok

    def on_disk(self) -> dict[str, object]:
        doc: dict[str, object] = orjson.loads(
            (self.root / "config" / DELAY_OFFSET_FILE).read_bytes()
        )
        return doc

    def restart_cut_at(self, offset: int, *, persist: bool = True) -> None:
        if persist:
            self.service.persist()
        self.store.shutdown()
        assert truncate_store(self.config.root_dir, self.config, offset)
        self.store = self.open_store()
        self.service = self.load()


@pytest.fixture
def levels(tmp_path: Path) -> Iterator[_Levels]:
    tables = _Levels(tmp_path)
    yield tables
    tables.store.shutdown()


def test_delay_progress_past_a_cut_log_is_dropped_and_delivered_again(
    levels: _Levels, caplog: pytest.LogCaptureFixture
) -> None:
    levels.park()
    levels.clock.advance(1_000)
    cut = levels.store.max_physical_offset  # the re-stored message starts here
    levels.service.deliver_due()
    assert (levels.service.progress(1), levels.store.max_offset(TOPIC, 0)) == (1, 1)
    levels.service.persist()
    assert levels.on_disk()["logOffset"] == levels.store.max_physical_offset
    with caplog.at_level(logging.WARNING, logger="tidemq.broker.schedule"):
        levels.restart_cut_at(cut)  # the re-stored message is gone, the parked one is not
    assert f"the log ends at {cut}" in caplog.text
    assert levels.service.progress(1) == 0
    levels.service.deliver_due()
    assert (levels.service.delivered, levels.store.max_offset(TOPIC, 0)) == (1, 1)


def test_delay_progress_within_the_log_and_an_older_file_load_as_before(
    levels: _Levels,
) -> None:
    levels.park()
    levels.clock.advance(1_000)
    levels.service.deliver_due()
    levels.service.persist()
    levels.service = levels.load()
    assert levels.service.progress(1) == 1
    path = levels.root / "config" / DELAY_OFFSET_FILE
    path.write_bytes(orjson.dumps({"offsetTable": {"1": 1}}))  # no logOffset: as today
    levels.restart_cut_at(0, persist=False)
    assert levels.service.progress(1) == 1


def test_a_copied_delay_progress_covers_the_masters_log_offset(levels: _Levels) -> None:
    """A slave's log may be ahead of the copy it applied: what the copy covers is the master's
    offset, so a cut between the two keeps the progress."""
    levels.park()
    copied_at = levels.store.max_physical_offset
    levels.park()
    assert levels.service.replace_progress(b'{"offsetTable":{"1":1}}', copied_at)
    levels.service.persist_if_dirty()
    levels.service.persist()
    assert levels.on_disk()["logOffset"] == copied_at
    levels.restart_cut_at(copied_at)
    assert levels.service.progress(1) == 1
    levels.restart_cut_at(0)  # below the copy's offset
    assert levels.service.progress(1) == 0


# -- (B) the check-back's progress ----------------------------------------------------------------

SETTINGS = {"transactionTimeOut": "1", "transactionCheckInterval": "3600000"}


async def _prepare(broker: Harness, body: bytes) -> int:
    """A half message of PG_CUT; its physical offset."""
    at = broker.app.store.max_physical_offset
    props = {"TRAN_MSG": "true", "PGROUP": "PG_CUT"}
    sent = await broker.send(TOPIC, body, properties=props, sys_flag=SysFlag.PREPARED)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    return at


async def _commit(broker: Harness, half_at: int, queue_offset: int) -> None:
    header = EndTransactionRequestHeader(
        producer_group="PG_CUT",
        tran_state_table_offset=queue_offset,
        commit_log_offset=half_at,
        commit_or_rollback=8,
        msg_id="M",
    )
    request = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())
    answer = await broker.call(request)
    assert answer.code == ResponseCode.SUCCESS, answer.remark


def _check_offsets(broker: Harness) -> tuple[int | None, int | None]:
    offsets = broker.app.offsets
    return (
        offsets.query(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID),
        offsets.query(TRANS_CHECK_GROUP, hm.OP_TOPIC, hm.HALF_QUEUE_ID),
    )


async def test_check_back_progress_past_a_cut_log_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two committed transactions, the check-back's offsets past both; the log cut between the
    second's half and its op. The second must be pending again (checked back), the first must
    stay resolved (its op is in the log: never resolved twice)."""
    root = tmp_path / "broker"
    async with running_broker(root, **SETTINGS) as broker:
        first = await _prepare(broker, b"first")
        await _commit(broker, first, 0)
        second = await _prepare(broker, b"second")
        cut = broker.app.store.max_physical_offset  # the second's end: its real message, op
        await _commit(broker, second, 1)
        check_back = broker.app.check_back
        assert check_back is not None
        await check_back.run_once()
        assert _check_offsets(broker) == (2, 2)
        broker.app.offsets.commit("CG", TOPIC, 0, 1)  # another group's: kept
        config = store_config(broker.app.config)
        end = broker.app.store.max_physical_offset
    on_disk = orjson.loads((root / "config" / OFFSETS_FILE).read_bytes())
    assert on_disk["logOffset"] == end
    assert truncate_store(config.root_dir, config, cut)
    with caplog.at_level(logging.WARNING, logger="tidemq.broker.offsets"):
        async with running_broker(root, **SETTINGS) as broker:
            assert _check_offsets(broker) == (None, None)
            ledger = broker.app.transactions.ledger
            assert [p.physical_offset for p in ledger.pending_list()] == [second]
            assert ledger.in_flight == 1
            assert broker.app.offsets.query("CG", TOPIC, 0) == 1
    assert f"the log ends at {cut}" in caplog.text
    assert "its 2 offsets are dropped" in caplog.text


async def test_check_back_progress_within_the_log_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "broker"
    async with running_broker(root, **SETTINGS) as broker:
        first = await _prepare(broker, b"first")
        await _commit(broker, first, 0)
        check_back = broker.app.check_back
        assert check_back is not None
        await check_back.run_once()
        broker.app.offsets.commit("CG", TOPIC, 0, 1)
    async with running_broker(root, **SETTINGS) as broker:
        assert _check_offsets(broker) == (1, 1)
        assert broker.app.offsets.query("CG", TOPIC, 0) == 1
        assert broker.app.transactions.ledger.in_flight == 0


async def test_a_slave_persists_the_log_offset_of_the_copy_it_applied(
    copy: Copy, broker: Harness, tmp_path: Path
) -> None:
    """SlaveSync passes the copy's "tidemqLogOffset" on: the slave's log grown past it since
    does not raise what the copied progress covers."""
    assert (await broker.send(TOPIC, b"m")).code == ResponseCode.SUCCESS
    broker.app.schedule.replace_progress(b'{"offsetTable":{"1":1}}')
    broker.app.offsets.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID, 0)
    copied_at = broker.app.store.max_physical_offset
    assert await copy.round(broker)
    assert copy.schedule.progress(1) == 1
    assert (await broker.send(TOPIC, b"n")).code == ResponseCode.SUCCESS
    copy.catch_up(broker)
    assert copy.store.max_physical_offset > copied_at
    copy.schedule.persist()
    on_disk = orjson.loads((tmp_path / "config" / DELAY_OFFSET_FILE).read_bytes())
    assert on_disk["logOffset"] == copied_at


def test_the_check_progress_covers_its_copy_or_the_log_end_when_moved_here(
    tmp_path: Path,
) -> None:
    end = [500]
    table = ConsumerOffsetTable(tmp_path, log_end=lambda: end[0])
    key = f"{hm.HALF_TOPIC}@{TRANS_CHECK_GROUP}"

    def persisted() -> int:
        table.persist()
        covered: int = orjson.loads((tmp_path / OFFSETS_FILE).read_bytes())["logOffset"]
        return covered

    assert persisted() == 500
    table.copy_from_master(orjson.dumps({"offsetTable": {key: {"0": 3}}}), 300)
    assert persisted() == 300
    table.commit("CG", TOPIC, 0, 1)  # another group's commit: not the check-back's progress
    table.copy_from_master(orjson.dumps({"offsetTable": {"T@CG": {"0": 1}}}), 400)
    assert persisted() == 300
    for log_end, kept in ((300, 3), (299, None)):
        end[0] = log_end
        again = ConsumerOffsetTable(tmp_path, log_end=lambda: end[0])
        again.load()
        assert again.query(TRANS_CHECK_GROUP, hm.HALF_TOPIC, 0) == kept
        assert again.query("CG", "T", 0) == 1
    end[0] = 500
    table.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, 0, 4)  # the check-back moved it here
    assert persisted() == 500
