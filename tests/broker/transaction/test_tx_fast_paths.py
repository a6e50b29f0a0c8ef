"""The transaction paths that skip work agree with the careful ones they replace.

Prepare builds the pending entry from what it put (not from reading the record back), the half
message's properties by appending to canonical text, and the END path decodes a half's properties
once; `end_many` stores a batch of answers with fewer store calls than answering one by one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tx_harness import GROUP, TOPIC, World, user_message

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction import resolution
from tidemq.broker.transaction.ledger import TransactionForgotten, pending_of
from tidemq.broker.transaction.resolution import RECENT_HALF_AGE_MAX_MS, Answer, EndResult
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput, TxState
from tidemq.clock import FakeClock
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import TAGS, SysFlag, decode_properties, encode_properties
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.types import MessageToStore, PutResult, PutStatus

C, R, U = TxInput.COMMIT, TxInput.ROLLBACK, TxInput.UNKNOWN

PROPERTY_TEXTS = [
    "",
    "TRAN_MSG\x01true\x02",
    "TRAN_MSG\x01true\x02UNIQ_KEY\x01U1\x02KEYS\x01k1 k2\x02",
    "TRAN_MSG\x01true\x02PGROUP\x01FromClient\x02",
    "TRAN_MSG\x01true",  # no trailing separator
    "TRAN_MSG\x01true\x02a\x011\x02a\x012\x02",  # a duplicate key: the later wins
    "TRAN_MSG\x01true\x02empty\x01\x02",  # an empty value is dropped
    "TRAN_MSG\x01true\x02junk\x02",  # a fragment without a separator
    "REAL_TOPIC\x01Elsewhere\x02TRAN_MSG\x01true\x02",  # the client's own REAL_TOPIC
    "TRAN_MSG\x01true\x02REAL_QID\x019\x02",
    "x\x01a\x01b\x02TRAN_MSG\x01true\x02",  # a value holding a name/value separator
]


def careful_half_properties(msg: MessageToStore, group: str) -> str:
    """What to_half_message did before its fast path: decode, update, encode."""
    props = decode_properties(msg.properties)
    props["REAL_TOPIC"] = msg.topic
    props["REAL_QID"] = str(msg.queue_id)
    props.setdefault("PGROUP", group)
    return encode_properties(props)


def message_with(text: str, *, parsed: bool) -> MessageToStore:
    msg = user_message()
    msg.properties = text
    msg.parsed = (text, decode_properties(text)) if parsed else None
    return msg


@pytest.mark.parametrize("parsed", [True, False])
@pytest.mark.parametrize("text", PROPERTY_TEXTS)
def test_half_message_properties_match_the_careful_path(text: str, parsed: bool) -> None:
    msg = message_with(text, parsed=parsed)
    try:
        careful = careful_half_properties(msg, GROUP)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            hm.to_half_message(msg, GROUP)
        return
    half = hm.to_half_message(msg, GROUP)
    assert half.properties == careful
    assert half.parsed is not None
    assert half.parsed[0] is half.properties
    assert half.parsed[1] == decode_properties(half.properties)
    if parsed:
        assert msg.parsed is not None
        assert msg.parsed[1] == decode_properties(text)  # the caller's map is left alone


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"KEYS": ""},
        {"TRAN_PREPARED_QUEUE_OFFSET": "7"},
        {"TRANSACTION_CHECK_TIMES": "3"},
        {"PGROUP": "FromClient", "KEYS": "only-key"},
        {TAGS_CODE_PROPERTY: "5", "__CRC32#": "123"},
        {"SPARK_TXN_NOT_REALLY": "x"},
    ],
)
def test_prepared_entry_matches_the_record_read_back(world: World, extra: dict[str, str]) -> None:
    seen: list[tuple[int, dict[str, str]]] = []
    world.resolver.prepare_listeners.append(lambda origin, props: seen.append((origin, props)))
    msg = user_message(b"p", properties={k: v for k, v in extra.items() if v})
    put = world.resolver.prepare(msg, GROUP)
    assert put.ok
    record = rec.decode_record(world.store.read_record(put.physical_offset) or b"")
    expected = pending_of(record, TxState.PREPARED)
    assert world.ledger.pending(expected.origin) == expected
    ((origin, props),) = seen
    assert origin == hm.origin_of(record)
    stored = record.property_map()
    for own in ("__CRC32#", TAGS_CODE_PROPERTY):
        stored.pop(own, None)
        props = {k: v for k, v in props.items() if k != own}
    assert props == stored


def test_real_message_carries_its_parsed_properties(world: World) -> None:
    put = world.prepare(b"r", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "9", TAGS: "T"})
    half = world.half_at(put.physical_offset)
    real = hm.to_real_message(half)
    assert real.parsed is not None
    assert real.parsed[0] is real.properties
    assert real.parsed[1] == decode_properties(real.properties)
    given = hm.to_real_message(half, half.property_map())
    assert (given.properties, given.topic, given.queue_id) == (
        real.properties,
        real.topic,
        real.queue_id,
    )


@pytest.mark.parametrize("outcome", list(hm.Outcome))
def test_op_message_properties_are_the_encoded_pair(outcome: hm.Outcome) -> None:
    op = hm.op_message([3, 4], outcome, store_host=("127.0.0.1", 1), now_ms=5)
    expected = encode_properties({TAGS: hm.OP_TAG, hm.OUTCOME_PROPERTY: outcome.value})
    assert op.properties == expected
    assert op.parsed == (expected, decode_properties(expected))


# -- end_many against end, one answer at a time ------------------------------------------------

ANSWERS = [(0, C), (1, R), (2, C), (0, C), (3, U), (2, R), (4, C), (5, R), (4, U), (6, C)]


def prepared_world(root: Path, clock: FakeClock) -> World:
    world = World(root, clock)
    for n in range(7):
        world.prepare(bytes([n]), queue_id=n % 3)
    return world


def half_offsets(world: World) -> list[int]:
    return [entry.physical_offset for entry in world.ledger.pending_list()]


def summary(result: EndResult | Exception) -> tuple[object, ...]:
    if isinstance(result, Exception):
        return (type(result).__name__, str(result))
    return (result.state, result.duplicate, result.stored is not None, result.failure)


def op_outcomes(world: World) -> list[tuple[int, str]]:
    return sorted(
        (origin, hm.outcome_of_op(op).value)
        for op in world.records(hm.OP_TOPIC)
        for origin in hm.parse_op_body(op.body)
    )


def visible(world: World) -> list[list[bytes]]:
    return [[m.body for m in world.records(TOPIC, queue_id)] for queue_id in range(3)]


def one_by_one(world: World, answers: list[tuple[int, TxInput]]) -> list[EndResult | Exception]:
    """`world`'s results of `end` for each (half offset, answer), an exception as its result."""
    results: list[EndResult | Exception] = []
    for offset, tx_input in answers:
        try:
            results.append(world.resolver.end(world.half_at(offset), tx_input))
        except (IllegalStateTransition, TransactionForgotten) as exc:
            results.append(exc)
    return results


def assert_same_stores(batched: World, single: World) -> None:
    """What the two worlds stored agrees, and so do their ledgers after a restart."""
    assert visible(batched) == visible(single)
    assert batched.stats == single.stats
    assert op_outcomes(batched) == op_outcomes(single)
    for world in (batched, single):
        world.restart()
    assert [batched.ledger.state(n) for n in range(7)] == [single.ledger.state(n) for n in range(7)]


def test_end_many_agrees_with_answering_one_by_one(tmp_path: Path, clock: FakeClock) -> None:
    batched, single = prepared_world(tmp_path / "a", clock), prepared_world(tmp_path / "b", clock)
    try:
        halves = [batched.half_at(offset) for offset in half_offsets(batched)]
        results = batched.resolver.end_many([Answer.of(halves[n], i) for n, i in ANSWERS])
        expected = one_by_one(single, [(halves[n].physical_offset, i) for n, i in ANSWERS])
        assert [summary(r) for r in results] == [summary(r) for r in expected]
        # Fewer op records, the same outcomes (assert_same_stores).
        assert len(batched.records(hm.OP_TOPIC)) < len(single.records(hm.OP_TOPIC))
        assert_same_stores(batched, single)
        assert batched.ledger.state(0) is TxState.COMMITTED
        assert batched.ledger.state(3) is TxState.PREPARED
    finally:
        batched.close()
        single.close()


def test_end_many_reports_a_store_refusal_per_answer(world: World) -> None:
    halves = [world.half_at(world.prepare(bytes([n])).physical_offset) for n in range(3)]
    world.disk_full = True
    world.clock.advance(1_001)
    results = world.resolver.end_many([Answer.of(halves[0], C), Answer.of(halves[1], R)])
    for result in results:
        assert isinstance(result, EndResult)
        assert result.failure is not None
        assert result.failure.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert result.state is TxState.PREPARED
    assert world.ledger.in_flight == 3
    assert world.real_messages() == []


def test_end_many_stores_a_run_across_queues_with_one_put_and_refuses_per_message(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real messages of a run (any queues, arrival order) are one put_each; a message the
    store refuses leaves only its transaction pending, and the op lists the others."""
    halves = [
        world.half_at(world.prepare(bytes([n]), queue_id=n % 3).physical_offset) for n in range(4)
    ]
    put_each = world.store.put_each
    calls: list[list[bytes]] = []

    def refuse_second(msgs: list[MessageToStore]) -> list[PutResult]:
        calls.append([m.body for m in msgs])
        results = put_each([m for m in msgs if m.body != bytes([1])])
        refused = PutResult(PutStatus.MESSAGE_ILLEGAL, error="refused")
        return [*results[:1], refused, *results[1:]] if len(msgs) == 4 else results

    monkeypatch.setattr(world.store, "put_each", refuse_second)
    results = world.resolver.end_many([Answer.of(h, C) for h in halves])
    assert calls == [[bytes([n]) for n in range(4)]]
    states = [r.state for r in results if isinstance(r, EndResult)]
    assert states == [TxState.COMMITTED, TxState.PREPARED, TxState.COMMITTED, TxState.COMMITTED]
    failure = results[1].failure if isinstance(results[1], EndResult) else None
    assert failure is not None
    assert failure.status is PutStatus.MESSAGE_ILLEGAL
    assert world.op_origins() == [0, 2, 3]
    assert world.ledger.in_flight == 1
    real = sorted((m.queue_id, m.body) for q in range(3) for m in world.records(TOPIC, q))
    assert real == [(0, bytes([0])), (0, bytes([3])), (2, bytes([2]))]


def test_a_round_whose_op_was_lost_is_repaired_at_start(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker died after storing a round's real messages and before its op message."""
    halves = [
        world.half_at(world.prepare(bytes([n]), queue_id=n % 2).physical_offset) for n in range(4)
    ]
    put = world.store.put_message

    def lose_ops(msg: MessageToStore) -> PutResult:
        if msg.topic == hm.OP_TOPIC:
            return PutResult(PutStatus.UNKNOWN_ERROR, error="lost")
        return put(msg)

    monkeypatch.setattr(world.store, "put_message", lose_ops)
    results = world.resolver.end_many([Answer.of(h, C) for h in halves])
    assert all(isinstance(r, EndResult) and r.stored is not None for r in results)
    monkeypatch.undo()
    assert world.op_origins() == []
    world.restart()
    assert [world.ledger.state(n) for n in range(4)] == [TxState.COMMITTED] * 4
    assert sorted(world.op_origins()) == [0, 1, 2, 3]
    assert sum(len(world.records(TOPIC, q)) for q in range(2)) == 4


# -- an END right after its prepare: the half message from memory, not from the store ------------


@pytest.mark.parametrize(
    ("sys_flag", "born_host", "extra"),
    [
        (0, ("10.0.0.7", 5555), {}),
        (SysFlag.PREPARED | SysFlag.BORNHOST_V6, ("::ffff:10.0.0.8", 1), {}),
        (
            SysFlag.MULTI_TAGS,
            ("::1", 2),
            {TAGS_CODE_PROPERTY: "5", "CHECK_IMMUNITY_TIME_IN_SECONDS": "3"},
        ),
        (0, ("10.0.0.9", 3), {"TRANSACTION_CHECK_TIMES": "2", "TRAN_PREPARED_QUEUE_OFFSET": "0"}),
    ],
)
def test_a_recent_half_commits_the_same_record_as_one_read_back(
    tmp_path: Path,
    clock: FakeClock,
    sys_flag: int,
    born_host: tuple[str, int],
    extra: dict[str, str],
) -> None:
    worlds = World(tmp_path / "recent", clock), World(tmp_path / "read", clock)
    try:
        answers = []
        for world in worlds:
            world.prepare(b"first")  # so that the tested half's offsets are not all 0
            msg = user_message(b"same", properties=extra)
            msg.sys_flag, msg.born_host = sys_flag, born_host
            put = world.resolver.prepare(msg, GROUP)
            assert put.ok
            if world is worlds[1]:
                world.resolver._recent.clear()  # as for an END that comes late
            answer = world.resolver.answer_at(put.physical_offset, C)
            assert answer is not None
            answers.append(answer)
        recent, read = answers
        assert recent.put is not None
        assert read.half is not None
        assert (recent.origin, recent.queue_offset, recent.physical_offset) == (
            read.origin,
            read.queue_offset,
            read.physical_offset,
        )
        for own in ("__CRC32#", TAGS_CODE_PROPERTY):
            recent.props.pop(own, None)
            read.props.pop(own, None)
        assert recent.props == read.props
        records = []
        for world, answer in zip(worlds, answers, strict=True):
            (result,) = world.resolver.end_many([answer])
            assert isinstance(result, EndResult)
            assert result.stored is not None
            records.append(world.store.read_record(result.stored.physical_offset))
        assert records[0] == records[1]
    finally:
        for world in worlds:
            world.close()


def test_an_old_half_is_read_back(world: World) -> None:
    put = world.prepare()
    world.clock.advance(RECENT_HALF_AGE_MAX_MS + 1)
    answer = world.resolver.answer_at(put.physical_offset, C)
    assert answer is not None
    assert answer.half is not None
    assert world.resolver.answer_at(put.physical_offset + 1, C) is None


def test_recent_halves_are_bounded(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolution, "RECENT_HALVES_MAX", 2)
    puts = [world.prepare(bytes([n])) for n in range(3)]
    assert list(world.resolver._recent) == [p.physical_offset for p in puts[1:]]
    first = world.resolver.answer_at(puts[0].physical_offset, C)
    assert first is not None
    assert first.half is not None  # forgotten: read back


@pytest.mark.parametrize("seed", range(8))
def test_end_many_agrees_with_one_by_one_on_random_answers(
    tmp_path: Path, clock: FakeClock, seed: int
) -> None:
    rng = random.Random(seed)
    batched, single = prepared_world(tmp_path / "a", clock), prepared_world(tmp_path / "b", clock)
    try:
        offsets = half_offsets(batched)
        for _round in range(3):
            answers = [
                (rng.randrange(len(offsets)), rng.choice((C, C, R, U)))
                for _ in range(rng.randrange(1, 12))
            ]
            results = batched.resolver.end_many(
                [Answer.of(batched.half_at(offsets[n]), i) for n, i in answers]
            )
            expected = one_by_one(single, [(offsets[n], i) for n, i in answers])
            assert [summary(r) for r in results] == [summary(r) for r in expected], answers
        assert_same_stores(batched, single)
    finally:
        batched.close()
        single.close()
