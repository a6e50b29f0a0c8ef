"""Batch-scoped ends of the Spark sink (batch.py, handlers/end_batch.py) over a real store.

Covers: the record is stored before any half is resolved; commit of the listed halves and
rollback of the rest; a repeated COMMIT stores nothing; ROLLBACK; COMMIT after ROLLBACK; the
orphan rules of the check-back service; restart with a record written but halves unresolved;
the memory limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import orjson
import pytest
from test_tx_end_transaction import GroupAcks, group_durability
from tx_harness import GROUP, TOPIC, FakeProducer, World

from tidemq.broker.config import BrokerConfig
from tidemq.broker.durability import LEASE_LOST_REMARK, WaitDurable
from tidemq.broker.handlers.end_batch import EndBatchHandler
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.batch import (
    BATCH_TOPIC,
    BatchIndex,
    BatchOutcome,
    BatchRecord,
    SinkBatchResolver,
    batch_record_message,
    decode_batch_record,
    parse_spark_txn,
)
from tidemq.broker.transaction.check_back import CheckBackConfig, CheckBackService
from tidemq.broker.transaction.states import TxState
from tidemq.clock import FakeClock
from tidemq.errors import ProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndBatchRequestHeader
from tidemq.protocol.message import SPARK_TXN
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.types import PutResult
from tidemq.testing import eventually

COMMIT, ROLLBACK = 8, 12
TIMEOUT_MS = 6_000
ORPHAN_TIMEOUT_MS = 3_600_000
SINK = "q-1"


class DriverConnection(FakeProducer):
    """The driver's connection: refusals are logged through it (handlers/common.refuse)."""

    def log_peer_error(self, message: str, *args: object, level: int = logging.WARNING) -> None:
        logging.getLogger(__name__).log(level, message, *args)


class Sink:
    """The world plus its SinkBatchResolver and a check-back service that knows it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.attach()

    def attach(self) -> None:
        world = self.world
        self.batches = SinkBatchResolver(
            world.resolver, world.clock, orphan_timeout_ms=ORPHAN_TIMEOUT_MS
        )
        world.resolver.prepare_listeners.append(self.batches.on_prepare)
        self.batches.rebuild()
        self.producer = FakeProducer("p1")
        self.checker = CheckBackService(
            CheckBackConfig(interval_ms=100, timeout_ms=TIMEOUT_MS),
            world.resolver,
            world.offsets,
            lambda _group, _topic: [cast(Connection, self.producer)],
            world.clock,
            sink_batches=self.batches,
        )

    def restart(self) -> None:
        self.world.restart()
        self.attach()

    def half(self, batch: int, txn: str, body: bytes | None = None, sink: str = SINK) -> PutResult:
        tag = f"{sink}/{batch}/{txn}"
        return self.world.prepare(body or tag.encode(), properties={SPARK_TXN: tag})

    async def end(
        self,
        batch: int,
        action: int,
        txns: list[str],
        sink: str = SINK,
        *,
        final: bool = False,
        durable: WaitDurable | None = None,
        **extra: object,
    ) -> RemotingCommand:
        table = HandlerTable()

        async def flushed(end: int) -> tuple[int, str]:
            return ResponseCode.SUCCESS, ""

        EndBatchHandler(BrokerConfig(), self.batches, durable or flushed).register(table)
        header = EndBatchRequestHeader(sink_id=sink, batch_id=batch, commit_or_rollback=action)
        request = RemotingCommand(
            code=RequestCode.TIDEMQ_END_BATCH,
            ext_fields=header.to_fields(),
            body=orjson.dumps({"txns": txns, **({"final": True} if final else {}), **extra}),
        )
        run = table.get(RequestCode.TIDEMQ_END_BATCH)
        assert run is not None
        response = await run(cast(Connection, DriverConnection("driver")), request)
        assert response is not None
        return response

    def visible(self) -> list[bytes]:
        return sorted(m.body for m in self.world.real_messages())

    def records(self) -> list[BatchRecord]:
        return [decode_batch_record(m.body) for m in self.world.records(BATCH_TOPIC)]


@pytest.fixture
def sink(tmp_path: Path, clock: FakeClock) -> Iterator[Sink]:
    world = World(tmp_path, clock)
    yield Sink(world)
    world.close()


def test_txn_tag_parsing() -> None:
    assert parse_spark_txn("q/3/1/0-ab").txn == "1/0-ab"
    assert parse_spark_txn("q/3/1/0-ab").batch_id == 3
    for bad in ("q/3/1", "q/x/1/0", "q//1/0", "a/1/2/3/4"):
        with pytest.raises(ProtocolError, match="sinkId/batchId"):
            parse_spark_txn(bad)


async def test_commit_records_first_then_commits_listed_and_rolls_back_the_rest(
    sink: Sink,
) -> None:
    sink.half(0, "0/0")
    sink.half(0, "1/0")  # attempt 0 of partition 1 failed ...
    sink.half(0, "1/1")  # ... and attempt 1 succeeded
    sink.half(1, "0/0")  # the next batch: untouched
    response = await sink.end(0, COMMIT, ["0/0", "1/1"])
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["alreadyCommitted"] == "false"
    assert (response.ext_fields["committed"], response.ext_fields["rolledBack"]) == ("2", "1")
    assert sink.visible() == [b"q-1/0/0/0", b"q-1/0/1/1"]
    (record,) = sink.records()
    assert record == BatchRecord(SINK, 0, BatchOutcome.COMMIT, frozenset({"0/0", "1/1"}))
    # The record precedes every op message it caused.
    (record_message,) = sink.world.records(BATCH_TOPIC)
    ops = sink.world.records(hm.OP_TOPIC)
    # One op message per outcome, listing its halves (batch_finish.py: one end_many run).
    outcomes = {hm.outcome_of_op(op): len(hm.parse_op_body(op.body)) for op in ops}
    assert outcomes == {hm.Outcome.COMMIT: 2, hm.Outcome.ROLLBACK: 1}
    assert len(ops) == 2
    assert all(op.physical_offset > record_message.physical_offset for op in ops)
    assert sink.world.ledger.in_flight == 1


async def test_repeated_commit_stores_nothing_new(sink: Sink) -> None:
    sink.half(0, "0/0")
    assert (await sink.end(0, COMMIT, ["0/0"])).code == ResponseCode.SUCCESS
    ends = sink.world.store.max_physical_offset
    sink.half(0, "0/0-replay")  # a replayed batch after a driver crash sends again
    # Its own txns are refused (the decision holds; a success here hid lost rows) ...
    refused = await sink.end(0, COMMIT, ["0/0-replay"])
    assert refused.code == ResponseCode.TRANSACTION_FAILED
    assert "finish that decision" in (refused.remark or "")
    assert sink.world.ledger.in_flight == 1
    # ... and the driver, having looked the decision up, repeats it instead.
    again = await sink.end(0, COMMIT, ["0/0"])
    assert again.code == ResponseCode.SUCCESS
    assert again.ext_fields["alreadyCommitted"] == "true"
    assert again.ext_fields["rolledBack"] == "1"
    assert sink.visible() == [b"q-1/0/0/0"]
    assert len(sink.records()) == 1
    # Only the replayed half's rollback op was written: no record, no real message.
    (last_op,) = [o for o in sink.world.records(hm.OP_TOPIC) if o.physical_offset >= ends]
    assert hm.outcome_of_op(last_op) is hm.Outcome.ROLLBACK
    third = await sink.end(0, COMMIT, ["0/0"])
    assert third.ext_fields["alreadyCommitted"] == "true"
    assert third.ext_fields["rolledBack"] == "0"
    assert sink.world.store.max_offset(hm.OP_TOPIC, 0) == 2


async def test_rollback_rolls_back_every_pending_half_of_the_batch(sink: Sink) -> None:
    sink.half(2, "0/0")
    sink.half(2, "1/0")
    sink.half(3, "0/0")
    response = await sink.end(2, ROLLBACK, [])  # abort messages may all be None
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["rolledBack"] == "2"
    assert sink.visible() == []
    (record,) = sink.records()
    assert record.outcome is BatchOutcome.ROLLBACK
    assert record.txns == {"0/0", "1/0"}
    repeat = await sink.end(2, ROLLBACK, ["0/0"])
    assert repeat.code == ResponseCode.SUCCESS
    assert len(sink.records()) == 1


async def test_commit_after_rollback_is_refused_for_rolled_back_txns(sink: Sink) -> None:
    sink.half(4, "0/0-a")
    assert (await sink.end(4, ROLLBACK, [])).code == ResponseCode.SUCCESS
    refused = await sink.end(4, COMMIT, ["0/0-a"])
    assert refused.code == ResponseCode.TRANSACTION_FAILED
    assert refused.remark is not None
    assert "rolled back" in refused.remark
    assert "COMMIT refused" in refused.remark
    # The query restarted from its checkpoint replays batch 4 with new attempts: accepted.
    sink.half(4, "0/0-b")
    replay = await sink.end(4, COMMIT, ["0/0-b"])
    assert replay.code == ResponseCode.SUCCESS, replay.remark
    assert sink.visible() == [b"q-1/4/0/0-b"]
    refused_rollback = await sink.end(4, ROLLBACK, [])
    assert refused_rollback.code == ResponseCode.TRANSACTION_FAILED
    assert refused_rollback.remark is not None
    assert "already committed" in refused_rollback.remark


async def test_a_final_rollback_rolls_back_halves_sent_after_it(sink: Sink) -> None:
    """A batch write's abort: Spark killed the job's other tasks, which may still be sending
    halves, and no task reported (no txns). Nothing else will ever end that one-shot sink's
    batch, so the final ROLLBACK must close it: a plain ROLLBACK leaves late halves pending
    until the orphan timeout (hours)."""
    sink.half(0, "0/0-a", sink="job-plain")
    assert (await sink.end(0, ROLLBACK, [], sink="job-plain")).code == ResponseCode.SUCCESS
    sink.half(0, "1/0-a", sink="job-plain")  # late: stays (a streaming replay may commit)
    sink.half(0, "0/0-a", sink="job-final")  # before the abort
    response = await sink.end(0, ROLLBACK, [], sink="job-final", final=True)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["rolledBack"] == "1"
    sink.half(0, "1/0-a", sink="job-final")  # late halves of the killed task
    sink.half(0, "1/0-a", sink="job-final")
    sink.world.clock.advance(TIMEOUT_MS)
    report = await sink.checker.run_once()
    assert report.resolved_sink == 2
    assert sink.producer.sent == []
    assert sink.world.ledger.in_flight == 1  # job-plain's late half, until the orphan timeout
    assert sink.batches.index.pending(SINK, 0) == {}
    assert sink.visible() == []
    refused = await sink.end(0, COMMIT, ["1/0-b"], sink="job-final")
    assert refused.code == ResponseCode.TRANSACTION_FAILED
    assert refused.remark is not None
    assert "for good" in refused.remark
    # The flag is durable: a restart still rolls back a late half of the closed batch.
    records = sink.records()
    assert [r.final for r in records] == [False, True]
    sink.restart()
    sink.half(0, "2/0-a", sink="job-final")
    sink.world.clock.advance(TIMEOUT_MS)
    assert (await sink.checker.run_once()).resolved_sink == 1
    assert sink.visible() == []
    again = await sink.end(0, ROLLBACK, [], sink="job-final", final=True)
    assert again.code == ResponseCode.SUCCESS
    assert len(sink.records()) == 2
    assert (await sink.end(0, COMMIT, [], final=True)).code == ResponseCode.SYSTEM_ERROR


async def test_malformed_requests_are_refused(sink: Sink) -> None:
    assert (await sink.end(0, 0, [])).code == ResponseCode.SYSTEM_ERROR
    assert (await sink.end(0, COMMIT, [""])).code == ResponseCode.SYSTEM_ERROR
    assert (await sink.end(0, COMMIT, [], sink="a/b")).code == ResponseCode.SYSTEM_ERROR
    assert sink.records() == []


async def test_orphans_follow_the_batch_records(sink: Sink) -> None:
    """Never checked back: committed if recorded, rolled back when the batch is recorded
    without it or a later batch is, left pending otherwise."""
    in_set = sink.half(5, "0/1")
    sink.half(5, "0/0")  # orphan of a failed attempt
    sink.half(6, "0/0")  # batch 6's halves, before batch 7 is recorded
    waiting = sink.half(8, "0/0")  # no record yet for batch 8 or later
    # Batch 5 recorded but (as after a crash) not yet acted on: drop what end_batch would do.
    record = BatchRecord(SINK, 5, BatchOutcome.COMMIT, frozenset({"0/1"}))
    sink.world.store.put_message(
        batch_record_message(record, store_host=("127.0.0.1", 1), now_ms=0)
    )
    sink.batches.index.apply(record)
    sink.batches.index.apply(BatchRecord(SINK, 7, BatchOutcome.COMMIT, frozenset()))
    sink.world.clock.advance(TIMEOUT_MS)
    report = await sink.checker.run_once()
    assert report.resolved_sink == 3
    assert report.checked == 0
    assert sink.producer.sent == []
    assert sink.visible() == [b"q-1/5/0/1"]
    assert sink.world.ledger.state(hm.origin_of(sink.world.half_at(in_set.physical_offset))) is (
        TxState.COMMITTED
    )
    # Batch 8 waits (rewritten at the queue's end so it does not pin the offset) ...
    assert report.rewritten == 1
    assert sink.world.ledger.in_flight == 1
    assert report.half_offset > waiting.queue_offset
    # ... until the orphan timeout.
    sink.world.clock.advance(ORPHAN_TIMEOUT_MS)
    report = await sink.checker.run_once()
    assert report.resolved_sink == 1
    assert sink.world.ledger.in_flight == 0
    assert sink.visible() == [b"q-1/5/0/1"]
    assert sink.producer.sent == []


async def test_young_orphan_without_record_pins_the_offset(sink: Sink) -> None:
    sink.half(0, "0/0")
    report = await sink.checker.run_once()
    assert (report.left, report.resolved_sink, report.half_offset) == (1, 0, 0)


async def test_restart_finishes_a_recorded_batch(sink: Sink) -> None:
    """A crash after the record and before the halves were resolved: the start finishes it."""
    sink.half(9, "0/0")
    sink.half(9, "1/0")
    record = BatchRecord(SINK, 9, BatchOutcome.COMMIT, frozenset({"1/0"}))
    sink.world.store.put_message(
        batch_record_message(record, store_host=("127.0.0.1", 1), now_ms=0)
    )
    assert sink.visible() == []
    sink.restart()
    assert sink.visible() == [b"q-1/9/1/0"]
    assert sink.world.ledger.in_flight == 0
    repeat = await sink.end(9, COMMIT, ["1/0"])
    assert repeat.ext_fields["alreadyCommitted"] == "true"
    assert sink.visible() == [b"q-1/9/1/0"]


async def test_restart_keeps_unrecorded_batches_pending(sink: Sink) -> None:
    sink.half(3, "0/0")
    sink.restart()
    assert sink.world.ledger.in_flight == 1
    response = await sink.end(3, COMMIT, ["0/0"])
    assert response.ext_fields["committed"] == "1"
    assert sink.visible() == [b"q-1/3/0/0"]


def test_index_is_bounded() -> None:
    index = BatchIndex(records_per_sink_max=2, sinks_max=2)
    for batch in range(5):
        index.apply(BatchRecord("a", batch, BatchOutcome.COMMIT, frozenset({"0/0"})))
    assert index.state("a", 2) is None
    assert index.state("a", 4) is not None
    assert index.batch_max("a") == 4
    index.apply(BatchRecord("b", 0, BatchOutcome.COMMIT, frozenset()))
    index.apply(BatchRecord("a", 5, BatchOutcome.COMMIT, frozenset()))  # a is recent again
    index.apply(BatchRecord("c", 0, BatchOutcome.COMMIT, frozenset()))
    assert index.sinks == 2
    assert index.batch_max("b") == -1  # least recently used sink forgotten
    assert index.batch_max("a") == 5


async def test_ordinary_transactions_are_still_checked_back(sink: Sink) -> None:
    sink.world.prepare(b"plain")
    sink.world.clock.advance(TIMEOUT_MS)
    report = await sink.checker.run_once()
    assert report.checked == 1
    assert report.resolved_sink == 0
    assert len(sink.producer.sent) == 1
    assert sink.world.records(TOPIC, 1) == []
    assert GROUP


async def lookup(sink: Sink, batch: int) -> dict[str, object]:
    response = await sink.end(batch, COMMIT, [], phase="lookup")
    assert response.code == ResponseCode.SUCCESS, response.remark
    answer: dict[str, object] = orjson.loads(response.body)
    return answer


async def test_decide_records_without_resolving_then_publish_commits(sink: Sink) -> None:
    """Phase one records the decision and the brokers holding it, and makes nothing visible;
    phase two publishes. A lookup answers the decision at each stage."""
    holders = {"broker-a": "127.0.0.1:1", "broker-c": "127.0.0.1:3"}
    sink.half(0, "0/0-a")
    sink.half(0, "1/0-a")
    assert await lookup(sink, 0) == {"state": "NONE", "txns": [], "brokers": {}}
    decided = await sink.end(0, COMMIT, ["0/0-a"], phase="decide", brokers=holders)
    assert decided.code == ResponseCode.SUCCESS, decided.remark
    assert (decided.ext_fields["committed"], decided.ext_fields["rolledBack"]) == ("0", "0")
    assert sink.visible() == []
    assert await lookup(sink, 0) == {"state": "DECIDED", "txns": ["0/0-a"], "brokers": holders}
    # A repeated decide (a replay finishing it) stores nothing; another one is refused.
    again = await sink.end(0, COMMIT, ["0/0-a"], phase="decide", brokers=holders)
    assert again.code == ResponseCode.SUCCESS
    other = await sink.end(0, COMMIT, ["0/0-b"], phase="decide")
    assert other.code == ResponseCode.TRANSACTION_FAILED
    assert (await sink.end(0, COMMIT, ["0/0-b"])).code == ResponseCode.TRANSACTION_FAILED
    assert (await sink.end(0, ROLLBACK, [])).code == ResponseCode.TRANSACTION_FAILED
    assert len(sink.records()) == 1
    published = await sink.end(0, COMMIT, ["0/0-a"], brokers=holders)
    assert published.code == ResponseCode.SUCCESS, published.remark
    assert (published.ext_fields["committed"], published.ext_fields["rolledBack"]) == ("1", "1")
    assert sink.visible() == [b"q-1/0/0/0-a"]
    assert (await lookup(sink, 0))["state"] == "COMMITTED"
    assert [(r.published, dict(r.holders)) for r in sink.records()] == [
        (False, holders),
        (True, holders),
    ]
    # A published decision is never replaced.
    replaced = await sink.end(0, COMMIT, ["0/0-b"], phase="decide", replace=True)
    assert replaced.code == ResponseCode.TRANSACTION_FAILED


async def test_a_lookup_or_repeat_after_a_timed_out_decide_waits_for_durability(
    sink: Sink,
) -> None:
    """A DECIDE recorded here but answered FLUSH_SLAVE_TIMEOUT may be on no other replica. A
    lookup (DECIDED) or a repeated DECIDE (SUCCESS) answered from memory at once would let the
    driver publish on other brokers, and a failover here to a replica without the record would
    roll these halves back: the batch half committed. Both answer once the log holding the
    record is acknowledged."""
    holders = {"broker-a": "127.0.0.1:1"}
    sink.half(0, "0/0-a")
    acks = GroupAcks(ResponseCode.FLUSH_SLAVE_TIMEOUT)
    durable = group_durability(acks).wait_durable
    first = await sink.end(0, COMMIT, ["0/0-a"], durable=durable, phase="decide", brokers=holders)
    assert first.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
    (record,) = sink.world.records(BATCH_TOPIC)
    looked_up = asyncio.ensure_future(sink.end(0, COMMIT, [], durable=durable, phase="lookup"))
    repeat = asyncio.ensure_future(
        sink.end(0, COMMIT, ["0/0-a"], durable=durable, phase="decide", brokers=holders)
    )
    await eventually(
        lambda: len(acks.held) == 2 or looked_up.done() or repeat.done(), what="both waits"
    )
    assert not looked_up.done()
    assert not repeat.done()
    assert min(acks.ends[1:]) >= record.physical_offset + record.total_size
    for held in acks.held:
        held(ResponseCode.SUCCESS)
    answer = await looked_up
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert orjson.loads(answer.body)["state"] == "DECIDED"
    assert (await repeat).code == ResponseCode.SUCCESS
    assert len(sink.records()) == 1


async def test_answers_durability_refuses_are_not_success(sink: Sink) -> None:
    """A lookup, a repeated PUBLISH and a repeated ROLLBACK answer durability's code and remark
    (here a lost lease, then a timeout) instead of SUCCESS."""
    sink.half(0, "0/0-a")
    assert (await sink.end(0, COMMIT, ["0/0-a"])).code == ResponseCode.SUCCESS
    assert (await sink.end(1, ROLLBACK, [])).code == ResponseCode.SUCCESS
    lease = [False]
    acks = GroupAcks(*[ResponseCode.SUCCESS] * 3)
    durable = group_durability(acks, lambda: lease[0]).wait_durable
    answers = [
        await sink.end(0, COMMIT, [], durable=durable, phase="lookup"),
        await sink.end(0, COMMIT, ["0/0-a"], durable=durable),
        await sink.end(1, ROLLBACK, [], durable=durable),
    ]
    assert [a.code for a in answers] == [ResponseCode.SERVICE_NOT_AVAILABLE] * 3
    assert all(LEASE_LOST_REMARK in (a.remark or "") for a in answers)
    assert answers[1].ext_fields["alreadyCommitted"] == "true"
    lease[0] = True
    acks.codes = [ResponseCode.FLUSH_SLAVE_TIMEOUT]
    timed_out = await sink.end(0, COMMIT, [], durable=durable, phase="lookup")
    assert timed_out.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert (timed_out.remark or "").startswith("batch state not durable: stored on the master")
    assert len(sink.records()) == 2


async def test_an_unpublished_decision_can_be_replaced(sink: Sink) -> None:
    """A decision that reached only some brokers and was published nowhere may be swapped for
    the one a replay found published elsewhere (the driver sends `replace` then)."""
    sink.half(1, "0/0-a")
    sink.half(1, "0/0-b")
    assert (await sink.end(1, COMMIT, ["0/0-a"], phase="decide")).code == ResponseCode.SUCCESS
    swapped = await sink.end(1, COMMIT, ["0/0-b"], phase="decide", replace=True)
    assert swapped.code == ResponseCode.SUCCESS, swapped.remark
    assert (await sink.end(1, COMMIT, ["0/0-b"])).code == ResponseCode.SUCCESS
    assert sink.visible() == [b"q-1/1/0/0-b"]
    assert sink.world.ledger.in_flight == 0


async def test_decided_halves_wait_for_the_publish_through_restarts_and_timeouts(
    sink: Sink,
) -> None:
    """A decided batch's halves never time out (a replay may still publish the decision) and
    a restart keeps them pending; a later batch of the sink rolls them back (the driver only
    starts it once every broker holding the decision published it)."""
    sink.half(2, "0/0-a")
    sink.half(3, "0/0-a")
    assert (await sink.end(2, COMMIT, ["0/0-a"], phase="decide")).code == ResponseCode.SUCCESS
    assert (await sink.end(3, COMMIT, ["0/0-a"], phase="decide")).code == ResponseCode.SUCCESS
    sink.restart()
    assert sink.world.ledger.in_flight == 1  # batch 2's half rolled back: batch 3 is recorded
    sink.world.clock.advance(ORPHAN_TIMEOUT_MS + TIMEOUT_MS)
    report = await sink.checker.run_once()
    assert (report.resolved_sink, report.rewritten) == (0, 1)
    assert sink.world.ledger.in_flight == 1
    assert sink.visible() == []
    assert (await sink.end(3, COMMIT, ["0/0-a"])).code == ResponseCode.SUCCESS
    assert sink.visible() == [b"q-1/3/0/0-a"]


async def test_malformed_phases_are_refused(sink: Sink) -> None:
    assert (await sink.end(0, COMMIT, [], phase="vote")).code == ResponseCode.SYSTEM_ERROR
    assert (await sink.end(0, ROLLBACK, [], phase="lookup")).code == ResponseCode.SYSTEM_ERROR
    assert (await sink.end(0, COMMIT, [], brokers=["a"])).code == ResponseCode.SYSTEM_ERROR
    bad = await sink.end(0, COMMIT, [], phase="decide", replace="yes")
    assert bad.code == ResponseCode.SYSTEM_ERROR
    assert sink.records() == []


async def test_a_final_rollback_closes_a_decided_batch_write(sink: Sink) -> None:
    """A batch write whose commit failed between its decide and its publish (a holder did not
    answer) is never replayed: its final ROLLBACK must close the unpublished decision, or its
    halves would stay pending for good (a decided batch's halves never time out). A published
    decision still refuses it."""
    sink.half(0, "0/0-a", sink="job-decided")
    decided = await sink.end(0, COMMIT, ["0/0-a"], sink="job-decided", phase="decide")
    assert decided.code == ResponseCode.SUCCESS, decided.remark
    closed = await sink.end(0, ROLLBACK, ["0/0-a"], sink="job-decided", final=True)
    assert closed.code == ResponseCode.SUCCESS, closed.remark
    assert closed.ext_fields["rolledBack"] == "1"
    assert sink.world.ledger.in_flight == 0
    sink.half(0, "1/0-a", sink="job-decided")  # a late half of a killed task
    sink.world.clock.advance(TIMEOUT_MS)
    assert (await sink.checker.run_once()).resolved_sink == 1
    for phase in ("decide", "commit"):
        late = await sink.end(0, COMMIT, ["0/0-a"], sink="job-decided", phase=phase)
        assert late.code == ResponseCode.TRANSACTION_FAILED, phase
    assert sink.visible() == []
    sink.restart()
    assert sink.world.ledger.in_flight == 0
    # A published batch is not rolled back, final or not.
    sink.half(0, "0/0-a", sink="job-published")
    assert (await sink.end(0, COMMIT, ["0/0-a"], sink="job-published")).code == 0
    refused = await sink.end(0, ROLLBACK, [], sink="job-published", final=True)
    assert refused.code == ResponseCode.TRANSACTION_FAILED
    assert sink.visible() == [b"job-published/0/0/0-a"]


async def test_a_sink_evicted_from_memory_keeps_its_decision(sink: Sink) -> None:
    """Other sinks (every batch write is one) push a streaming sink out of the LRU while its
    driver is down after publishing batch 4 and before Spark's commit log. Its replay (new
    txns) must still find the decision, or it would decide anew and publish the rows twice;
    and a decided batch's halves must not time out because their sink was forgotten."""
    sink.batches.index = BatchIndex(sinks_max=2)
    sink.half(4, "0/0-a")
    assert (await sink.end(4, COMMIT, ["0/0-a"])).code == ResponseCode.SUCCESS
    decided = await sink.end(5, COMMIT, ["0/0-a"], sink="q-2", phase="decide")
    assert decided.code == ResponseCode.SUCCESS
    sink.half(5, "0/0-a", sink="q-2")
    for job in ("job-1", "job-2", "job-3"):
        assert (await sink.end(0, ROLLBACK, [], sink=job, final=True)).code == 0
    assert sink.batches.index.state(SINK, 4) is None  # evicted
    sink.half(4, "0/0-replay")
    assert await lookup(sink, 4) == {"state": "COMMITTED", "txns": ["0/0-a"], "brokers": {}}
    assert (await sink.end(4, COMMIT, ["0/0-replay"])).code == ResponseCode.TRANSACTION_FAILED
    assert (await sink.end(4, COMMIT, ["0/0-a"])).ext_fields["alreadyCommitted"] == "true"
    assert sink.visible() == [b"q-1/4/0/0-a"]
    # q-2's batch 5 is decided, not published: its half outlives the orphan timeout.
    for job in ("job-4", "job-5", "job-6"):
        assert (await sink.end(0, ROLLBACK, [], sink=job, final=True)).code == 0
    sink.world.clock.advance(ORPHAN_TIMEOUT_MS + TIMEOUT_MS)
    await sink.checker.run_once()
    assert (await lookup_sink(sink, "q-2", 5))["state"] == "DECIDED"
    assert sink.world.ledger.in_flight == 1  # q-2's decided half
    assert (await sink.end(5, COMMIT, ["0/0-a"], sink="q-2")).code == ResponseCode.SUCCESS
    assert b"q-2/5/0/0-a" in sink.visible()


async def lookup_sink(sink: Sink, sink_id: str, batch: int) -> dict[str, object]:
    response = await sink.end(batch, COMMIT, [], sink=sink_id, phase="lookup")
    assert response.code == ResponseCode.SUCCESS, response.remark
    answer: dict[str, object] = orjson.loads(response.body)
    return answer


async def test_an_orphan_timeout_is_recorded_so_a_late_decision_is_refused(sink: Sink) -> None:
    """A holder that missed batch 6's decide (it was down when the commit failed) rolls its
    halves back once they outlive the orphan timeout (it cannot know of the decision). The
    replay that comes later must not publish that decision here as if nothing were lost: the
    timeout is recorded, and the decision refused with `batchRolledBack` (the driver then
    decides its own attempt's rows instead)."""
    sink.half(6, "0/0-a")
    sink.half(6, "0/0-a")
    sink.world.clock.advance(ORPHAN_TIMEOUT_MS + TIMEOUT_MS)
    assert (await sink.checker.run_once()).resolved_sink == 2
    assert [(r.outcome, r.txns) for r in sink.records()] == [
        (BatchOutcome.ROLLBACK, frozenset({"0/0-a"}))
    ]
    sink.restart()
    for phase in ("decide", "commit"):
        refused = await sink.end(6, COMMIT, ["0/0-a"], phase=phase)
        assert refused.code == ResponseCode.TRANSACTION_FAILED, phase
        assert refused.ext_fields["batchRolledBack"] == "true"
    sink.half(6, "0/0-replay")
    own = await sink.end(6, COMMIT, ["0/0-replay"], phase="decide", replace=True)
    assert own.code == ResponseCode.SUCCESS, own.remark
    assert (await sink.end(6, COMMIT, ["0/0-replay"])).code == ResponseCode.SUCCESS
    assert sink.visible() == [b"q-1/6/0/0-replay"]


async def test_a_big_publish_lets_the_loop_run_between_chunks(
    sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_finish.py: the halves are resolved chunk by chunk, other work running between
    chunks (a 50,000-half publish once held the loop for >12 s), and none is lost or doubled."""
    from tidemq.broker.transaction import batch_finish

    monkeypatch.setattr(batch_finish, "FINISH_CHUNK_MAX", 16)
    monkeypatch.setattr(batch_finish, "FINISH_TURN_BUDGET_S", 0.0)
    for index in range(100):
        sink.half(0, f"{index % 5}/0", body=f"row-{index}".encode())
    sink.half(0, "9/9")  # not listed: rolled back
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        response = await sink.end(0, COMMIT, [f"{p}/0" for p in range(5)])
    finally:
        task.cancel()
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert (response.ext_fields["committed"], response.ext_fields["rolledBack"]) == ("100", "1")
    assert ticks >= 100 // 16  # the loop ran between (at least) every two chunks
    assert sink.visible() == sorted(f"row-{index}".encode() for index in range(100))
    assert sink.world.ledger.in_flight == 0
