"""END_TRANSACTION's oneway round: answers of one loop turn are stored together, after the turn.

Also the header shortcut, held to EndTransactionRequestHeader.from_fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import pytest
from tx_harness import GROUP, TOPIC, FakeProducer, World

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers import end_transaction
from tidemq.broker.handlers.end_transaction import EndTransactionHandler
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.states import TxState
from tidemq.errors import ProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FLAG_ONEWAY, RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.types import PutResult

COMMIT, ROLLBACK = 8, 12
PEER = cast(Connection, FakeProducer("peer"))


class Flush:
    def __init__(self) -> None:
        self.ends: list[int] = []

    async def __call__(self, end: int) -> tuple[int, str]:
        self.ends.append(end)
        return ResponseCode.SUCCESS, ""


class Ends:
    """One handler, as the broker registers it, and requests for it."""

    def __init__(self, world: World) -> None:
        self.flush = Flush()
        self.handler = EndTransactionHandler(BrokerConfig(), world.resolver, self.flush)
        table = HandlerTable()
        self.handler.register(table)
        run = table.get(RequestCode.END_TRANSACTION)
        assert run is not None
        self.run = run

    async def send(
        self, put: PutResult, action: int, *, oneway: bool = True, group: str = GROUP
    ) -> RemotingCommand | None:
        header = EndTransactionRequestHeader(
            producer_group=group,
            tran_state_table_offset=put.queue_offset,
            commit_log_offset=put.physical_offset,
            commit_or_rollback=action,
            msg_id=f"M{put.queue_offset}",
        )
        request = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())
        if oneway:
            request.flag |= FLAG_ONEWAY
        return await self.run(PEER, request)


async def test_oneway_answers_of_one_turn_are_stored_together_after_it(world: World) -> None:
    puts = [world.prepare(bytes([n])) for n in range(4)]
    ends = Ends(world)
    for put, action in zip(puts, (COMMIT, ROLLBACK, COMMIT, COMMIT), strict=True):
        assert await ends.send(put, action) is None
    assert world.real_messages() == []  # not yet: the round is stored after this turn
    await asyncio.sleep(0)
    assert [m.body for m in world.real_messages()] == [b"\x00", b"\x02", b"\x03"]
    assert [world.ledger.state(n) for n in range(4)] == [
        TxState.COMMITTED,
        TxState.ROLLED_BACK,
        TxState.COMMITTED,
        TxState.COMMITTED,
    ]
    assert len(world.records(hm.OP_TOPIC)) == 2  # one op message per outcome
    assert sorted(world.op_origins()) == [0, 1, 2, 3]
    assert ends.flush.ends == []  # nobody reads a oneway answer: no flush is awaited


async def test_a_request_after_oneway_answers_finds_them_applied(world: World) -> None:
    put = world.prepare()
    ends = Ends(world)
    assert await ends.send(put, COMMIT) is None
    response = await ends.send(put, ROLLBACK, oneway=False)
    assert response is not None
    assert response.code == ResponseCode.TRANSACTION_FAILED
    assert "already COMMITTED" in (response.remark or "")
    assert len(world.real_messages()) == 1
    assert ends.flush.ends == []  # the refused request stored nothing to flush


async def test_a_request_awaits_the_flush_of_its_commit(world: World) -> None:
    put = world.prepare()
    ends = Ends(world)
    response = await ends.send(put, COMMIT, oneway=False)
    assert response is not None
    assert response.code == ResponseCode.SUCCESS
    (real,) = world.real_messages()
    assert ends.flush.ends == [real.physical_offset + real.total_size]


async def test_a_refused_oneway_answer_is_logged_and_leaves_the_transaction_pending(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    stored, refused = world.prepare(b"a"), world.prepare(b"b")
    ends = Ends(world)
    await ends.send(stored, ROLLBACK)
    await asyncio.sleep(0)
    world.disk_full = True
    world.clock.advance(1_001)
    with caplog.at_level(logging.WARNING):
        await ends.send(stored, COMMIT)  # contradicts the outcome
        await ends.send(refused, COMMIT)  # the store refuses it
        await ends.send(refused, COMMIT, group="OTHER")  # fails the checks at once
        await asyncio.sleep(0)
    text = caplog.text
    assert "already ROLLED_BACK" in text
    assert "SERVICE_NOT_AVAILABLE" in text
    assert "The producer group wrong" in text
    assert world.ledger.state(refused.queue_offset) is TxState.PREPARED
    assert world.real_messages() == []


async def test_a_full_round_is_stored_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(end_transaction, "END_ROUND_MAX", 2)
    puts = [world.prepare(bytes([n])) for n in range(3)]
    ends = Ends(world)
    for put in puts:
        await ends.send(put, COMMIT)
    assert len(world.real_messages()) == 2  # the first two, without waiting for the turn
    await asyncio.sleep(0)
    assert len(world.real_messages()) == 3
    assert all(m.topic == TOPIC for m in world.real_messages())


@pytest.mark.parametrize(
    "fields",
    [
        {"producerGroup": "G", "tranStateTableOffset": "1", "commitLogOffset": "2"},
        {"tranStateTableOffset": "-1", "commitLogOffset": "2"},
        {"tranStateTableOffset": " 1", "commitLogOffset": "+2"},
        {"tranStateTableOffset": "\u0661", "commitLogOffset": "2"},  # a non-ASCII digit
        {"tranStateTableOffset": "1" * 19, "commitLogOffset": "9" * 19},
        {"tranStateTableOffset": "x", "commitLogOffset": "2"},
        {"fromTransactionCheck": "true", "transactionId": "T"},
        {"fromTransactionCheck": "1", "transactionId": ""},
        {"fromTransactionCheck": "0"},
        {"fromTransactionCheck": "TRUE"},
        {"fromTransactionCheck": " "},
        {"fromTransactionCheck": "maybe"},
        {"msgId": None},
        {"producerGroup": None},
        {"commitOrRollback": None},
        {"producerGroup": ""},
    ],
)
def test_end_header_shortcut_agrees_with_from_fields(fields: dict[str, str | None]) -> None:
    base = {
        "producerGroup": "PG",
        "tranStateTableOffset": "17",
        "commitLogOffset": "4096",
        "commitOrRollback": "8",
        "fromTransactionCheck": "false",
        "msgId": "M",
    }
    base.update({k: v for k, v in fields.items() if v is not None})
    wire = {k: v for k, v in base.items() if fields.get(k, "") is not None}
    careful = EndTransactionRequestHeader._from_fields_careful
    assert parsed(EndTransactionRequestHeader.from_fields, wire) == parsed(careful, wire)


def parsed(
    parse: Callable[[dict[str, str]], EndTransactionRequestHeader], wire: dict[str, str]
) -> EndTransactionRequestHeader | str:
    try:
        return parse(wire)
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


async def test_a_round_that_fails_is_logged_and_the_next_one_is_stored(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = world.prepare(b"a"), world.prepare(b"b")
    ends = Ends(world)
    end_many = world.resolver.end_many

    def broken(answers: object) -> object:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(world.resolver, "end_many", broken)
    with caplog.at_level(logging.ERROR):
        await ends.send(first, COMMIT)
        await asyncio.sleep(0)
    assert "storing a round of END_TRANSACTION answers failed" in caplog.text
    assert world.ledger.state(first.queue_offset) is TxState.PREPARED  # left to a check-back
    monkeypatch.setattr(world.resolver, "end_many", end_many)
    await ends.send(second, COMMIT)
    await asyncio.sleep(0)
    assert [m.body for m in world.real_messages()] == [b"b"]
