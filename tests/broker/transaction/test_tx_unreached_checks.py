"""Check-backs that reach no producer do not count toward transactionCheckMax (issue 11, item 6).

After a broker restart producers are unknown until their next heartbeat (up to 30 s), so check
passes in that window asked nobody, yet raised TRANSACTION_CHECK_TIMES: with a short interval,
committed local transactions were discarded. Now such a pass puts the half back uncounted
(__TXUNREACHED# + 1); transactionUnreachedCheckMax and fileReservedTime still bound it.

First on a FakeClock over a real store (tx_harness), then end to end against a real broker with
real producers: before the fix, the end-to-end half was discarded by the second pass.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tx_harness import GROUP, FakeProducer, World

from tidemq.broker.app import BrokerApp
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.check_back import CheckBackConfig
from tidemq.broker.transaction.states import TxInput, TxState
from tidemq.client.message import Message, MessageExt
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.clock import FakeClock
from tidemq.protocol import record as rec
from tidemq.protocol.headers import CheckTransactionStateRequestHeader
from tidemq.protocol.message import TRANSACTION_CHECK_TIMES
from tidemq.testing import eventually, local_cluster

TIMEOUT_MS = 6_000
CHECK_MAX = 1
UNREACHED_MAX = 4


@pytest.fixture
def world(tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    config = CheckBackConfig(
        interval_ms=100, timeout_ms=TIMEOUT_MS, check_max=CHECK_MAX, unreached_max=UNREACHED_MAX
    )
    w = World(tmp_path, clock, check_config=config)
    yield w
    w.close()


async def passes(world: World, count: int) -> None:
    for _ in range(count):
        world.clock.advance(TIMEOUT_MS)
        await world.checker.run_once()


def newest_half(world: World) -> rec.StoredMessage:
    return world.records(hm.HALF_TOPIC)[-1]


async def test_unreached_passes_keep_the_half_then_a_producer_commits(world: World) -> None:
    world.prepare(b"committed locally")
    await passes(world, UNREACHED_MAX)  # the producer is gone (or not yet heartbeated)
    assert world.ledger.state(0) is TxState.PREPARED
    assert world.stats.check_no_producer == UNREACHED_MAX
    assert (world.stats.checked, world.stats.discarded) == (0, 0)
    copy = newest_half(world)
    assert hm.check_times_of(copy) == 0
    assert hm.unreached_checks_of(copy) == UNREACHED_MAX
    producer = FakeProducer("back")
    world.producers[GROUP] = [producer]
    await passes(world, 1)
    (command,) = producer.sent
    header = CheckTransactionStateRequestHeader.from_fields(command.ext_fields)
    half = world.half_at(header.commit_log_offset)
    assert hm.check_times_of(half) == 1  # the first check that reached a producer
    world.resolver.end(half, TxInput.COMMIT)
    (real,) = world.real_messages()
    assert real.body == b"committed locally"
    props = real.property_map()
    assert hm.UNREACHED_PROPERTY not in props
    assert TRANSACTION_CHECK_TIMES not in props


async def test_the_unreached_cap_still_discards(world: World) -> None:
    world.prepare()
    await passes(world, UNREACHED_MAX)
    assert world.ledger.state(0) is TxState.PREPARED
    await passes(world, 1)
    assert world.ledger.state(0) is TxState.DISCARDED
    (parked,) = world.records(hm.DISCARD_TOPIC)
    assert hm.unreached_checks_of(parked) == UNREACHED_MAX
    assert world.stats.discarded == 1


async def test_file_reserved_time_still_discards(tmp_path: Path, clock: FakeClock) -> None:
    config = CheckBackConfig(
        timeout_ms=TIMEOUT_MS, check_max=CHECK_MAX, unreached_max=1_000, file_reserved_ms=20_000
    )
    w = World(tmp_path, clock, check_config=config)
    try:
        w.prepare()
        await passes(w, 3)  # 18 s old: kept
        assert w.ledger.state(0) is TxState.PREPARED
        await passes(w, 1)  # 24 s old
        assert w.ledger.state(0) is TxState.DISCARDED
    finally:
        w.close()


async def test_checks_that_reach_a_producer_still_count(world: World) -> None:
    world.producers[GROUP] = [FakeProducer("silent")]  # never answers
    world.prepare()
    await passes(world, CHECK_MAX)
    assert world.ledger.state(0) is TxState.CHECKING
    await passes(world, 1)
    assert world.ledger.state(0) is TxState.DISCARDED
    assert world.stats.check_no_producer == 0


async def test_the_count_survives_a_restart(world: World) -> None:
    world.prepare()
    await passes(world, UNREACHED_MAX - 1)
    world.restart()
    await passes(world, 1)
    assert world.ledger.state(0) is TxState.PREPARED
    await passes(world, 1)
    assert world.ledger.state(0) is TxState.DISCARDED


async def test_one_log_line_per_pass(world: World, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(20):
        world.prepare(bytes([i]))
    caplog.set_level(logging.WARNING, logger="tidemq.broker.transaction.check_back")
    await passes(world, 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "20 transactions" in lines[0]
    assert GROUP in lines[0]


# -- end to end: a real broker, real producers ---------------------------------------------------

TOPIC = "TopicUnreached"
INTERVAL_MS = 100
# A half becomes due this long after it is stored. The producer that sent it must be gone by
# then (send_and_leave): a check that still reached it would count (CHECK_MAX = 1) and the next
# pass would discard the half. 200 ms left too little room on a loaded machine.
TX_TIMEOUT_MS = 2_000
COMMIT = LocalTransactionState.COMMIT_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class Answers:
    """A TransactionListener: `execute` for the local transaction, `check` for check-backs."""

    def __init__(self, execute: LocalTransactionState, check: LocalTransactionState) -> None:
        self.execute = execute
        self.check = check
        self.checked: list[MessageExt] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.execute

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        return self.check


def settings(unreached_max: int) -> dict[str, str]:
    return {
        "transactionCheckInterval": str(INTERVAL_MS),
        "transactionTimeOut": str(TX_TIMEOUT_MS),
        "transactionCheckMax": str(CHECK_MAX),
        "transactionUnreachedCheckMax": str(unreached_max),
    }


def stats(broker: BrokerApp) -> dict[str, int]:
    return broker.transaction_stats.snapshot(broker.transactions.ledger.in_flight)


def real_bodies(broker: BrokerApp) -> list[bytes]:
    bodies = []
    for queue_id in range(8):
        result = broker.store.get_messages(TOPIC, queue_id, 0, 64)
        bodies += [rec.decode_record(r).body for r in result.records]
    return bodies


@pytest.fixture
async def patient(tmp_path: Path) -> AsyncIterator[Any]:
    async with local_cluster(tmp_path, broker_settings=settings(1_000)) as cluster:
        yield cluster


async def send_and_leave(cluster: Any, body: bytes) -> None:
    """A producer sends a half, answers UNKNOW, and shuts down: nobody of the group is left."""
    async with TransactionProducer(
        GROUP, cluster.namesrv_addr, listener=Answers(UNKNOW, UNKNOW), instance_name="gone"
    ) as producer:
        await producer.send_message_in_transaction(Message(TOPIC, body))
    broker = cluster.brokers[0]
    await eventually(lambda: not broker.clients.producer_channels(GROUP))
    assert stats(broker)["checked"] == 0, "the producer was still live when the half became due"


async def test_a_half_outlives_unreached_passes_and_is_committed(patient: Any) -> None:
    broker = patient.brokers[0]
    await send_and_leave(patient, b"keep me")
    # Before the fix the first of these passes used up transactionCheckMax=1, the next discarded.
    await eventually(lambda: stats(broker)["check_no_producer"] >= 5)
    assert stats(broker)["discarded"] == 0
    assert stats(broker)["in_flight"] == 1
    answers = Answers(COMMIT, COMMIT)
    async with TransactionProducer(
        GROUP, patient.namesrv_addr, listener=answers, instance_name="back"
    ) as producer:
        await producer.publish_info(TOPIC)  # heartbeats the broker of the topic
        await eventually(lambda: real_bodies(broker) == [b"keep me"])
    assert len(answers.checked) >= 1
    assert stats(broker)["discarded"] == 0


async def test_a_half_nobody_answers_for_is_discarded_at_the_cap(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, broker_settings=settings(3)) as cluster:
        broker = cluster.brokers[0]
        await send_and_leave(cluster, b"orphan")
        await eventually(lambda: stats(broker)["discarded"] == 1)
        assert stats(broker)["check_no_producer"] == 3
        assert stats(broker)["checked"] == 0
        assert real_bodies(broker) == []
