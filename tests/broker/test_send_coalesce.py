"""Single sends of one loop turn are stored with one store call and answered each on its own.

Frames are written from raw sockets without yielding in between, so the broker (same event loop)
reads them all in one loop turn: several frames of one read (up to remoting's TURN_BUDGET
of them start in that turn), or one frame on each of several connections.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from broker_harness import Harness, messages, running_broker

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import (
    FLAG_ONEWAY,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    encode,
)
from tidemq.protocol.headers import (
    DeleteTopicRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
)
from tidemq.protocol.message import (
    BatchItem,
    decode_offset_msg_id,
    encode_batch,
    encode_properties,
)
from tidemq.protocol.record import StoredMessage, decode_records
from tidemq.remoting import TURN_BUDGET
from tidemq.store.types import MessageToStore, PutResult

TOPIC = "TopicCoalesce"


def _frame(
    opaque: int,
    body: bytes,
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    properties: dict[str, str] | None = None,
    batch: bool = False,
    oneway: bool = False,
    binary: bool = False,
) -> bytes:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        queue_id=queue_id,
        born_timestamp=1,
        properties=encode_properties(properties or {"UNIQ_KEY": f"U{opaque}"}),
        batch=batch,
    )
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    command = RemotingCommand(
        code=code,
        opaque=opaque,
        flag=FLAG_ONEWAY if oneway else 0,
        ext_fields=header.to_fields(v2=True),
        body=body,
        serialize_type=SerializeType.ROCKETMQ if binary else SerializeType.JSON,
    )
    return encode(command)


class _Peer:
    """A raw connection: frames written at once, responses read and decoded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()

    async def responses(self, count: int) -> dict[int, RemotingCommand]:
        got: dict[int, RemotingCommand] = {}
        async with asyncio.timeout(5):
            while len(got) < count:
                data = await self.reader.read(65536)
                assert data, "connection closed"
                got.update((r.opaque, r) for r in self.decoder.feed(data))
        return got


@pytest.fixture
async def peers(broker: Harness) -> AsyncIterator[Callable[[int], Any]]:
    opened: list[_Peer] = []

    async def open_peers(count: int) -> list[_Peer]:
        host, port = broker.addr.split(":")
        for _ in range(count):
            opened.append(_Peer(*await asyncio.open_connection(host, int(port))))
        return opened[-count:]

    yield open_peers
    for peer in opened:
        peer.writer.close()


def _count_puts(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the store's put_each calls from now on."""
    store = harness.app.store
    real = store.put_each
    calls: list[int] = []

    def counted(msgs: Sequence[MessageToStore]) -> list[PutResult]:
        calls.append(len(msgs))
        return real(msgs)

    monkeypatch.setattr(store, "put_each", counted)
    return calls


async def _create_topic(broker: Harness) -> None:
    assert (await broker.send(TOPIC, b"first", code=RequestCode.SEND_MESSAGE_V2)).code == 0


async def test_pipelined_sends_of_one_turn_are_one_put(
    broker: Harness, peers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _create_topic(broker)
    calls = _count_puts(broker, monkeypatch)
    (peer,) = await peers(1)
    peer.writer.write(b"".join(_frame(n, b"m%d" % n) for n in range(32)))
    got = await peer.responses(32)
    # One read of 32 sends starts them in two loop turns (remoting's TURN_BUDGET, then
    # twice that): one put per turn.
    assert calls == [TURN_BUDGET, 32 - TURN_BUDGET]
    assert {r.code for r in got.values()} == {ResponseCode.SUCCESS}
    # Arrival order is queue order: request n got queue offset n + 1 (after "first").
    assert [int(got[n].ext_fields["queueOffset"]) for n in range(32)] == list(range(1, 33))
    stored = messages(await broker.pull(TOPIC, max_msgs=64))
    assert [m.body for m in stored] == [b"first"] + [b"m%d" % n for n in range(32)]
    offsets = [decode_offset_msg_id(got[n].ext_fields["msgId"])[2] for n in range(32)]
    assert offsets == [m.physical_offset for m in stored[1:]]
    server = broker.app._server
    assert server is not None
    assert [c.in_flight for c in server.connections] == [0] * len(server.connections)


async def test_binary_and_json_requests_are_answered_in_kind(broker: Harness, peers: Any) -> None:
    await _create_topic(broker)
    (peer,) = await peers(1)
    peer.writer.write(_frame(0, b"json") + _frame(1, b"binary", binary=True))
    got = await peer.responses(2)
    assert [got[n].serialize_type for n in (0, 1)] == [SerializeType.JSON, SerializeType.ROCKETMQ]
    assert [got[n].code for n in (0, 1)] == [ResponseCode.SUCCESS] * 2
    assert [got[n].ext_fields["queueOffset"] for n in (0, 1)] == ["1", "2"]
    assert got[0].ext_fields.keys() == got[1].ext_fields.keys()


async def test_sends_from_many_connections_share_one_put(
    broker: Harness, peers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _create_topic(broker)
    opened = await peers(8)
    calls = _count_puts(broker, monkeypatch)
    for n, peer in enumerate(opened):
        peer.writer.write(_frame(n, b"c%d" % n))
    answers = [await peer.responses(1) for peer in opened]
    assert calls == [8]
    assert all(a[n].code == ResponseCode.SUCCESS for n, a in enumerate(answers))
    offsets = sorted(int(a[n].ext_fields["queueOffset"]) for n, a in enumerate(answers))
    assert offsets == list(range(1, 9))


async def test_a_refusal_answers_only_its_own_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path / "store", maxMessageSize="1000") as broker:
        await _create_topic(broker)
        calls = _count_puts(broker, monkeypatch)
        host, port = broker.addr.split(":")
        peer = _Peer(*await asyncio.open_connection(host, int(port)))
        frames = [
            _frame(0, b"good0"),
            _frame(1, b"x" * 2000),  # the handler refuses: over maxMessageSize
            _frame(2, b"good2"),
            _frame(3, b"bad", topic="bad topic!"),  # the handler refuses: illegal name
            _frame(4, b"big", properties={"p": "v" * 40_000}),  # the store refuses
            _frame(5, b"good5"),
        ]
        peer.writer.write(b"".join(frames))
        got = await peer.responses(6)
        peer.writer.close()
        assert calls == [4]  # the three good ones and the one the store refuses
        assert [got[n].code for n in (0, 2, 5)] == [ResponseCode.SUCCESS] * 3
        assert [got[n].ext_fields["queueOffset"] for n in (0, 2, 5)] == ["1", "2", "3"]
        assert got[1].code == ResponseCode.MESSAGE_ILLEGAL
        assert got[3].code == ResponseCode.SYSTEM_ERROR
        assert got[4].code == ResponseCode.MESSAGE_ILLEGAL
        assert "PROPERTIES_SIZE_EXCEEDED" in (got[4].remark or "")
        stored = messages(await broker.pull(TOPIC))
        assert [m.body for m in stored] == [b"first", b"good0", b"good2", b"good5"]


async def test_batch_between_singles_keeps_arrival_order(broker: Harness, peers: Any) -> None:
    await _create_topic(broker)
    (peer,) = await peers(1)
    batch = encode_batch([BatchItem(0, b, encode_properties({})) for b in (b"C", b"D")])
    peer.writer.write(
        _frame(0, b"A") + _frame(1, b"B") + _frame(2, batch, batch=True) + _frame(3, b"E")
    )
    got = await peer.responses(4)
    assert {r.code for r in got.values()} == {ResponseCode.SUCCESS}
    stored = messages(await broker.pull(TOPIC))
    assert [m.body for m in stored] == [b"first", b"A", b"B", b"C", b"D", b"E"]


async def test_delayed_send_keeps_its_own_path(broker: Harness, peers: Any) -> None:
    await _create_topic(broker)
    (peer,) = await peers(1)
    peer.writer.write(
        _frame(0, b"plain") + _frame(1, b"later", properties={"DELAY": "3"}) + _frame(2, b"p2")
    )
    got = await peer.responses(3)
    assert {r.code for r in got.values()} == {ResponseCode.SUCCESS}
    stored = messages(await broker.pull(TOPIC))
    assert [m.body for m in stored] == [b"first", b"plain", b"p2"]
    parked = messages(await broker.pull("SCHEDULE_TOPIC_XXXX", queue_id=2))
    assert [m.body for m in parked] == [b"later"]


async def test_oneway_send_is_stored_and_not_answered(broker: Harness, peers: Any) -> None:
    await _create_topic(broker)
    (peer,) = await peers(1)
    peer.writer.write(_frame(0, b"oneway", oneway=True) + _frame(1, b"answered"))
    got = await peer.responses(1)
    assert list(got) == [1]
    stored = messages(await broker.pull(TOPIC))
    assert [m.body for m in stored] == [b"first", b"oneway", b"answered"]


async def test_sync_flush_group_waits_as_one_flush_waiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path / "store", flushDiskType="SYNC_FLUSH") as broker:
        await _create_topic(broker)
        flush = broker.app.flush
        assert flush is not None
        real = flush.on_flushed
        ends: list[int] = []

        def counted(end: int, callback: Callable[[bool], None]) -> None:
            ends.append(end)
            real(end, callback)

        monkeypatch.setattr(flush, "on_flushed", counted)
        host, port = broker.addr.split(":")
        peer = _Peer(*await asyncio.open_connection(host, int(port)))
        peer.writer.write(b"".join(_frame(n, b"s%d" % n) for n in range(16)))
        got = await peer.responses(16)
        peer.writer.close()
        assert {r.code for r in got.values()} == {ResponseCode.SUCCESS}
        assert len(ends) == 1
        assert broker.app.store.flushed_physical_offset >= ends[0]


async def test_sync_flush_timeout_answers_every_send_of_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "100"}
    async with running_broker(tmp_path / "store", **settings) as broker:
        await _create_topic(broker)
        flush = broker.app.flush
        assert flush is not None
        gate = threading.Event()
        real = flush._flush_log

        def stuck() -> int:
            gate.wait(5)
            return real()

        monkeypatch.setattr(flush, "_flush_log", stuck)
        host, port = broker.addr.split(":")
        peer = _Peer(*await asyncio.open_connection(host, int(port)))
        try:
            peer.writer.write(b"".join(_frame(n, b"t%d" % n) for n in range(4)))
            got = await peer.responses(4)
        finally:
            gate.set()
            peer.writer.close()
        assert {r.code for r in got.values()} == {ResponseCode.FLUSH_DISK_TIMEOUT}
        assert [got[n].ext_fields["queueOffset"] for n in range(4)] == ["1", "2", "3", "4"]
        assert "not flushed within 100 ms" in (got[0].remark or "")


# -- transactional sends join the group as their half messages ----------------------------------

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"


def _halves(broker: Harness) -> list[StoredMessage]:
    """The half queue's records, read from the store (a consumer cannot pull a system topic)."""
    return decode_records(b"".join(broker.app.store.get_messages(HALF_TOPIC, 0, 0, 32).records))


def _half(opaque: int, body: bytes, **extra: str) -> bytes:
    properties = {"UNIQ_KEY": f"TX{opaque}", "TRAN_MSG": "true", **extra}
    return _frame(opaque, body, queue_id=2, properties=properties)


async def _commit(broker: Harness, answer: RemotingCommand, uniq_key: str) -> None:
    header = EndTransactionRequestHeader(
        producer_group="PG",
        tran_state_table_offset=int(answer.ext_fields["queueOffset"]),
        commit_log_offset=decode_offset_msg_id(answer.ext_fields["msgId"])[2],
        commit_or_rollback=8,
        msg_id=uniq_key,
    )
    end = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())
    assert (await broker.call(end)).code == ResponseCode.SUCCESS


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_half_sends_share_the_put_and_are_answered_with_the_real_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    async with running_broker(tmp_path / "store", flushDiskType=flush) as broker:
        await _create_topic(broker)
        calls = _count_puts(broker, monkeypatch)
        host, port = broker.addr.split(":")
        peer = _Peer(*await asyncio.open_connection(host, int(port)))
        peer.writer.write(
            _frame(0, b"plain0") + _half(1, b"half1") + _half(2, b"half2") + _frame(3, b"plain3")
        )
        got = await peer.responses(4)
        peer.writer.close()
        assert calls == [4]
        assert {r.code for r in got.values()} == {ResponseCode.SUCCESS}
        assert [got[n].ext_fields["queueId"] for n in range(4)] == ["0", "2", "2", "0"]
        # Plain sends count in their queue, halves in the half queue.
        assert [got[n].ext_fields["queueOffset"] for n in range(4)] == ["1", "0", "1", "2"]
        halves = _halves(broker)
        assert [m.body for m in halves] == [b"half1", b"half2"]
        assert [decode_offset_msg_id(got[n].ext_fields["msgId"])[2] for n in (1, 2)] == [
            m.physical_offset for m in halves
        ]
        for half in halves:
            props = half.property_map()
            assert (props["REAL_TOPIC"], props["REAL_QID"], props["PGROUP"]) == (TOPIC, "2", "PG")
        stored = messages(await broker.pull(TOPIC))
        assert [m.body for m in stored] == [b"first", b"plain0", b"plain3"]
        transactions = broker.app.transactions
        assert transactions.ledger.in_flight == 2
        assert transactions.stats.prepared == 2
        # Tracked before it was answered: its END finds it (from memory, as put).
        await _commit(broker, got[2], "TX2")
        committed = messages(await broker.pull(TOPIC, queue_id=2))
        assert [m.body for m in committed] == [b"half2"]
        assert committed[0].property_map()["UNIQ_KEY"] == "TX2"
        assert transactions.ledger.in_flight == 1


async def test_a_half_refused_by_the_store_names_its_real_topic(
    broker: Harness, peers: Any
) -> None:
    await _create_topic(broker)
    (peer,) = await peers(1)
    peer.writer.write(_half(0, b"big", p="v" * 40_000) + _half(1, b"fine"))
    got = await peer.responses(2)
    assert got[0].code == ResponseCode.MESSAGE_ILLEGAL
    remark = got[0].remark or ""
    assert f"store refused the message to {TOPIC}:" in remark
    assert "PROPERTIES_SIZE_EXCEEDED" in remark
    assert got[1].code == ResponseCode.SUCCESS
    assert got[1].ext_fields["queueOffset"] == "0"
    assert broker.app.transactions.ledger.in_flight == 1


async def test_halves_beyond_the_in_flight_limit_are_busy(broker: Harness, peers: Any) -> None:
    await _create_topic(broker)
    broker.app.transactions.ledger.in_flight_max = 1
    (peer,) = await peers(1)
    peer.writer.write(_half(0, b"one"))
    assert (await peer.responses(1))[0].code == ResponseCode.SUCCESS
    peer.writer.write(_half(1, b"two") + _frame(2, b"plain"))
    got = await peer.responses(2)
    assert got[1].code == ResponseCode.SYSTEM_BUSY
    assert "[TRANSACTIONS_BUSY]" in (got[1].remark or "")
    assert got[2].code == ResponseCode.SUCCESS
    assert [m.body for m in _halves(broker)] == [b"one"]


async def test_a_failure_after_storing_a_half_answers_only_that_send(
    broker: Harness, peers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _create_topic(broker)

    def broken(half: MessageToStore, result: PutResult) -> None:
        raise RuntimeError("ledger broke")

    monkeypatch.setattr(broker.app.transactions, "half_stored", broken)
    (peer,) = await peers(1)
    peer.writer.write(_frame(0, b"p0") + _half(1, b"h1") + _frame(2, b"p2"))
    got = await peer.responses(3)
    assert [got[n].code for n in range(3)] == [
        ResponseCode.SUCCESS,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SUCCESS,
    ]
    assert got[1].remark == "ledger broke"
    assert [got[n].ext_fields["queueOffset"] for n in (0, 2)] == ["1", "2"]


async def test_sends_before_a_topic_deletion_in_the_same_turn_go_with_the_topic(
    broker: Harness, peers: Any
) -> None:
    # The deletion stores the pending group first (the topic table's change listener), so the
    # sends are answered and deleted with the topic instead of recreating its queue afterwards.
    await _create_topic(broker)
    (peer,) = await peers(1)
    delete = RemotingCommand(
        code=RequestCode.DELETE_TOPIC_IN_BROKER,
        opaque=99,
        ext_fields=DeleteTopicRequestHeader(topic=TOPIC).to_fields(),
    )
    peer.writer.write(_frame(0, b"a") + _frame(1, b"b") + encode(delete))
    got = await peer.responses(3)
    assert [got[n].code for n in (0, 1, 99)] == [ResponseCode.SUCCESS] * 3
    assert TOPIC not in broker.app.store.topics_and_queues()
