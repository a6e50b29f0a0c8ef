"""END_TRANSACTION (37) handler branches, called with real headers over a real store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest
from tx_harness import GROUP, FakeProducer, World

from tidemq.broker.config import BrokerConfig
from tidemq.broker.durability import LEASE_LOST_REMARK, Durability, Fence, WaitDurable
from tidemq.broker.flush import FlushService
from tidemq.broker.handlers.end_transaction import EndTransactionHandler
from tidemq.broker.transaction import half as hm
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.types import PutResult
from tidemq.testing import eventually

NOT, COMMIT, ROLLBACK = 0, 8, 12


class Flush:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.ends: list[int] = []

    async def __call__(self, end: int) -> tuple[int, str]:
        self.ends.append(end)
        if self.ok:
            return ResponseCode.SUCCESS, ""
        return ResponseCode.FLUSH_DISK_TIMEOUT, "stored, but not flushed within 5000 ms"


class GroupAcks:
    """A stand-in HA master in controller mode (durability.AckSource): answers each wait with
    the next of `codes`, then holds the waits for the test to answer (`held`)."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.ends: list[int] = []
        self.held: list[Callable[[int], None]] = []

    def on_acked(self, end: int, callback: Callable[[int], None]) -> None:
        self.ends.append(end)
        if self.codes:
            callback(self.codes.pop(0))
        else:
            self.held.append(callback)


def group_durability(acks: GroupAcks, lease: Fence = lambda: True) -> Durability:
    """A real controller-mode Durability (the sync set's acks, the lease fence) over a real
    FlushService (ASYNC_FLUSH: the acks decide)."""
    flush = FlushService(lambda: 1 << 40, sync=False, interval_ms=10_000, sync_timeout_ms=50)
    return Durability(flush, acks, sync_master=False, group=True, fence=lease)


async def call(
    world: World,
    put: PutResult,
    action: int,
    *,
    group: str = GROUP,
    table_offset: int | None = None,
    commit_log_offset: int | None = None,
    config: BrokerConfig | None = None,
    flush: WaitDurable | None = None,
    from_check: bool = False,
) -> RemotingCommand | None:
    handler = EndTransactionHandler(config or BrokerConfig(), world.resolver, flush or Flush())
    table = HandlerTable()
    handler.register(table)
    header = EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=put.queue_offset if table_offset is None else table_offset,
        commit_log_offset=put.physical_offset if commit_log_offset is None else commit_log_offset,
        commit_or_rollback=action,
        from_transaction_check=from_check,
        msg_id="MSGID",
    )
    request = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())
    run = table.get(RequestCode.END_TRANSACTION)
    assert run is not None
    return await run(cast(Connection, FakeProducer("peer")), request)


def code_of(response: RemotingCommand | None) -> int:
    assert response is not None
    return response.code


async def test_commit_answers_success_after_the_flush(world: World) -> None:
    put = world.prepare(b"x")
    flush = Flush()
    assert code_of(await call(world, put, COMMIT, flush=flush)) == ResponseCode.SUCCESS
    (real,) = world.real_messages()
    assert flush.ends == [real.physical_offset + real.total_size]


async def test_commit_not_flushed_in_time(world: World) -> None:
    put = world.prepare()
    response = await call(world, put, COMMIT, flush=Flush(ok=False))
    assert code_of(response) == ResponseCode.FLUSH_DISK_TIMEOUT
    assert len(world.real_messages()) == 1


async def test_rollback(world: World) -> None:
    put = world.prepare()
    assert code_of(await call(world, put, ROLLBACK)) == ResponseCode.SUCCESS
    assert world.real_messages() == []
    assert world.op_origins() == [0]


async def test_not_gets_no_response_and_changes_nothing(world: World) -> None:
    put = world.prepare()
    assert await call(world, put, NOT) is None
    assert await call(world, put, NOT, from_check=True) is None
    assert world.op_origins() == []


async def test_double_commit_is_success_without_a_second_message(world: World) -> None:
    put = world.prepare()
    assert code_of(await call(world, put, COMMIT)) == ResponseCode.SUCCESS
    flush = Flush()
    assert code_of(await call(world, put, COMMIT, flush=flush)) == ResponseCode.SUCCESS
    # Its end is not tracked: the log end, which covers the first COMMIT's, is awaited.
    assert flush.ends == [world.store.max_physical_offset]
    assert len(world.real_messages()) == 1


async def test_a_repeat_after_a_timed_out_commit_waits_for_durability(world: World) -> None:
    """A COMMIT answered FLUSH_SLAVE_TIMEOUT is resolved here but perhaps on no other replica:
    a repeat answered SUCCESS at once would tell the producer of a commit that a failover to
    such a replica loses. The repeat answers once the log holding the commit is acknowledged."""
    put = world.prepare()
    acks = GroupAcks(ResponseCode.FLUSH_SLAVE_TIMEOUT)
    durability = group_durability(acks)
    first = await call(world, put, COMMIT, flush=durability.wait_durable)
    assert code_of(first) == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert first is not None
    assert (first.remark or "").startswith("COMMITTED: stored on the master, but not every")
    repeat = asyncio.ensure_future(call(world, put, COMMIT, flush=durability.wait_durable))
    await eventually(lambda: bool(acks.held) or repeat.done(), what="the repeat's wait")
    assert not repeat.done()
    (real,) = world.real_messages()
    assert acks.ends[1] >= real.physical_offset + real.total_size
    acks.held[0](ResponseCode.SUCCESS)
    assert code_of(await repeat) == ResponseCode.SUCCESS
    assert len(world.real_messages()) == 1


async def test_a_rollback_and_its_repeat_are_not_success_before_durable(world: World) -> None:
    """A ROLLBACK's op message tracks no end: the log end is awaited (and fenced), for the
    first ROLLBACK and for its repeats alike."""
    put = world.prepare()
    lease = [True]
    acks = GroupAcks(ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT)
    durability = group_durability(acks, lambda: lease[0])
    first = await call(world, put, ROLLBACK, flush=durability.wait_durable)
    assert code_of(first) == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert first is not None
    assert (first.remark or "").startswith("ROLLED_BACK: ")
    (op,) = world.records(hm.OP_TOPIC)
    assert acks.ends == [op.physical_offset + op.total_size]
    again = await call(world, put, ROLLBACK, flush=durability.wait_durable)
    assert code_of(again) == ResponseCode.FLUSH_SLAVE_TIMEOUT
    acks.codes = [ResponseCode.SUCCESS, ResponseCode.SUCCESS]
    lease[0] = False
    lost = await call(world, put, ROLLBACK, flush=durability.wait_durable)
    assert code_of(lost) == ResponseCode.SERVICE_NOT_AVAILABLE
    assert lost is not None
    assert LEASE_LOST_REMARK in (lost.remark or "")
    lease[0] = True
    assert code_of(await call(world, put, ROLLBACK, flush=durability.wait_durable)) == (
        ResponseCode.SUCCESS
    )
    assert world.op_origins() == [0]


async def test_commit_after_rollback_is_refused_clearly(world: World) -> None:
    put = world.prepare()
    await call(world, put, ROLLBACK)
    response = await call(world, put, COMMIT)
    assert code_of(response) == ResponseCode.TRANSACTION_FAILED
    assert response is not None
    assert "already ROLLED_BACK" in (response.remark or "")
    assert world.real_messages() == []


async def test_rollback_after_commit_is_refused_clearly(world: World) -> None:
    put = world.prepare()
    await call(world, put, COMMIT)
    response = await call(world, put, ROLLBACK, from_check=True)
    assert code_of(response) == ResponseCode.TRANSACTION_FAILED
    assert response is not None
    assert "already COMMITTED" in (response.remark or "")


@pytest.mark.parametrize(
    ("kwargs", "remark"),
    [
        ({"group": "OTHER"}, "The producer group wrong"),
        ({"table_offset": 5}, "The transaction state table offset wrong"),
        ({"commit_log_offset": 3}, "Find prepared transaction message failed"),
        ({"commit_log_offset": 10**9}, "Find prepared transaction message failed"),
    ],
)
async def test_mismatches_are_refused_with_the_upstream_remarks(
    world: World, kwargs: dict[str, object], remark: str
) -> None:
    put = world.prepare()
    response = await call(world, put, COMMIT, **kwargs)  # type: ignore[arg-type]
    assert code_of(response) == ResponseCode.SYSTEM_ERROR
    assert response is not None
    assert response.remark == remark
    assert world.real_messages() == []


async def test_a_real_topic_record_is_not_a_half_message(world: World) -> None:
    put = world.prepare()
    await call(world, put, COMMIT)
    (real,) = world.real_messages()
    response = await call(world, put, COMMIT, commit_log_offset=real.physical_offset)
    assert code_of(response) == ResponseCode.SYSTEM_ERROR


async def test_slave_answers_slave_not_available(world: World) -> None:
    put = world.prepare()
    slave = BrokerConfig(broker_id=1, broker_role="SLAVE", ha_secret="s" * 16)
    assert code_of(await call(world, put, COMMIT, config=slave)) == ResponseCode.SLAVE_NOT_AVAILABLE
    assert world.real_messages() == []


async def test_unknown_action_value_is_refused(world: World) -> None:
    put = world.prepare()
    assert code_of(await call(world, put, 4)) == ResponseCode.SYSTEM_ERROR


async def test_store_refusal_is_answered_with_its_code(world: World) -> None:
    committed, rolled = world.prepare(b"c"), world.prepare(b"r")
    world.disk_full = True
    world.clock.advance(1_001)
    response = await call(world, committed, COMMIT)
    assert code_of(response) == ResponseCode.SERVICE_NOT_AVAILABLE
    assert code_of(await call(world, rolled, ROLLBACK)) == ResponseCode.SERVICE_NOT_AVAILABLE
    assert world.ledger.pending(committed.queue_offset) is not None  # still unresolved
    world.disk_full = False
    world.clock.advance(1_001)
    assert code_of(await call(world, committed, COMMIT)) == ResponseCode.SUCCESS
    assert code_of(await call(world, rolled, ROLLBACK)) == ResponseCode.SUCCESS
