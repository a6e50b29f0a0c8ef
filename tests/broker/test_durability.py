"""Durability: the flush and a SYNC_MASTER's slave ack, waited at once; the codes and remarks
each answer gets; the sends' answers under each rule; the fast path costs ASYNC_MASTER sends
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from broker_harness import messages, running_broker

from tidemq.broker.durability import Durability, flush_timeout_remark
from tidemq.broker.flush import FlushService
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import SendMessageResponseHeader
from tidemq.protocol.message import BatchItem, encode_batch

SECRET = "durability-test-secret"


class Acks:
    """A stand-in HA master: records each wait; answers with `code` (None: keeps it)."""

    def __init__(self, code: int | None = ResponseCode.SUCCESS) -> None:
        self.code = code
        self.ends: list[int] = []
        self.held: list[Callable[[int], None]] = []

    def on_acked(self, end: int, callback: Callable[[int], None]) -> None:
        self.ends.append(end)
        if self.code is None:
            self.held.append(callback)
        else:
            callback(self.code)


def flush_service(*, sync: bool, flushed: Callable[[], int] = lambda: 1 << 40) -> FlushService:
    return FlushService(flushed, sync=sync, interval_ms=10_000, sync_timeout_ms=50)


async def outcome(durability: Durability, end: int) -> tuple[int, str]:
    got: list[tuple[int, str]] = []
    durability.on_durable(end, lambda code, remark: got.append((code, remark)))
    for _ in range(200):
        if got:
            break
        await asyncio.sleep(0.005)
    (answer,) = got
    assert await durability.wait_durable(end) == answer
    return answer


async def test_async_master_and_async_flush_wait_for_nothing() -> None:
    flush = flush_service(sync=False)
    acks = Acks()
    durability = Durability(flush, acks, sync_master=False)
    assert not durability.waits
    assert await outcome(durability, 100) == (ResponseCode.SUCCESS, "")
    assert acks.ends == []


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (ResponseCode.SUCCESS, ""),
        (ResponseCode.FLUSH_SLAVE_TIMEOUT, "no slave acknowledged it within 5000 ms"),
        (ResponseCode.SLAVE_NOT_AVAILABLE, "no slave is in sync"),
    ],
)
async def test_sync_master_answers_what_the_slave_ack_says(code: int, needle: str) -> None:
    acks = Acks(code)
    durability = Durability(flush_service(sync=False), acks, sync_master=True)
    assert durability.waits
    answer, remark = await outcome(durability, 123)
    assert answer == code
    assert needle in remark
    assert (not remark) == (code == ResponseCode.SUCCESS)
    assert acks.ends == [123, 123]


async def test_sync_master_without_an_ha_master_answers_slave_not_available() -> None:
    durability = Durability(flush_service(sync=False), None, sync_master=True)
    code, remark = await outcome(durability, 1)
    assert code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert "stored on the master" in remark


class Flushes:
    """A stand-in SYNC_FLUSH FlushService: holds each wait until the test answers it."""

    sync = True

    def __init__(self) -> None:
        self.held: list[Callable[[bool], None]] = []

    def on_flushed(self, end: int, callback: Callable[[bool], None]) -> None:
        self.held.append(callback)


def both_waits(acks: Acks) -> tuple[Flushes, Durability, list[tuple[int, str]]]:
    """SYNC_FLUSH + SYNC_MASTER with both waits held; a send at end 77 waiting."""
    flushes = Flushes()
    durability = Durability(cast(FlushService, flushes), acks, sync_master=True)
    got: list[tuple[int, str]] = []
    durability.on_durable(77, lambda code, remark: got.append((code, remark)))
    return flushes, durability, got


async def test_the_flush_and_the_ack_are_waited_at_once() -> None:
    """Both waits start together: a send waits syncFlushTimeout at most, not twice over."""
    acks = Acks(None)
    flushes, _, got = both_waits(acks)
    assert len(flushes.held) == 1
    assert acks.ends == [77]  # asked before the flush is in
    acks.held[0](ResponseCode.SUCCESS)
    assert got == []  # the slave has it, the disk not yet
    flushes.held[0](True)
    assert got == [(ResponseCode.SUCCESS, "")]


async def test_a_slave_code_waits_for_the_flush() -> None:
    acks = Acks(None)
    flushes, _, got = both_waits(acks)
    acks.held[0](ResponseCode.FLUSH_SLAVE_TIMEOUT)
    assert got == []
    flushes.held[0](True)
    ((code, remark),) = got
    assert code == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert "no slave acknowledged it" in remark


@pytest.mark.parametrize("ack_first", [True, False])
async def test_a_flush_failure_takes_precedence_over_the_slave(ack_first: bool) -> None:
    acks = Acks(None)
    flushes, _, got = both_waits(acks)
    if ack_first:
        acks.held[0](ResponseCode.SUCCESS)
        flushes.held[0](False)
    else:
        flushes.held[0](False)
        assert len(got) == 1  # answered at once, the slave's answer is not waited for
        acks.held[0](ResponseCode.SUCCESS)
    assert got == [(ResponseCode.FLUSH_DISK_TIMEOUT, flush_timeout_remark(5_000))]


async def test_a_flush_that_fails_at_once_does_not_ask_the_slave() -> None:
    flushes = Flushes()
    flushes.on_flushed = lambda end, callback: callback(False)  # type: ignore[method-assign]
    acks = Acks()
    durability = Durability(cast(FlushService, flushes), acks, sync_master=True)
    assert await outcome(durability, 10) == (
        ResponseCode.FLUSH_DISK_TIMEOUT,
        flush_timeout_remark(5_000),
    )
    assert acks.ends == []


async def test_a_real_flush_that_times_out_answers_flush_disk_timeout() -> None:
    flush = flush_service(sync=True, flushed=lambda: 0)  # the log never gets flushed
    flush.start()
    acks = Acks(None)
    try:
        durability = Durability(flush, acks, sync_master=True, sync_flush_timeout_ms=50)
        code, remark = await outcome(durability, 10)
    finally:
        await flush.stop()
    assert code == ResponseCode.FLUSH_DISK_TIMEOUT
    assert remark == "stored, but not flushed within 50 ms"


async def test_sync_flush_and_the_ack() -> None:
    flush = flush_service(sync=True)
    flush.start()
    acks = Acks(None)
    try:
        durability = Durability(flush, acks, sync_master=True)
        got: list[tuple[int, str]] = []
        durability.on_durable(77, lambda code, remark: got.append((code, remark)))
        assert acks.ends == [77]
        acks.held[0](ResponseCode.SUCCESS)
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.005)
        assert got == [(ResponseCode.SUCCESS, "")]
    finally:
        await flush.stop()


async def test_a_failing_waiter_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    durability = Durability(flush_service(sync=False), Acks(), sync_master=True)

    def boom(code: int, remark: str) -> None:
        raise RuntimeError("waiter bug")

    durability.on_durable(5, boom)
    assert "durability waiter" in caplog.text


# -- the sends' answers --------------------------------------------------------------------------


async def test_a_sync_master_without_slave_stores_and_answers_slave_not_available(
    tmp_path: Path,
) -> None:
    """As upstream: the message is stored on the master; the code tells the producer that no
    slave has it (single sends are coalesced, batches are not: both answer so)."""
    settings = {"brokerRole": "SYNC_MASTER", "haSecret": SECRET}
    async with running_broker(tmp_path, **settings) as broker:
        single = await broker.send("TopicSync", b"one")
        assert single.code == ResponseCode.SLAVE_NOT_AVAILABLE, single.remark
        assert "stored on the master" in (single.remark or "")
        header = SendMessageResponseHeader.from_fields(single.ext_fields)
        assert header.msg_id
        assert header.queue_offset == 0
        items = [BatchItem(flag=0, body=b"b%d" % i, properties="") for i in range(2)]
        batch = await broker.send(
            "TopicSync", encode_batch(items), code=RequestCode.SEND_BATCH_MESSAGE, batch=True
        )
        assert batch.code == ResponseCode.SLAVE_NOT_AVAILABLE, batch.remark
        assert SendMessageResponseHeader.from_fields(batch.ext_fields).queue_offset == 1
        pulled = await broker.pull("TopicSync")
        assert [m.body for m in messages(pulled)] == [b"one", b"b0", b"b1"]
        info = broker.app.replication.runtime_fields()
        assert info == {"haSlaveCount": "0", "haSlaves": ""}


async def test_the_async_master_fast_path_never_calls_durability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: Durability, end: int, callback: object) -> None:
        raise AssertionError("ASYNC_MASTER + ASYNC_FLUSH sends must not wait on durability")

    async def boom_async(self: Durability, end: int) -> tuple[int, str]:
        raise AssertionError("ASYNC_MASTER + ASYNC_FLUSH sends must not wait on durability")

    monkeypatch.setattr(Durability, "on_durable", boom)
    monkeypatch.setattr(Durability, "wait_durable", boom_async)
    async with running_broker(tmp_path) as broker:
        assert broker.app.durability is not None
        assert not broker.app.durability.waits
        answers = await asyncio.gather(*(broker.send("TopicFast", b"%d" % i) for i in range(20)))
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
