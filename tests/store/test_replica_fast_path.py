"""A slave's append reads its master's records the fast way (issue 13, store/replica.py): each
record by `rec.placed_record_at` (every check `decode_record(require_crc=True)` makes, only the
fields dispatch needs decoded), each run dispatched by `Appender.dispatch_placed_run` (a queue's
entries in one write). Both must be exactly what the careful way gives: the same records taken
and refused, the same consume queues and index, the same events and outcomes.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path
from typing import Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import Opener

from tidemq.errors import CorruptRecordError, ReplicaCorruptError
from tidemq.protocol import record as rec
from tidemq.protocol.message import SysFlag
from tidemq.store import DispatchEvent, FileMessageStore
from tidemq.store.append import send_events
from tidemq.store.consume_queue import PutAt
from tidemq.store.dispatch_retry import notify_listeners
from tidemq.store.mapped_file import MappedFile

FIELDS: Final[dict[str, object]] = {
    "topic": "TopicA",
    "queue_id": 3,
    "body": b"hello world",
    "flag": 7,
    "properties": "TAGS\x01tagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02",
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
    return rec.encode_record(**{**FIELDS, **overrides})  # type: ignore[arg-type]


def careful(buf: bytes, pos: int, physical_offset: int, room: int) -> rec.PlacedRecord | None:
    """What placed_record_at must answer, the careful way: decode_record, then the offset and
    segment-fit checks commit_log.unit_at makes."""
    try:
        m = rec.decode_record(buf, pos, require_crc=True)
    except CorruptRecordError:
        return None
    if m.physical_offset != physical_offset or m.total_size > room:
        return None
    return rec.PlacedRecord(
        m.total_size,
        m.queue_id,
        m.queue_offset,
        m.physical_offset,
        m.sys_flag,
        m.store_timestamp,
        m.topic,
        m.properties,
    )


def assert_agrees(
    buf: bytes, pos: int = 0, physical_offset: int = 4096, room: int = 1 << 20
) -> None:
    expected = careful(buf, pos, physical_offset, room)
    with memoryview(buf) as view:
        assert rec.placed_record_at(view, pos, physical_offset, room) == expected
    assert rec.placed_record_at(buf, pos, physical_offset, room) == expected


def with_record_crc(record: bytearray) -> bytes:
    """`record` with only its whole-record CRC digits made right again (BODYCRC as it is)."""
    record = bytearray(record)
    record[-10:] = b"%010d" % zlib.crc32(record[:-10])
    return bytes(record)


def with_crcs(record: bytearray) -> bytes:
    """`record` with BODYCRC and the whole-record CRC digits made right again (a damage that
    only the layout checks can catch)."""
    (body_len,) = struct.unpack_from(">i", record, 84)
    if 0 <= body_len <= len(record) - 88:
        body_crc = zlib.crc32(record[88 : 88 + body_len]) & 0x7FFFFFFF
        struct.pack_into(">i", record, 8, body_crc)
    record[-10:] = b"%010d" % zlib.crc32(record[:-10])
    return bytes(record)


def test_a_valid_record_is_read_as_decode_record_reads_it() -> None:
    data = encode()
    placed = rec.placed_record_at(memoryview(data), 0, 4096, len(data))
    assert placed is not None
    assert placed == careful(data, 0, 4096, len(data))
    assert (placed.topic, placed.queue_offset, placed.total_size) == ("TopicA", 42, len(data))
    assert placed.properties.endswith("\x02__CRC32#\x01" + data[-10:].decode())
    # In a longer buffer, at a position; with the room it needs and no byte less.
    buf = b"x" * 5 + data + encode(queue_offset=43, physical_offset=4096 + len(data))
    assert_agrees(buf, 5, room=len(data))
    assert rec.placed_record_at(buf, 5, 4096, len(data) - 1) is None
    assert_agrees(buf, 5 + len(data), physical_offset=4096 + len(data))


def test_every_damaged_byte_and_every_cut_is_refused() -> None:
    data = encode()
    for pos in range(len(data)):
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[pos] ^= bit
            assert_agrees(bytes(damaged))
            assert_agrees(with_record_crc(damaged))  # BODYCRC or the layout must catch it
            assert_agrees(with_crcs(damaged))  # the layout alone must catch it
    for cut in range(len(data)):
        assert_agrees(data[:cut])
    assert_agrees(data, physical_offset=4097)


def test_layouts_only_decode_record_would_refuse() -> None:
    data = bytearray(encode())
    struct.pack_into(">i", data, 36, int(SysFlag.BORNHOST_V6))  # IPv6 hosts
    assert_agrees(with_crcs(data))
    topic_at = 88 + len(b"hello world") + 1
    for topic_len in (0, 0x80, 0xFF):  # TOPICLENGTH is signed: 0x80 is -128
        data = bytearray(encode())
        data[topic_at - 1] = topic_len
        assert_agrees(with_crcs(data))
    # TOPICLENGTH 0x80 (-128) where 128 bytes would fit: a properties length that agrees
    # with the record's end stands after them, and they are UTF-8 (the properties length
    # 0x0170 is two ASCII bytes).
    text = "P\x01" + "v" * 346 + "\x02"
    assert rec.encoded_properties_size(text) == 0x0170
    data = bytearray(encode(topic="T", properties=text))
    props_at = topic_at + 0x80 + 2
    data[topic_at - 1] = 0x80
    struct.pack_into(">h", data, props_at - 2, len(data) - props_at)
    assert rec.placed_record_at(with_crcs(data), 0, 4096, 1 << 20) is None
    assert_agrees(with_crcs(data))
    data = bytearray(encode())
    data[topic_at] = 0xFF  # the topic is no UTF-8
    assert_agrees(with_crcs(data))
    props_at = topic_at + len("TopicA") + 2
    data = bytearray(encode())
    data[props_at] = 0xC3  # a properties byte that starts a two-byte UTF-8 sequence badly
    data[props_at + 1] = 0x28
    assert_agrees(with_crcs(data))
    # PROPERTIESLENGTH negative as an int16: refused even when the record is that long.
    short = encode(properties="")
    props = b"P\x01" + b"v" * 0x8000 + b"\x02__CRC32#\x01" + b"0" * 10
    data = bytearray(short[: props_at - 2] + struct.pack(">H", len(props)) + props)
    struct.pack_into(">i", data, 0, len(data))
    assert_agrees(with_crcs(data))
    # A record without the CRC property: decode_record takes it, require_crc does not.
    plain = encode()
    no_crc = bytearray(plain[: -rec.CRC_PROPERTY_SIZE_MAX + 1])
    struct.pack_into(">i", no_crc, 0, len(no_crc))
    struct.pack_into(">h", no_crc, props_at - 2, len(no_crc) - props_at)
    assert rec.decode_record(bytes(no_crc)).topic == "TopicA"
    assert_agrees(bytes(no_crc))


# Properties text as clients send it: any pairs, duplicates, empty sides, missing separators.
props_text = st.lists(
    st.tuples(
        st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "__TAGSCODE#", "x", ""]),
        st.text(alphabet="ab 7\x01é", max_size=6),
    ),
    max_size=6,
).map(lambda pairs: "\x02".join(f"{k}\x01{v}" for k, v in pairs))


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(alphabet="abé_%", min_size=1, max_size=40),
    body=st.binary(max_size=300),
    properties=props_text,
    queue_offset=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    flip=st.integers(min_value=-1, max_value=2_000),
)
def test_hypothesis_agrees_with_decode_record(
    topic: str, body: bytes, properties: str, queue_offset: int, flip: int
) -> None:
    data = bytearray(
        encode(topic=topic, body=body, properties=properties, queue_offset=queue_offset)
    )
    if 0 <= flip < len(data):
        data[flip] ^= 0x20
    assert_agrees(bytes(data))
    assert_agrees(with_crcs(data))


# --- dispatch_placed_run against recovery's dispatch_scanned, record by record -----------------


def placed_log(specs: list[tuple[str, int, int, int, str]]) -> tuple[bytes, list[rec.PlacedRecord]]:
    """Records (topic, queue id, queue offset, sys flag, properties) back to back from 0."""
    log = b""
    for i, (topic, queue_id, queue_offset, sys_flag, properties) in enumerate(specs):
        log += encode(
            topic=topic,
            queue_id=queue_id,
            queue_offset=queue_offset,
            sys_flag=sys_flag,
            properties=properties,
            body=b"b%d" % i,
            store_timestamp=1_700_000_000_000 + i * 700,
            physical_offset=len(log),
        )
    records = []
    pos = 0
    while pos < len(log):
        placed = rec.placed_record_at(log, pos, pos, len(log) - pos)
        assert placed is not None
        records.append(placed)
        pos += placed.total_size
    return log, records


def random_specs(rng: random.Random, count: int) -> list[tuple[str, int, int, int, str]]:
    """Records of a few queues whose queue offsets mostly follow each other, sometimes not
    (a gap, a repeat, a step back): every path of the consume-queue writes."""
    next_offsets: dict[tuple[str, int], int] = {}
    specs = []
    for i in range(count):
        topic, queue_id = rng.choice(["A", "B"]), rng.randrange(3)
        offset = next_offsets.get((topic, queue_id), rng.choice([0, 0, 5]))
        offset = max(0, offset + rng.choice([0] * 12 + [1, 2, -1, -3]))
        next_offsets[(topic, queue_id)] = offset + 1
        sys_flag = rng.choice([0] * 6 + [SysFlag.PREPARED, SysFlag.COMMIT, SysFlag.ROLLBACK])
        properties = rng.choice(
            [
                f"TAGS\x01t{i % 3}\x02UNIQ_KEY\x01U{i}\x02",
                f"KEYS\x01k{i} k{i % 4}  k{i}\x02UNIQ_KEY\x01k{i}\x02TAGS\x01x\x02",
                f"__TAGSCODE#\x01{i * 1000}\x02TAGS\x01y\x02",
                "__TAGSCODE#\x01junk\x02TAGS\x01\x02TAGS\x01z",
                "",
            ]
        )
        specs.append((topic, queue_id, offset, int(sys_flag), properties))
    return specs


def files_of(store: FileMessageStore, part: str) -> dict[str, bytes]:
    root = store.config.root_dir / part
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name.isdigit()
    }


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_placed_run_is_dispatched_as_recovery_dispatches_each_record(
    opener: Opener, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    _log, records = placed_log(random_specs(rng, 300))
    messages = [rec.decode_record(_log, r.physical_offset, require_crc=True) for r in records]
    fast, slow = opener.open(tmp_path / "fast"), opener.open(tmp_path / "slow")
    fast_events: list[DispatchEvent] = []
    slow_events: list[DispatchEvent] = []
    fast.add_dispatch_listener(fast_events.append, lambda topic: topic == "A")
    slow.add_dispatch_listener(slow_events.append, lambda topic: topic == "A")
    fast_unusual: list[tuple[str, int, int, PutAt]] = []
    slow_unusual: list[tuple[str, int, int, PutAt]] = []
    start = 0
    while start < len(records):
        end = start + rng.randint(1, 40)
        run = fast._appender.dispatch_placed_run(records[start:end])
        send_events(run.events)
        fast_unusual += [(r.topic, r.queue_id, r.queue_offset, o) for r, o in run.unusual]
        for message in messages[start:end]:
            outcome = slow._appender.dispatch_scanned(message, True)
            if outcome is not None and outcome is not PutAt.APPENDED:
                slow_unusual.append(
                    (message.topic, message.queue_id, message.queue_offset, outcome)
                )
        notify_listeners(slow._listeners, messages[start:end])
        start = end
    assert files_of(fast, "consumequeue") == files_of(slow, "consumequeue")
    assert files_of(fast, "index") == files_of(slow, "index")
    assert fast_events == slow_events
    assert any(o is PutAt.GAP for *_, o in slow_unusual)  # the odd paths were taken
    # The same outcomes per queue, in each queue's order (runs write queue by queue).
    by_queue = sorted(fast_unusual, key=lambda u: u[:2]), sorted(slow_unusual, key=lambda u: u[:2])
    assert by_queue[0] == by_queue[1]


def test_a_record_valid_but_for_its_utf8_is_refused_by_a_slave(opener: Opener) -> None:
    first = encode(physical_offset=0)
    second = bytearray(encode(physical_offset=len(first), queue_offset=43))
    props_at = 88 + len(b"hello world") + 1 + len("TopicA") + 2
    second[props_at] = 0xFF
    slave = opener.open(opener.base / "slave", commit_log_file_size=64 * 1024)
    with pytest.raises(ReplicaCorruptError, match=f"offset {len(first)}"):
        slave.append_replica(0, first + with_crcs(second))
    assert slave.max_physical_offset == len(first)


def test_append_written_bytes_are_seen_through_the_mapping(tmp_path: Path) -> None:
    mf = MappedFile.create(tmp_path / "00000000000000000000", 0, 64 * 1024)
    try:
        assert mf.read(0, 4) == bytes(4)  # the page is mapped before the write
        data = bytes(range(256)) * 40
        assert mf.append_written(memoryview(data)) == 0
        assert mf.append_written(b"tail") == len(data)
        assert mf.wrote == len(data) + 4
        assert mf.read(0, mf.wrote) == data + b"tail"
        mf.append(b"!")  # through the mapping again, after them
        assert (tmp_path / "00000000000000000000").read_bytes()[: mf.wrote] == data + b"tail!"
    finally:
        mf.close()
