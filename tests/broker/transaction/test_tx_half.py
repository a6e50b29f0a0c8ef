"""Half, real, op, copy and check-body messages (half.py): pure rewrites."""

from __future__ import annotations

import pytest
from tx_harness import GROUP, STORE_HOST, TOPIC, World, user_message

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.states import TxInput
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import SysFlag, decode_properties, tag_code


def test_half_message_goes_to_queue_0_of_the_half_topic_with_the_real_destination() -> None:
    msg = user_message(properties={"PGROUP": "FromClient"})
    msg.sys_flag = SysFlag.PREPARED | SysFlag.MULTI_TAGS
    half = hm.to_half_message(msg, GROUP)
    props = decode_properties(half.properties)
    assert (half.topic, half.queue_id) == (hm.HALF_TOPIC, 0)
    assert props["REAL_TOPIC"] == TOPIC
    assert props["REAL_QID"] == "1"
    assert props["PGROUP"] == "FromClient"  # the client's own wins
    assert SysFlag.transaction_type(half.sys_flag) == SysFlag.TRANSACTION_NOT
    assert half.sys_flag & SysFlag.MULTI_TAGS
    assert half.body == msg.body


def test_half_message_gets_pgroup_from_the_header_when_the_client_sets_only_tran_msg() -> None:
    props = decode_properties(hm.to_half_message(user_message(), GROUP).properties)
    assert props["PGROUP"] == GROUP


def test_real_message_keeps_the_listed_fields_and_strips_half_only_properties(
    world: World,
) -> None:
    put = world.prepare(b"body-1", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "9"})
    half = world.half_at(put.physical_offset)
    copy = world.resolver.put_back(half, 2)
    assert copy is not None
    real = hm.to_real_message(copy)
    props = decode_properties(real.properties)
    assert (real.topic, real.queue_id) == (TOPIC, 1)
    assert real.body == b"body-1"
    assert real.flag == 3
    assert real.born_timestamp == 1_600_000_000_000
    assert real.born_host == ("10.0.0.7", 5555)
    assert real.store_host == STORE_HOST
    assert real.prepared_transaction_offset == copy.physical_offset
    assert SysFlag.transaction_type(real.sys_flag) == SysFlag.COMMIT
    assert real.store_timestamp is None  # the commit's own store time
    assert real.tags_code is None  # recomputed from TAGS by the store
    for kept in ("KEYS", "TAGS", "UNIQ_KEY", "user", "PGROUP"):
        assert kept in props
    for stripped in hm.HALF_ONLY_PROPERTIES:
        assert stripped not in props
    assert "__CRC32#" in copy.properties  # the store's property was there to strip


def test_committed_record_has_the_recomputed_tag_code(world: World) -> None:
    put = world.prepare()
    world.resolver.end(world.half_at(put.physical_offset), TxInput.COMMIT)
    (real,) = world.real_messages()
    cq = world.store.get_messages(TOPIC, 1, 0, 1, tag_codes=frozenset({tag_code("TagA")}))
    assert len(cq.records) == 1
    assert real.properties.count("__CRC32#") == 1


@pytest.mark.parametrize(
    ("body", "offsets"),
    [(b"17", [17]), (b"17,18,19,", [17, 18, 19]), (b"0", [0]), (b"5,", [5]), (b" 4 ", [4])],
)
def test_op_body_both_forms(body: bytes, offsets: list[int]) -> None:
    assert hm.parse_op_body(body) == offsets


@pytest.mark.parametrize("body", [b"", b",", b"a", b"1,,2", b"-1", b"\xff", b"1;2"])
def test_op_body_junk_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        hm.parse_op_body(body)


def test_op_body_offset_count_is_capped() -> None:
    body = hm.encode_op_body(list(range(hm.OP_BODY_OFFSETS_MAX + 1)))
    with pytest.raises(ProtocolError):
        hm.parse_op_body(body)
    assert len(hm.parse_op_body(hm.encode_op_body(list(range(hm.OP_BODY_OFFSETS_MAX))))) == (
        hm.OP_BODY_OFFSETS_MAX
    )


def test_op_message_round_trip() -> None:
    assert hm.encode_op_body([17]) == b"17"
    assert hm.encode_op_body([17, 18]) == b"17,18,"
    op = hm.op_message([7], hm.Outcome.COMMIT, store_host=STORE_HOST, now_ms=5)
    props = decode_properties(op.properties)
    assert (op.topic, op.queue_id, props["TAGS"]) == (hm.OP_TOPIC, 0, "d")
    assert props[hm.OUTCOME_PROPERTY] == "COMMIT"


def test_check_copy_carries_origin_count_and_first_store_time(world: World) -> None:
    put = world.prepare()
    half = world.half_at(put.physical_offset)
    world.clock.advance(10_000)
    copy = world.resolver.put_back(half, 1)
    assert copy is not None
    again = world.resolver.put_back(copy, 2)
    assert again is not None
    assert hm.origin_of(again) == half.queue_offset == 0
    assert again.queue_offset == 2
    assert hm.check_times_of(again) == 2
    assert again.store_timestamp == half.store_timestamp


def test_check_body_is_the_copy_with_its_real_topic_and_queue(world: World) -> None:
    put = world.prepare()
    copy = world.resolver.put_back(world.half_at(put.physical_offset), 1)
    assert copy is not None
    body = rec.decode_record(hm.check_body(copy))
    assert (body.topic, body.queue_id) == (TOPIC, 1)
    assert (body.queue_offset, body.physical_offset) == (copy.queue_offset, copy.physical_offset)
    assert body.property_map()["PGROUP"] == GROUP
    assert body.property_map()["UNIQ_KEY"] == copy.property_map()["UNIQ_KEY"]


def test_immunity_parsing(world: World) -> None:
    for text, expected in [("5", 5000), ("-1", None), ("x", None)]:
        put = world.prepare(text.encode(), properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": text})
        assert hm.immunity_ms_of(world.half_at(put.physical_offset)) == expected


def test_upstream_op_without_outcome_reads_as_rollback(world: World) -> None:
    op = hm.op_message([1], hm.Outcome.COMMIT, store_host=STORE_HOST, now_ms=1)
    op.properties = "TAGS\x01d\x02"
    put = world.store.put_message(op)
    data = world.store.read_record(put.physical_offset)
    assert data is not None
    assert hm.outcome_of_op(rec.decode_record(data)) is hm.Outcome.ROLLBACK
