"""CheckBackService (check_back.py): one test per branch, on a FakeClock over a real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tx_harness import GROUP, TOPIC, FakeProducer, World

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.check_back import CheckBackConfig
from tidemq.broker.transaction.states import TxInput, TxState
from tidemq.clock import FakeClock
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.headers import CheckTransactionStateRequestHeader
from tidemq.protocol.message import TRANS_CHECK_GROUP

TIMEOUT_MS = 6_000
CHECK_MAX = 3


@pytest.fixture
def world(tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    config = CheckBackConfig(interval_ms=100, timeout_ms=TIMEOUT_MS, check_max=CHECK_MAX)
    w = World(tmp_path, clock, check_config=config)
    w.producers[GROUP] = [FakeProducer("p1")]
    yield w
    w.close()


def checks_sent(world: World) -> list[tuple[CheckTransactionStateRequestHeader, rec.StoredMessage]]:
    out = []
    for producer in world.producers.get(GROUP, []):
        for cmd in producer.sent:
            assert cmd.code == RequestCode.CHECK_TRANSACTION_STATE
            header = CheckTransactionStateRequestHeader.from_fields(cmd.ext_fields)
            out.append((header, rec.decode_record(cmd.body)))
    return out


def answer(world: World, header: CheckTransactionStateRequestHeader, tx_input: TxInput) -> None:
    half = world.half_at(header.commit_log_offset)
    assert half.queue_offset == header.tran_state_table_offset
    world.resolver.end(half, tx_input)


async def test_nothing_is_checked_before_the_transaction_timeout(world: World) -> None:
    world.prepare()
    world.clock.advance(TIMEOUT_MS - 1)
    report = await world.checker.run_once()
    assert report.left == 1
    assert report.half_offset == 0  # the young record pins the offset
    assert checks_sent(world) == []


async def test_unknown_then_check_then_commit(world: World) -> None:
    put = world.prepare(b"m")
    world.resolver.end(world.half_at(put.physical_offset), TxInput.UNKNOWN)
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.checked == 1
    ((header, body),) = checks_sent(world)
    assert (body.topic, body.queue_id, body.body) == (TOPIC, 1, b"m")
    assert header.tran_state_table_offset == 1  # the copy, not the original
    assert header.msg_id == header.transaction_id == body.property_map()["UNIQ_KEY"]
    assert header.offset_msg_id is not None
    assert world.ledger.state(0) is TxState.CHECKING
    answer(world, header, TxInput.COMMIT)
    assert [m.body for m in world.real_messages()] == [b"m"]
    assert world.stats.checked == 1


async def test_unknown_then_check_then_rollback(world: World) -> None:
    world.prepare()
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    ((header, _),) = checks_sent(world)
    answer(world, header, TxInput.ROLLBACK)
    world.clock.advance(1_000)
    report = await world.checker.run_once()
    assert report.checked == 0
    assert world.real_messages() == []
    assert world.ledger.state(0) is TxState.ROLLED_BACK


async def test_repeated_unknown_is_checked_again_with_rising_count_then_discarded(
    world: World,
) -> None:
    world.prepare()
    counts = []
    for _ in range(CHECK_MAX + 1):
        world.clock.advance(TIMEOUT_MS)
        await world.checker.run_once()
    for _header, body in checks_sent(world):
        counts.append(int(body.property_map()["TRANSACTION_CHECK_TIMES"]))
    assert counts == [1, 2, 3]
    assert world.ledger.state(0) is TxState.DISCARDED
    (parked,) = world.records(hm.DISCARD_TOPIC)
    assert parked.property_map()["TRANSACTION_CHECK_TIMES"] == str(CHECK_MAX)
    assert world.stats.discarded == 1
    world.clock.advance(TIMEOUT_MS)
    assert (await world.checker.run_once()).checked == 0
    assert len(checks_sent(world)) == CHECK_MAX


async def test_older_than_file_reserved_time_is_discarded(tmp_path: Path, clock: FakeClock) -> None:
    config = CheckBackConfig(timeout_ms=TIMEOUT_MS, file_reserved_ms=10 * TIMEOUT_MS)
    w = World(tmp_path, clock, check_config=config)
    try:
        w.prepare()
        w.clock.advance(10 * TIMEOUT_MS + 1)
        report = await w.checker.run_once()
        assert report.discarded == 1
        assert w.ledger.state(0) is TxState.DISCARDED
    finally:
        w.close()


async def test_immunity_time_delays_the_first_check(world: World) -> None:
    world.prepare(b"imm", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"})
    world.prepare(b"plain")
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.checked == 1  # only the plain one
    assert report.rewritten == 1  # the immune one moved to the end, not pinning the offset
    assert [b.body for _h, b in checks_sent(world)] == [b"plain"]
    assert report.half_offset == 2
    world.clock.advance(60_000 - TIMEOUT_MS)
    await world.checker.run_once()
    assert sorted(b.body for _h, b in checks_sent(world)) == [b"imm", b"plain", b"plain"]


async def test_short_immunity_overrides_the_timeout(world: World) -> None:
    world.prepare(properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"})
    world.clock.advance(1_000)
    assert (await world.checker.run_once()).checked == 1


async def test_lost_end_transaction_is_resolved_by_the_check(world: World) -> None:
    """The producer committed locally but its END_TRANSACTION never arrived."""
    world.prepare(b"lost")
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    ((header, _),) = checks_sent(world)
    answer(world, header, TxInput.COMMIT)
    assert [m.body for m in world.real_messages()] == [b"lost"]


async def test_crashed_producer_is_replaced_by_another_of_the_group(world: World) -> None:
    dead = FakeProducer("dead", broken=True)
    alive = FakeProducer("alive")
    world.producers[GROUP] = [dead, alive]
    for i in range(4):
        world.prepare(bytes([i]))
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.checked == 4
    assert len(alive.sent) == 4
    assert world.stats.checked == 4
    assert world.stats.check_no_producer == 0


async def test_checks_rotate_over_the_group(world: World) -> None:
    a, b = FakeProducer("a"), FakeProducer("b")
    world.producers[GROUP] = [a, b]
    for i in range(4):
        world.prepare(bytes([i]))
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    assert (len(a.sent), len(b.sent)) == (2, 2)


async def test_no_live_producer_is_not_counted(world: World) -> None:
    """Issue 11, item 6 (more in test_tx_unreached_checks.py): checks that reach nobody do not
    use up transactionCheckMax."""
    world.producers[GROUP] = []
    world.prepare()
    for _ in range(CHECK_MAX + 1):
        world.clock.advance(TIMEOUT_MS)
        await world.checker.run_once()
    assert world.stats.check_no_producer == CHECK_MAX + 1
    assert world.stats.checked == 0
    assert world.ledger.state(0) is TxState.PREPARED


async def test_closed_connections_are_skipped(world: World) -> None:
    closed = FakeProducer("closed")
    closed.closed = True
    world.producers[GROUP] = [closed]
    world.prepare()
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    assert closed.sent == []
    assert world.stats.check_no_producer == 1


async def test_pass_stops_at_messages_stored_after_it_began(world: World) -> None:
    world.prepare(b"old")
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    # The copy put back during the pass (offset 1) was not walked by that pass.
    assert report.scanned == 1
    assert report.half_offset == 1
    assert world.store.max_offset(hm.HALF_TOPIC, 0) == 2


async def test_pass_is_capped_by_message_count(tmp_path: Path, clock: FakeClock) -> None:
    config = CheckBackConfig(timeout_ms=TIMEOUT_MS, pass_messages_max=3)
    w = World(tmp_path, clock, check_config=config)
    w.producers[GROUP] = [FakeProducer("p1")]  # a check that reaches nobody is not counted
    try:
        for i in range(5):
            w.prepare(bytes([i]))
        w.clock.advance(TIMEOUT_MS)
        first = await w.checker.run_once()
        assert (first.capped, first.checked, first.half_offset) == (True, 3, 3)
        second = await w.checker.run_once()
        # The rest (3, 4), then the first copy (of 0) put back by the first pass.
        assert (second.capped, second.checked, second.half_offset) == (True, 3, 6)
        assert w.ledger.pending(3) is not None
        assert w.ledger.pending(3).check_times == 1  # type: ignore[union-attr]
    finally:
        w.close()


async def test_pass_is_capped_by_time(tmp_path: Path, clock: FakeClock) -> None:
    config = CheckBackConfig(timeout_ms=TIMEOUT_MS, pass_time_max_ms=1_000)
    w = World(tmp_path, clock, check_config=config)
    w.producers[GROUP] = [FakeProducer("p1")]  # a check that reaches nobody is not counted
    try:
        for i in range(3):
            w.prepare(bytes([i]))
        w.clock.advance(TIMEOUT_MS)
        original = w.resolver.put_back

        def slow_put_back(half: rec.StoredMessage, times: int) -> rec.StoredMessage | None:
            clock.advance(600)  # each check costs 600 ms of the pass
            return original(half, times)

        w.resolver.put_back = slow_put_back  # type: ignore[method-assign,assignment]
        report = await w.checker.run_once()
        assert report.capped
        assert report.checked == 2
    finally:
        w.close()


async def test_offsets_advance_and_are_persisted_in_the_offset_table(world: World) -> None:
    a = world.prepare(b"a")
    world.prepare(b"b")
    world.resolver.end(world.half_at(a.physical_offset), TxInput.COMMIT)
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.half_offset == 2
    assert world.offsets.query(TRANS_CHECK_GROUP, hm.HALF_TOPIC, 0) == 2
    # The op of "a" was stored before the record at the half offset: no rebuild needs it.
    assert report.op_offset == 1
    assert world.offsets.query(TRANS_CHECK_GROUP, hm.OP_TOPIC, 0) == 1
    world.offsets.persist()
    assert f"{hm.HALF_TOPIC}@{TRANS_CHECK_GROUP}" in world.offsets.path.read_text()


async def test_stale_copies_and_resolved_records_are_skipped(world: World) -> None:
    world.prepare()
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    ((header, _),) = checks_sent(world)
    answer(world, header, TxInput.COMMIT)
    world.offsets.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, 0, 0)  # force a re-walk
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert (report.scanned, report.checked) == (2, 0)


async def test_check_answer_racing_the_client_answer_resolves_once(world: World) -> None:
    put = world.prepare(b"race")
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()
    ((header, _),) = checks_sent(world)
    world.resolver.end(world.half_at(put.physical_offset), TxInput.COMMIT)  # client, late
    answer(world, header, TxInput.COMMIT)  # check-back answer
    assert [m.body for m in world.real_messages()] == [b"race"]
    assert world.op_origins() == [0]


async def test_restart_with_halves_in_flight_checks_and_resolves_them(world: World) -> None:
    world.prepare(b"one")
    world.prepare(b"two")
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()  # both checked once, copies at 2 and 3
    world.restart(clean=False)  # offsets table never persisted: a crash
    world.producers[GROUP][0].sent.clear()
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.checked == 2
    sent = checks_sent(world)
    assert [int(b.property_map()["TRANSACTION_CHECK_TIMES"]) for _h, b in sent] == [2, 2]
    for header, _body in sent:
        answer(world, header, TxInput.COMMIT)
    assert sorted(m.body for m in world.real_messages()) == [b"one", b"two"]
    world.restart()
    world.clock.advance(TIMEOUT_MS)
    assert (await world.checker.run_once()).checked == 0


async def test_retention_of_half_records_forgets_their_transactions(world: World) -> None:
    world.prepare()
    world.ledger.drop_below(1)
    assert world.ledger.state(0) is TxState.DISCARDED


async def test_service_start_and_stop(world: World) -> None:
    world.checker.start()
    world.checker.trigger()
    await world.checker.stop()
    await world.checker.stop()


async def test_a_pass_decodes_only_the_newest_records_of_pending_transactions(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    puts = [world.prepare(bytes([n])) for n in range(6)]
    for put in puts[:3]:
        world.resolver.end(world.half_at(put.physical_offset), TxInput.COMMIT)
    world.clock.advance(TIMEOUT_MS)
    await world.checker.run_once()  # checks 3, 4, 5: copies 6, 7, 8 supersede them
    world.resolver.end(world.half_at(puts[3].physical_offset), TxInput.ROLLBACK)
    world.offsets.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, 0, 0)  # walk the whole queue again
    decoded: list[tuple[str, int]] = []
    decode = rec.decode_record

    def counting(data: bytes, offset: int = 0, **kwargs: bool) -> rec.StoredMessage:
        message = decode(data, offset, **kwargs)
        decoded.append((message.topic, message.queue_offset))
        return message

    monkeypatch.setattr(rec, "decode_record", counting)
    world.clock.advance(TIMEOUT_MS)
    report = await world.checker.run_once()
    assert report.scanned == 9
    assert report.checked == 2  # transactions 4 and 5, through their copies 7 and 8
    # Of the 9 records walked, only the two live copies were decoded (9 and 10 are the new
    # copies, read back by put_back).
    walked = [offset for topic, offset in decoded if topic == hm.HALF_TOPIC and offset < 9]
    assert walked == [7, 8]
