"""Message helpers: properties codec, tag hash and filter, flags, ids, batch body, names, enums."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.message import (
    BatchItem,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    Perm,
    SysFlag,
    UniqueKeyGenerator,
    decode_batch,
    decode_offset_msg_id,
    decode_properties,
    deflate,
    dlq_topic,
    encode_batch,
    encode_properties,
    group_of_retry_topic,
    inflate,
    is_system_topic,
    java_string_hash,
    offset_msg_id,
    parse_tag_expression,
    retry_topic,
    tag_code,
    validate_group,
    validate_topic,
)

PROPERTY_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"),
    min_size=1,
    max_size=12,
)

# ---------------------------------------------------------------------------------------------
# Properties


@given(props=st.dictionaries(PROPERTY_TEXT, PROPERTY_TEXT, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    text = encode_properties(props)
    assert decode_properties(text) == props
    # Java ≥ 4.9.3 omits the trailing separator; both forms must parse.
    assert decode_properties(text.removesuffix("\x02")) == props


def test_properties_encoding_has_trailing_separator() -> None:
    assert (
        encode_properties({"TAGS": "TagA", "KEYS": "k1 k2"}) == "TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    )
    assert encode_properties({}) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("\x02", {}),
        ("TAGS\x01TagA", {"TAGS": "TagA"}),
        ("junk\x02TAGS\x01TagA\x02", {"TAGS": "TagA"}),  # fragment without a separator
        ("\x01v\x02K\x01\x02A\x01b", {"A": "b"}),  # empty key, empty value
        ("K\x01a\x01b\x02", {"K": "a\x01b"}),  # the first separator splits
        ("K\x011\x02K\x012\x02", {"K": "2"}),  # the later duplicate wins
        ("\x02\x02A\x01b\x02\x02", {"A": "b"}),
    ],
)
def test_properties_decoding_edge_cases(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize("props", [{"": "v"}, {"k": ""}, {"k\x01": "v"}, {"k": "v\x02"}])
def test_properties_that_would_not_survive_are_refused(props: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        encode_properties(props)


# ---------------------------------------------------------------------------------------------
# Tag hash and tag expressions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("ab", 97 * 31 + 98),  # 3105
        ("TagA", 84 * 31**3 + 97 * 31**2 + 103 * 31 + 65),  # 2598919
        ("TagB", 2598920),
        ("*", 42),
        # 31^6 overflows: h("polygenelubricants") is Java's well-known Integer.MIN_VALUE.
        ("polygenelubricants", -(2**31)),
        # A code point beyond the BMP counts as two UTF-16 units (0xD83D, 0xDE00).
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
        ("é", 0xE9),
    ],
)
def test_java_string_hash_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


@given(text=st.text(max_size=30))
def test_java_string_hash_is_signed_32_bit_polynomial(text: str) -> None:
    units = struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be"))
    expected = sum(unit * 31 ** (len(units) - 1 - i) for i, unit in enumerate(units)) % 2**32
    if expected >= 2**31:
        expected -= 2**32
    assert java_string_hash(text) == expected


def test_tag_code_of_no_tag_is_zero() -> None:
    assert tag_code(None) == 0
    assert tag_code("") == 0
    assert tag_code("TagA") == 2598919


@pytest.mark.parametrize("expression", [None, "", "*", "  *  "])
def test_tag_expression_all(expression: str | None) -> None:
    tag_filter = parse_tag_expression(expression)
    assert tag_filter.tags is None
    assert tag_filter.matches_all
    assert tag_filter.matches_code(12345)
    assert tag_filter.matches_tag(None)


def test_tag_expression_list() -> None:
    tag_filter = parse_tag_expression("TagA || TagB||  TagC ")
    assert tag_filter.tags == frozenset({"TagA", "TagB", "TagC"})
    assert tag_filter.codes == frozenset(java_string_hash(t) for t in ("TagA", "TagB", "TagC"))
    assert tag_filter.matches_code(2598919)
    assert not tag_filter.matches_code(0)
    assert tag_filter.matches_tag("TagB")
    assert not tag_filter.matches_tag("TagD")
    assert not tag_filter.matches_tag(None)


def test_tag_expression_without_tags_is_refused() -> None:
    with pytest.raises(ProtocolError):
        parse_tag_expression(" || ")


# ---------------------------------------------------------------------------------------------
# Flags


def test_sys_flag_transaction_type() -> None:
    flag = SysFlag.COMPRESSED | SysFlag.PREPARED
    assert SysFlag.transaction_type(flag) == SysFlag.PREPARED
    committed = SysFlag.with_transaction_type(flag, SysFlag.COMMIT)
    assert committed == SysFlag.COMPRESSED | SysFlag.COMMIT
    assert SysFlag.transaction_type(SysFlag.ROLLBACK | SysFlag.MULTI_TAGS) == SysFlag.ROLLBACK
    assert SysFlag.transaction_type(SysFlag.COMPRESSED) == SysFlag.TRANSACTION_NOT


def test_perm() -> None:
    assert Perm.is_readable(6)
    assert Perm.is_writable(6)
    assert not Perm.is_inherited(6)
    assert Perm.is_inherited(7)
    assert not Perm.is_writable(Perm.READ)
    assert not Perm.is_readable(Perm.WRITE)
    assert Perm.to_text(6) == "RW-"
    assert Perm.to_text(7) == "RWX"


# ---------------------------------------------------------------------------------------------
# Message ids


def test_offset_msg_id_example_from_the_spec() -> None:
    assert offset_msg_id("127.0.0.1", 20911, 0) == "7F000001000051AF0000000000000000"
    assert decode_offset_msg_id("7F000001000051AF0000000000000000") == ("127.0.0.1", 20911, 0)


@given(
    host=st.ip_addresses().map(str),
    port=st.integers(0, 65535),
    offset=st.integers(0, 2**63 - 1),
)
def test_offset_msg_id_round_trip(host: str, port: int, offset: int) -> None:
    msg_id = offset_msg_id(host, port, offset)
    assert len(msg_id) in (32, 56)
    assert msg_id == msg_id.upper()
    assert decode_offset_msg_id(msg_id) == (host, port, offset)
    # Lower case is accepted on input.
    assert decode_offset_msg_id(msg_id.lower()) == (host, port, offset)


@pytest.mark.parametrize("bad", ["", "7F00", "Z" * 32, "7F000001000051AF000000000000000", "0" * 40])
def test_bad_offset_msg_id(bad: str) -> None:
    with pytest.raises(ProtocolError):
        decode_offset_msg_id(bad)


def test_offset_msg_id_needs_an_ip() -> None:
    with pytest.raises(ProtocolError):
        offset_msg_id("localhost", 10911, 0)


def test_unique_keys_are_unique_and_32_hex() -> None:
    generator = UniqueKeyGenerator("127.0.0.1", 4242)
    now_ms = 1_700_000_000_000
    keys = [generator.next(now_ms + i // 1000) for i in range(20_000)]
    assert len(set(keys)) == len(keys)
    for key in keys[:10]:
        assert len(key) == 32
        assert key == key.upper()
        int(key, 16)
    assert keys[0].startswith("7F000001" + f"{4242:04X}")


def test_unique_keys_of_different_processes_differ() -> None:
    now_ms = 1_700_000_000_000
    first = UniqueKeyGenerator("10.0.0.1", 1).next(now_ms)
    assert first != UniqueKeyGenerator("10.0.0.1", 2).next(now_ms)
    assert first != UniqueKeyGenerator("10.0.0.2", 1).next(now_ms)
    assert first != UniqueKeyGenerator("10.0.0.1", 1, instance=7).next(now_ms)


def test_unique_key_time_restarts_each_month() -> None:
    generator = UniqueKeyGenerator("127.0.0.1", 1)
    # 2024-03-01T00:00:00Z and one second later.
    start = 1_709_251_200_000
    assert generator.next(start)[20:28] == "00000000"
    assert generator.next(start + 1000)[20:28] == f"{1000:08X}"
    assert generator.next(start - 1)[20:28] != "00000000"  # February again


# ---------------------------------------------------------------------------------------------
# Batch body and zlib

BATCH_ITEMS = st.lists(
    st.builds(
        BatchItem,
        flag=st.integers(-(2**31), 2**31 - 1),
        body=st.binary(max_size=64),
        properties=st.text(max_size=32),
    ),
    max_size=6,
)


@given(items=BATCH_ITEMS)
def test_batch_round_trip(items: list[BatchItem]) -> None:
    assert decode_batch(encode_batch(items)) == items


def _cpp_batch_item(flag: int, body: bytes, properties: str) -> bytes:
    """One item laid out by hand from spec §5.4 (independent of encode_batch)."""
    props = properties.encode()
    total = 20 + len(body) + 2 + len(props)
    return (
        struct.pack(">iiiii", total, 0, 0, flag, len(body))
        + body
        + struct.pack(">h", len(props))
        + props
    )


def test_compressed_cpp_style_batch() -> None:
    body = b"".join(
        _cpp_batch_item(0, b"x" * 3000 + bytes([i]), f"UNIQ_KEY\x01K{i}\x02WAIT\x01true\x02")
        for i in range(3)
    )
    compressed = zlib.compress(body, 5)
    assert len(compressed) < len(body)
    items = decode_batch(inflate(compressed))
    assert [item.body[-1] for item in items] == [0, 1, 2]
    assert items[2].properties == "UNIQ_KEY\x01K2\x02WAIT\x01true\x02"
    assert all(item.flag == 0 and len(item.body) == 3001 for item in items)


def test_batch_ignores_total_size_magic_and_crc() -> None:
    item = bytearray(_cpp_batch_item(3, b"abc", "A\x01b"))
    item[0:12] = b"\xff" * 12
    assert decode_batch(bytes(item)) == [BatchItem(flag=3, body=b"abc", properties="A\x01b")]


def test_batch_truncated_anywhere_is_an_error_or_a_prefix() -> None:
    items = [BatchItem(1, b"hello", "K\x01v\x02"), BatchItem(2, b"", ""), BatchItem(3, b"z", "Q")]
    body = encode_batch(items)
    boundaries = {0}
    for index in range(len(items)):
        boundaries.add(len(encode_batch(items[: index + 1])))
    for cut in range(len(body)):
        if cut in boundaries:
            assert decode_batch(body[:cut]) == items[: sorted(boundaries).index(cut)]
        else:
            with pytest.raises(ProtocolError):
                decode_batch(body[:cut])


def test_batch_negative_lengths_and_bad_utf8() -> None:
    with pytest.raises(ProtocolError):
        decode_batch(struct.pack(">iiiii", 0, 0, 0, 0, -1) + b"\x00\x00")
    with pytest.raises(ProtocolError):
        decode_batch(struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", -2))
    with pytest.raises(ProtocolError):
        decode_batch(struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", 1) + b"\xff")


@given(data=st.binary(max_size=200))
def test_batch_decoder_raises_only_protocol_error(data: bytes) -> None:
    try:
        decode_batch(data)
    except ProtocolError:
        pass


def test_deflate_inflate() -> None:
    data = b"0123456789" * 1000
    assert inflate(deflate(data)) == data
    assert inflate(deflate(b"")) == b""


@pytest.mark.parametrize("bad", [b"", b"not zlib", zlib.compress(b"x" * 100)[:-3]])
def test_inflate_rejects_bad_streams(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        inflate(bad)


def test_inflate_caps_the_output() -> None:
    bomb = zlib.compress(b"\x00" * 100_000)
    with pytest.raises(ProtocolError, match="exceeds"):
        inflate(bomb, size_max=99_999)
    assert len(inflate(bomb, size_max=100_000)) == 100_000


# ---------------------------------------------------------------------------------------------
# Names


def test_retry_and_dlq_names() -> None:
    assert retry_topic("CG") == "%RETRY%CG"
    assert dlq_topic("CG") == "%DLQ%CG"
    assert group_of_retry_topic("%RETRY%CG") == "CG"
    assert group_of_retry_topic("TopicA") is None
    assert group_of_retry_topic("%RETRY%") is None


@pytest.mark.parametrize("name", ["TopicA", "%RETRY%CG_1", "a|b", "x-y_z", "T" * 127])
def test_valid_topics(name: str) -> None:
    validate_topic(name)


@pytest.mark.parametrize("name", ["", "   ", "Topic A", "topic.a", "tópico", "T" * 128, "a/b"])
def test_invalid_topics(name: str) -> None:
    with pytest.raises(ProtocolError, match="topic"):
        validate_topic(name)


def test_group_rules() -> None:
    validate_group("CG_TEST")
    with pytest.raises(ProtocolError, match="group"):
        validate_group("bad group")
    with pytest.raises(ProtocolError, match="group"):
        validate_group("G" * 121)


def test_system_topics_clients_may_not_send_to() -> None:
    for name in (
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    ):
        assert is_system_topic(name)
    for name in ("TBW102", "RMQ_SYS_TRACE_TOPIC", "TopicA", "%RETRY%CG"):
        assert not is_system_topic(name)


# ---------------------------------------------------------------------------------------------
# Enums


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET),
        ("4", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
        ("CONSUME_FROM_TIMESTAMP", ConsumeFromWhere.CONSUME_FROM_TIMESTAMP),
        ("consume_from_min_offset", ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET),
        (" 5 ", ConsumeFromWhere.CONSUME_FROM_TIMESTAMP),
    ],
)
def test_consume_from_where_parse(value: int | str, expected: ConsumeFromWhere) -> None:
    assert ConsumeFromWhere.parse(value) is expected


def test_enum_parse_other_enums() -> None:
    assert MessageModel.parse(1) is MessageModel.CLUSTERING
    assert MessageModel.parse("BROADCASTING") is MessageModel.BROADCASTING
    assert ConsumeType.parse("0") is ConsumeType.CONSUME_ACTIVELY
    assert ConsumeType.parse("CONSUME_PASSIVELY") is ConsumeType.CONSUME_PASSIVELY


@pytest.mark.parametrize("bad", [6, -1, "6", "LATEST", "", True])
def test_enum_parse_rejects(bad: int | str) -> None:
    with pytest.raises(ProtocolError):
        ConsumeFromWhere.parse(bad)


def test_batch_item_properties_over_the_int16_limit_are_refused() -> None:
    with pytest.raises(ProtocolError, match="exceed"):
        encode_batch([BatchItem(0, b"", "x" * 32_768)])


def test_unique_key_generator_needs_an_ip_and_crosses_the_year() -> None:
    with pytest.raises(ProtocolError):
        UniqueKeyGenerator("not-an-ip", 1)
    generator = UniqueKeyGenerator("::1", 1)
    # 2023-12-31T23:59:59Z, then 2024-01-01T00:00:00Z: the month origin moves forward.
    assert generator.next(1_704_067_199_000)[20:28] == f"{30 * 86_400_000 + 86_399_000:08X}"
    assert generator.next(1_704_067_200_000)[20:28] == "00000000"


def test_dlq_topic_detection() -> None:
    from tidemq.protocol.message import is_dlq_topic, is_retry_topic

    assert is_dlq_topic("%DLQ%CG")
    assert not is_dlq_topic("%RETRY%CG")
    assert is_retry_topic("%RETRY%CG")
