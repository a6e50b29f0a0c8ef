"""protocol/record.py: the stored-message layout, its CRC property and the blank marker."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import CorruptRecordError, MessageTooLargeError, ProtocolError
from tidemq.protocol import record as rec

BASE = {
    "topic": "TopicA",
    "queue_id": 3,
    "body": b"hello world",
    "flag": 7,
    "properties": "TAGS\x01tagA\x02KEYS\x01k1 k2\x02",
    "sys_flag": 0,
    "born_timestamp": 1_700_000_000_123,
    "born_host": ("192.168.1.2", 51234),
    "store_timestamp": 1_700_000_000_456,
    "store_host": ("10.0.0.1", 10911),
    "reconsume_times": 2,
    "prepared_transaction_offset": 99,
    "queue_offset": 42,
    "physical_offset": 4096,
}


def encode(**overrides: object) -> bytes:
    values = dict(BASE)
    values.update(overrides)
    return rec.encode_record(**values)  # type: ignore[arg-type]


def java_layout_without_crc(body: bytes, topic: str, props: str) -> bytes:
    """A record as a Java 4.x broker writes it (no __CRC32#), built field by field from §5.1."""
    t, p = topic.encode(), props.encode()
    total = 91 + len(body) + len(t) + len(p)
    return (
        struct.pack(
            ">iIiiiqqiq", total, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, 1, 0, 5, 77, 0, 1
        )
        + bytes([127, 0, 0, 1])
        + struct.pack(">iq", 9876, 2)
        + bytes([10, 0, 0, 9])
        + struct.pack(">iiqi", 10911, 0, 0, len(body))
        + body
        + struct.pack(">b", len(t))
        + t
        + struct.pack(">h", len(p))
        + p
    )


def test_layout_offsets_match_spec() -> None:
    data = encode()
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert struct.unpack_from(">I", data, 4)[0] == 0xDAA320A7
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(b"hello world") & 0x7FFFFFFF
    assert struct.unpack_from(">q", data, 20)[0] == 42
    assert struct.unpack_from(">q", data, 28)[0] == 4096
    assert data[48:52] == bytes([192, 168, 1, 2])
    assert struct.unpack_from(">i", data, 52)[0] == 51234
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_456
    assert struct.unpack_from(">i", data, 84)[0] == 11
    assert data[88:99] == b"hello world"
    assert data[99] == 6
    props_len = struct.unpack_from(">h", data, 106)[0]
    assert len(data) == 91 + 11 + 6 + props_len
    assert data.endswith(b"\x02__CRC32#\x01" + b"%010d" % zlib.crc32(data[:-10]))


def test_decode_round_trip_and_property_map() -> None:
    m = rec.decode_record(encode())
    assert (m.topic, m.queue_id, m.flag, m.queue_offset, m.physical_offset) == (
        "TopicA",
        3,
        7,
        42,
        4096,
    )
    assert m.born_host == ("192.168.1.2", 51234)
    assert m.store_host == ("10.0.0.1", 10911)
    assert (m.reconsume_times, m.prepared_transaction_offset) == (2, 99)
    pm = m.property_map()
    assert pm["TAGS"] == "tagA"
    assert pm["KEYS"] == "k1 k2"
    assert rec.CRC_PROPERTY in pm


def test_encoder_replaces_incoming_crc_property() -> None:
    once = encode(properties="A\x01b\x02__CRC32#\x010000000001\x02C\x01d")
    m = rec.decode_record(once)
    assert m.properties.count(rec.CRC_PROPERTY) == 1
    assert m.property_map()["C"] == "d"
    again = encode(properties=m.properties)
    assert again == once
    assert rec.encoded_properties_size(m.properties) == len(m.properties.encode())


def test_empty_properties_get_only_the_crc() -> None:
    m = rec.decode_record(encode(properties=""))
    assert m.properties.startswith(rec.CRC_PROPERTY)
    assert rec.encoded_properties_size("") == len(m.properties)


def test_every_single_bit_flip_is_detected() -> None:
    data = encode()
    for pos in range(len(data)):
        for bit in (0, 3, 7):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            with pytest.raises(CorruptRecordError):
                rec.decode_record(bytes(damaged), require_crc=True)
            with pytest.raises(CorruptRecordError):
                rec.check_record(bytes(damaged))


def test_record_without_crc_property_checks_body_crc_only() -> None:
    data = java_layout_without_crc(b"payload", "T1", "TAGS\x01x\x02")
    m = rec.decode_record(data)
    assert (m.body, m.topic, m.queue_offset, m.physical_offset) == (b"payload", "T1", 5, 77)
    assert m.born_host == ("127.0.0.1", 9876)
    with pytest.raises(CorruptRecordError, match="lacks"):
        rec.decode_record(data, require_crc=True)
    with pytest.raises(CorruptRecordError, match="lacks"):
        rec.check_record(data)
    bad_body = bytearray(data)
    bad_body[88] ^= 1
    with pytest.raises(CorruptRecordError, match="body CRC"):
        rec.decode_record(bytes(bad_body))
    assert rec.decode_record(bytes(bad_body), verify_crc=False).body != b"payload"


def test_queue_offset_at_reads_the_field_in_place() -> None:
    a, b = encode(queue_offset=7), encode(queue_offset=2**40 + 3, body=b"")
    assert rec.queue_offset_at(a) == 7
    assert rec.queue_offset_at(a + b, len(a)) == 2**40 + 3


def test_decode_records_concatenated_and_truncated() -> None:
    a, b = encode(queue_offset=1), encode(queue_offset=2, body=b"")
    assert [m.queue_offset for m in rec.decode_records(a + b)] == [1, 2]
    assert rec.decode_records(b"") == []
    for cut in (1, 7, 8, 50, len(b) - 1):
        with pytest.raises(CorruptRecordError):
            rec.decode_records(a + b[:cut])


@pytest.mark.parametrize(
    ("pos", "fmt", "value", "match"),
    [
        (4, ">I", 0x12345678, "magic"),
        (0, ">i", 10, "does not fit"),
        (84, ">i", -1, "body length"),
        (84, ">i", 10_000, "does not fit|body length"),
    ],
)
def test_layout_errors(pos: int, fmt: str, value: int, match: str) -> None:
    data = bytearray(encode())
    struct.pack_into(fmt, data, pos, value)
    with pytest.raises(CorruptRecordError, match=match):
        rec.decode_record(bytes(data), verify_crc=False)


def test_topic_and_properties_length_errors() -> None:
    data = bytearray(encode())
    data[99] = 0  # topic length 0
    with pytest.raises(CorruptRecordError, match="topic length"):
        rec.decode_record(bytes(data), verify_crc=False)
    data = bytearray(encode())
    struct.pack_into(">h", data, 106, 3)
    with pytest.raises(CorruptRecordError, match="properties length"):
        rec.decode_record(bytes(data), verify_crc=False)
    data = bytearray(encode())
    data[100] = 0xFF  # invalid UTF-8 in the topic
    with pytest.raises(CorruptRecordError):
        rec.decode_record(bytes(data), verify_crc=False)
    data = bytearray(encode())
    struct.pack_into(">i", data, 36, 0x10)  # IPv6 born host
    with pytest.raises(CorruptRecordError, match="IPv6"):
        rec.decode_record(bytes(data), verify_crc=False)
    with pytest.raises(CorruptRecordError, match="no record head"):
        rec.record_head_at(b"\x00" * 7, 0)
    data = bytearray(encode())
    data[-3] = ord("x")  # non-digit in the CRC digits
    with pytest.raises(CorruptRecordError, match="CRC"):
        rec.decode_record(bytes(data))


def test_encoder_limits_and_hosts() -> None:
    with pytest.raises(ProtocolError):
        encode(topic="t" * 128)
    with pytest.raises(ProtocolError):
        encode(topic="")
    with pytest.raises(MessageTooLargeError):
        encode(properties="k\x01" + "v" * 32_760)
    with pytest.raises(ProtocolError, match="not an IP"):
        encode(born_host=("example.com", 1))
    with pytest.raises(ProtocolError, match="IPv6"):
        encode(store_host=("2001:db8::1", 1))
    m = rec.decode_record(encode(born_host=("::1", 1), store_host=("::ffff:10.1.2.3", 2)))
    assert m.born_host == ("127.0.0.1", 1)
    assert m.store_host == ("10.1.2.3", 2)
    assert rec.decode_record(encode(sys_flag=0x30 | 0x1)).sys_flag == 0x1


def test_blank_marker() -> None:
    marker = rec.encode_blank_marker(100)
    assert len(marker) == rec.BLANK_MARKER_SIZE
    assert rec.record_head_at(marker, 0) == (100, rec.BLANK_MAGIC)
    with pytest.raises(CorruptRecordError, match="magic"):
        rec.record_size_at(marker, 0)
    assert rec.record_size_at(encode()) == len(encode())


hosts = st.tuples(st.ip_addresses(v=4).map(str), st.integers(min_value=0, max_value=65535))
props_text = st.dictionaries(
    st.text(
        alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=8,
    ),
    st.text(
        alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=20,
    ),
    max_size=5,
).map(lambda d: "".join(f"{k}\x01{v}\x02" for k, v in d.items() if k != rec.CRC_PROPERTY))
i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


# encode_record's arguments, any values their fields hold.
record_fields = {
    "topic": st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=127),
    "queue_id": i32,
    "body": st.binary(max_size=300),
    "flag": i32,
    "properties": props_text,
    "sys_flag": st.integers(min_value=0, max_value=0xF).map(lambda f: f & ~0x30),
    "born_timestamp": i64,
    "born_host": hosts,
    "store_timestamp": i64,
    "store_host": hosts,
    "reconsume_times": i32,
    "prepared_transaction_offset": i64,
    "queue_offset": i64,
    "physical_offset": i64,
}


@settings(max_examples=200, deadline=None)
@given(**record_fields)
def test_hypothesis_round_trip(**fields: object) -> None:
    data = rec.encode_record(**fields)  # type: ignore[arg-type]
    m = rec.decode_record(data, require_crc=True)
    assert rec.check_record(data) == len(data) == m.total_size
    for name, value in fields.items():
        if name == "properties":
            continue
        assert getattr(m, name) == value, name
    assert m.properties.startswith(str(fields["properties"]))
    pm = m.property_map()
    pm.pop(rec.CRC_PROPERTY)
    expected = dict(f.split("\x01", 1) for f in str(fields["properties"]).split("\x02") if f)
    assert pm == expected


def layout_spelled_out(**f: object) -> bytes:
    """The record of `f` (encode_record's arguments) built field by field from the layout in
    protocol/record.py's docstring, independently of the encoder: the expected bytes."""
    body, text = f["body"], str(f["properties"])
    assert isinstance(body, bytes)
    if "__CRC32#" in text:  # the encoder drops an incoming CRC pair and writes a fresh one
        text = "".join(
            x + "\x02" for x in text.split("\x02") if x and not x.startswith("__CRC32#\x01")
        )
    if text and not text.endswith("\x02"):
        text += "\x02"
    t, p = str(f["topic"]).encode(), text.encode() + b"__CRC32#\x01"
    born_ip, born_port = f["born_host"]  # type: ignore[misc]
    store_ip, store_port = f["store_host"]  # type: ignore[misc]
    record = (
        struct.pack(">iIiii", 91 + len(body) + len(t) + len(p) + 10, 0xDAA320A7, 0, 0, 0)
        + struct.pack(
            ">qqiq", f["queue_offset"], f["physical_offset"], f["sys_flag"], f["born_timestamp"]
        )
        + bytes(int(part) for part in born_ip.split("."))
        + struct.pack(">iq", born_port, f["store_timestamp"])
        + bytes(int(part) for part in store_ip.split("."))
        + struct.pack(
            ">iiqi", store_port, f["reconsume_times"], f["prepared_transaction_offset"], len(body)
        )
        + body
        + struct.pack(">b", len(t))
        + t
        + struct.pack(">h", len(p) + 10)
        + p
    )
    fixed = bytearray(record)
    struct.pack_into(">iii", fixed, 8, zlib.crc32(body) & 0x7FFFFFFF, f["queue_id"], f["flag"])
    return bytes(fixed) + b"%010d" % zlib.crc32(fixed)


# Properties as clients send them, without the trailing separator, or with a stale CRC pair.
any_props_text = st.one_of(
    props_text,
    props_text.map(lambda t: t.rstrip("\x02")),
    props_text.map(lambda t: f"__CRC32#\x010123456789\x02{t}"),
)


@settings(max_examples=200, deadline=None)
@given(**{**record_fields, "properties": any_props_text})
def test_encoder_bytes_are_the_layout_spelled_out(**fields: object) -> None:
    assert rec.encode_record(**fields) == layout_spelled_out(**fields)  # type: ignore[arg-type]


def test_prepared_record_sizes_before_it_encodes() -> None:
    """The store's path: prepared once (size known for segment fit), encoded with offsets."""

    class Fields:  # what the store passes: any object with the RecordFields attributes
        body = BASE["body"]
        queue_id = BASE["queue_id"]
        flag = BASE["flag"]
        sys_flag = BASE["sys_flag"]
        born_timestamp = BASE["born_timestamp"]
        born_host = BASE["born_host"]
        store_host = BASE["store_host"]
        reconsume_times = BASE["reconsume_times"]
        prepared_transaction_offset = BASE["prepared_transaction_offset"]

    topic = rec.topic_part("TopicA")
    assert topic == b"\x06TopicA"
    prepared = rec.PreparedRecord(Fields(), topic, str(BASE["properties"]))  # type: ignore[arg-type]
    pieces = prepared.encode(42, 4096, 1_700_000_000_456)
    assert len(pieces) == 4
    assert len(pieces[-1]) == rec.CRC_DIGITS_LEN
    assert b"".join(pieces) == layout_spelled_out(**BASE)
    assert prepared.size == len(b"".join(pieces))
    with pytest.raises(MessageTooLargeError):
        rec.PreparedRecord(Fields(), topic, "k\x01" + "v" * 32_760)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"outside 1\.\.127"):
        rec.topic_part("t" * 128)
