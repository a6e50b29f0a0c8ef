"""A slave's store fed its master's log bytes becomes a byte-identical copy (issue 13, store side).

The master is built with the store's own put calls (batches, single sends of many queues,
transaction half/commit/rollback records, explicit tags codes, keys) on 64 KiB segments, so
every run crosses many rollovers and blank markers. Its bytes go to an empty slave the way the
HA slave feeds them (broker/ha/): frames from `read_replica` of random sizes, each appended
after the bytes held back from the previous one, the rest held again. Then the slave must have
the same segment files, consume queues, pull answers, key lookups and dispatch events, and
restart (cleanly or after a kill -9) into the same store.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path
from typing import Final

import pytest
from store_helpers import Opener, message

from tidemq.errors import ReplicaCorruptError, ReplicaOffsetError, StoreError
from tidemq.protocol import record as rec
from tidemq.protocol.message import SysFlag
from tidemq.store import (
    DispatchEvent,
    FileMessageStore,
    GetResult,
    GetStatus,
    MessageToStore,
    PutStatus,
)
from tidemq.store.dispatch_retry import DISPATCH_RETRY_INTERVAL_MS_MAX
from tidemq.store.lazy_file import LazyMappedFile, MappingCache
from tidemq.store.message_store import REPLICA_MODE_REFUSAL
from tidemq.store.tools import dump, verify

SEGMENT: Final = 64 * 1024
# Frames up to this size: many records and most markers' zeros arrive in several pieces.
FRAME_BYTES_MAX: Final = 3_000
SEEDS: Final = (1, 2, 3)
TX_TOPIC: Final = "TxTopic"


def open_store(opener: Opener, name: str, **overrides: object) -> FileMessageStore:
    return opener.open(opener.base / name, commit_log_file_size=SEGMENT, **overrides)


def random_message(
    rng: random.Random,
    i: int,
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    **fields: object,
) -> MessageToStore:
    topic = rng.choice(["A", "B"]) if topic is None else topic
    queue_id = rng.randrange(3) if queue_id is None else queue_id
    keys = f"k{i} shared{i % 5}" if rng.random() < 0.5 else None
    body = rng.randbytes(rng.choice([8, 200, 1_000, 3_000, 9_000]))
    msg = message(i, topic=topic, queue_id=queue_id, tags=rng.choice(["x", "y"]), keys=keys)
    msg.body = body
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def put_traffic(store: FileMessageStore, rng: random.Random, count: int, first: int = 0) -> None:
    """About `count` messages: batches, groups of single sends, transactions, tags codes."""
    i = first
    while i < first + count:
        kind = rng.random()
        if kind < 0.3:
            topic, queue_id = rng.choice(["A", "B"]), rng.randrange(3)
            batch = [
                random_message(rng, i + n, topic=topic, queue_id=queue_id)
                for n in range(rng.randint(1, 6))
            ]
            results = store.put_messages(batch)
        elif kind < 0.5:
            half = random_message(rng, i, topic=TX_TOPIC, queue_id=0, sys_flag=SysFlag.PREPARED)
            ending = SysFlag.COMMIT if rng.random() < 0.5 else SysFlag.ROLLBACK
            end = random_message(rng, i + 1, topic=TX_TOPIC, queue_id=0, sys_flag=ending)
            results = store.put_each([half, end])
        else:
            group = [random_message(rng, i + n) for n in range(rng.randint(1, 5))]
            group[0].tags_code = rng.randrange(1 << 40)  # e.g. a delay topic's deliver time
            results = store.put_each(group)
        assert all(r.ok for r in results), results
        i += len(results)
        store.clock.advance(rng.randint(0, 3))  # type: ignore[attr-defined]


class Feed:
    """The HA slave's side of the stream: frames from the master, the held tail, the appends."""

    def __init__(self, master: FileMessageStore, slave: FileMessageStore, start: int) -> None:
        self.master = master
        self.slave = slave
        self.at = start  # where the held bytes start: the slave's end
        self.sent = start  # where the master's next frame starts
        self.held = b""

    def run(self, rng: random.Random, until: int | None = None) -> None:
        end = self.master.max_physical_offset if until is None else until
        while self.sent < end:
            frame = self.master.read_replica(self.sent, rng.randint(1, FRAME_BYTES_MAX))
            frame = frame[: end - self.sent]
            assert frame
            self.sent += len(frame)
            self.append(self.held + frame, rng.random() < 0.5)

    def append(self, data: bytes, as_view: bool = False) -> int:
        consumed = self.slave.append_replica(self.at, memoryview(data) if as_view else data)
        self.at += consumed
        self.held = data[consumed:]
        # An empty slave stays empty (max 0) until its first whole unit.
        assert self.slave.max_physical_offset in (self.at, 0)
        return consumed


def replicate(master: FileMessageStore, slave: FileMessageStore, rng: random.Random) -> Feed:
    feed = Feed(master, slave, slave.max_physical_offset or master.min_physical_offset)
    feed.run(rng)
    assert feed.held == b""
    return feed


def files_of(store: FileMessageStore, part: str) -> dict[str, bytes]:
    root = store.config.root_dir / part
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name.isdigit()
    }


def pull_all(store: FileMessageStore) -> dict[tuple[str, int], list[GetResult]]:
    """Every get_messages answer of every queue, read from its first offset in steps of 7."""
    answers: dict[tuple[str, int], list[GetResult]] = {}
    for topic, queue_ids in store.topics_and_queues().items():
        for queue_id in queue_ids:
            got = answers[(topic, queue_id)] = []
            offset = store.min_offset(topic, queue_id)
            while True:
                result = store.get_messages(topic, queue_id, offset, 7)
                got.append(result)
                if result.status is not GetStatus.FOUND:
                    break
                offset = result.next_begin_offset
    return answers


def key_lookups(store: FileMessageStore, count: int) -> list[list[bytes]]:
    keys = [f"k{i}" for i in range(count)] + [f"shared{n}" for n in range(5)]
    return [
        store.query_by_key(topic, key, 64, 0, 1 << 62)
        for topic in ("A", "B", TX_TOPIC)
        for key in keys
    ]


def assert_same_store(master: FileMessageStore, slave: FileMessageStore, count: int) -> None:
    assert slave.max_physical_offset == master.max_physical_offset
    assert slave.min_physical_offset == master.min_physical_offset
    assert files_of(slave, "commitlog") == files_of(master, "commitlog")
    assert files_of(slave, "consumequeue") == files_of(master, "consumequeue")
    assert pull_all(slave) == pull_all(master)
    assert key_lookups(slave, count) == key_lookups(master, count)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_slave_fed_in_random_pieces_is_a_byte_identical_copy(opener: Opener, seed: int) -> None:
    rng = random.Random(seed)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    master_events: list[DispatchEvent] = []
    slave_events: list[DispatchEvent] = []
    master.add_dispatch_listener(master_events.append)
    slave.add_dispatch_listener(slave_events.append)
    put_traffic(master, rng, 400)
    assert len(files_of(master, "commitlog")) >= 10  # many rollovers, many blank markers
    slave.set_replica_mode(True)
    replicate(master, slave, rng)
    assert_same_store(master, slave, 400)
    assert slave_events == master_events
    assert slave._appender.dispatched == slave.max_physical_offset
    report = verify(slave.config.root_dir)
    assert report.ok, report.problems
    slave.shutdown()
    again = open_store(opener, "slave")
    assert_same_store(master, again, 400)
    assert verify(again.config.root_dir).ok


def test_a_slave_follows_a_master_that_keeps_writing(opener: Opener) -> None:
    rng = random.Random(7)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    feed = Feed(master, slave, 0)
    for round_ in range(20):
        put_traffic(master, rng, 15, first=round_ * 20)
        # Stop anywhere: mid-record, mid-marker, at a segment end.
        feed.run(rng, until=rng.randint(feed.sent, master.max_physical_offset))
    feed.run(rng)
    assert feed.held == b""
    assert_same_store(master, slave, 400)


def test_an_empty_slave_starts_at_the_masters_first_segment(opener: Opener) -> None:
    rng = random.Random(11)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 200)
    removed = master.clean_expired_files(master.clock.now_ms() + 10**12, force=True)
    assert removed
    assert master.min_physical_offset > 0
    with pytest.raises(ReplicaOffsetError, match="segment start"):
        slave.append_replica(master.min_physical_offset + 1, b"")
    replicate(master, slave, rng)
    assert files_of(slave, "commitlog") == files_of(master, "commitlog")
    # The slave's queues start at the first record it has of each: the master's answers from
    # there on are the slave's.
    slave_answers = pull_all(slave)
    for (topic, queue_id), answers in slave_answers.items():
        start = slave.min_offset(topic, queue_id)
        assert start >= master.min_offset(topic, queue_id)
        got = master.get_messages(topic, queue_id, start, 7)
        assert (answers[0].records, answers[0].next_begin_offset) == (
            got.records,
            got.next_begin_offset,
        )


def segment_zeros_from(store: FileMessageStore, offset: int) -> bool:
    name = f"{offset - offset % SEGMENT:020d}"
    data = (store.config.root_dir / "commitlog" / name).read_bytes()
    return data[offset % SEGMENT :] == bytes(SEGMENT - offset % SEGMENT)


@pytest.mark.parametrize("where", ["body", "size", "magic", "offset_field", "zeros"])
def test_a_corrupt_unit_stops_the_append_before_it(opener: Opener, where: str) -> None:
    rng = random.Random(5)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    for i in range(40):
        assert master.put_message(random_message(rng, i, body=b"b" * 500)).ok
    frame = master.read_replica(0, SEGMENT)
    bad_at = rec.record_size_at(frame, 0)  # the second record
    bad = bytearray(frame)
    if where == "body":
        bad[bad_at + rec.BODY_OFFSET + 3] ^= 0x40
    elif where == "size":
        bad[bad_at + 3] ^= 0x08
    elif where == "magic":
        bad[bad_at + 4] ^= 0x01
    elif where == "offset_field":
        bad[bad_at + rec.PHYSICAL_OFFSET_POS + 7] ^= 0x01
    else:
        bad[bad_at:] = bytes(len(bad) - bad_at)
    with pytest.raises(ReplicaCorruptError, match=f"offset {bad_at}"):
        slave.append_replica(0, bytes(bad))
    # The record before it is written and readable; nothing of the bad one.
    assert slave.max_physical_offset == bad_at
    assert segment_zeros_from(slave, bad_at)
    readable = [
        record for answers in pull_all(slave).values() for got in answers for record in got.records
    ]
    assert readable == [frame[:bad_at]]
    # The true bytes from there on complete the copy.
    Feed(master, slave, bad_at).run(rng)
    assert_same_store(master, slave, 40)


def test_a_blank_marker_of_the_wrong_size_is_refused(opener: Opener) -> None:
    rng = random.Random(6)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 60)
    first = master.read_replica(0, SEGMENT)
    assert len(first) == SEGMENT  # the first segment, marker and zeros included
    marker_at = 0
    while rec.record_head_at(first, marker_at)[1] != rec.BLANK_MAGIC:
        marker_at += rec.record_size_at(first, marker_at)
    bad = bytearray(first)
    rec.BLANK_MARKER.pack_into(bad, marker_at, SEGMENT - marker_at - 8, rec.BLANK_MAGIC)
    with pytest.raises(ReplicaCorruptError, match=f"blank marker at offset {marker_at} says"):
        slave.append_replica(0, bytes(bad))
    assert slave.max_physical_offset == marker_at


def test_a_record_claiming_another_offset_is_refused(opener: Opener) -> None:
    rng = random.Random(8)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 60)
    second = master.read_replica(SEGMENT, SEGMENT)
    with pytest.raises(ReplicaCorruptError, match=f"claims offset {SEGMENT}"):
        slave.append_replica(2 * SEGMENT, second)  # an empty store takes any segment start
    assert slave.max_physical_offset == 0
    assert files_of(slave, "commitlog") == {}  # no segment made for nothing


def test_a_gap_or_an_overlap_is_refused(opener: Opener) -> None:
    rng = random.Random(9)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 30)
    Feed(master, slave, 0).run(rng, until=SEGMENT // 2)
    end = slave.max_physical_offset
    assert end > 0
    right_bytes = master.read_replica(end, 1_000)  # at the wrong offsets
    for offset in (end + 1, end - 1, end + SEGMENT, 0):
        with pytest.raises(ReplicaOffsetError, match=f"ends at {end}"):
            slave.append_replica(offset, right_bytes)
    assert slave.max_physical_offset == end


@pytest.mark.parametrize("until", ["mid_record", "segment_end"])
def test_a_killed_slave_restarts_with_whole_units_and_resumes(opener: Opener, until: str) -> None:
    rng = random.Random(10)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 200)
    feed = Feed(master, slave, 0)
    if until == "segment_end":
        feed.run(rng, until=SEGMENT)  # the log ends with the first segment's marker
        assert slave.max_physical_offset == SEGMENT
    else:
        while not feed.held:
            feed.run(rng, until=min(feed.sent + 1_000, master.max_physical_offset))
    crashed = opener.crash_copy(slave, "crashed")
    reopened = opener.open(crashed, commit_log_file_size=SEGMENT)
    assert reopened.last_recovery is not None
    assert not reopened.last_recovery.clean_stop
    end = reopened.max_physical_offset
    if until == "segment_end":
        assert end < SEGMENT  # recovery ends the log at the marker: the master sends it again
    else:
        assert end == feed.at
    replicate(master, reopened, rng)
    assert_same_store(master, reopened, 200)
    assert verify(crashed).ok


def test_a_slave_store_refuses_puts(opener: Opener) -> None:
    rng = random.Random(12)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 20)
    slave.set_replica_mode(True)
    assert slave.replica_mode
    refusals = [
        slave.put_message(message(0)),
        *slave.put_messages([message(1), message(2)]),
        *slave.put_each([message(3)]),
    ]
    assert {(r.status, r.error) for r in refusals} == {
        (PutStatus.SERVICE_NOT_AVAILABLE, REPLICA_MODE_REFUSAL)
    }
    replicate(master, slave, rng)
    assert slave.max_physical_offset == master.max_physical_offset
    slave.set_replica_mode(False)  # e.g. promoted (issue 14)
    written = slave.put_message(message(4))
    assert written.ok
    assert written.physical_offset == master.max_physical_offset


def test_append_listeners_hear_each_new_end(opener: Opener) -> None:
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    heard_master: list[int] = []
    heard_slave: list[int] = []
    master.add_append_listener(heard_master.append)
    slave.add_append_listener(heard_slave.append)
    assert master.put_messages([message(0), message(1)])[0].ok
    after_batch = master.max_physical_offset
    assert [r.ok for r in master.put_each([message(2), message(3, topic="")])] == [True, False]
    assert master.put_each([message(4, topic="")])[0].status is PutStatus.MESSAGE_ILLEGAL
    assert heard_master == [after_batch, master.max_physical_offset]  # not the refused pass
    data = master.read_replica(0, SEGMENT)
    assert slave.append_replica(0, data[:50]) == 0  # an incomplete unit: nothing written
    assert heard_slave == []
    assert slave.append_replica(0, data) == len(data)
    assert heard_slave == [master.max_physical_offset]
    slave.set_replica_mode(True)
    slave.put_message(message(9))
    assert heard_slave == [master.max_physical_offset]  # a refused put wrote nothing


def test_read_replica_and_bytes_before_stay_within_the_log(opener: Opener) -> None:
    rng = random.Random(13)
    master = open_store(opener, "master")
    assert master.read_replica(0, 100) == b""  # an empty log
    put_traffic(master, rng, 100)
    end = master.max_physical_offset
    assert master.read_replica(end, 100) == b""
    with pytest.raises(ReplicaOffsetError, match="beyond the end"):
        master.read_replica(end + 1, 100)
    with pytest.raises(ReplicaOffsetError, match="beyond the end"):
        master.bytes_before(end + 1, 100)
    # A read never crosses a segment; a full segment's end is the next one's start.
    assert len(master.read_replica(SEGMENT - 10, 1_000)) == 10
    assert master.read_replica(SEGMENT, 8) == master.read_replica(SEGMENT, 1_000)[:8]
    # bytes_before: from the segment holding end - 1 only.
    log = b"".join(files_of(master, "commitlog").values())
    assert master.bytes_before(end, 4096) == log[end - 4096 : end]
    assert master.bytes_before(SEGMENT + 10, 4096) == log[SEGMENT : SEGMENT + 10]
    # At a full segment's end: the bytes up to its blank marker's end, not the zeros after it.
    marker = log.rfind(rec.BLANK_MAGIC.to_bytes(4, "big"), 0, SEGMENT) - 4
    assert master.bytes_before(SEGMENT, 4096) == log[marker + 8 - 4096 : marker + 8]
    assert master.bytes_before(0, 4096) == b""
    master.clean_expired_files(master.clock.now_ms() + 10**12, force=True)
    first = master.min_physical_offset
    assert first > 0
    with pytest.raises(ReplicaOffsetError, match=f"the log starts at {first}"):
        master.read_replica(first - 1, 100)
    assert master.bytes_before(first, 100) == b""  # the bytes before it are deleted


def test_append_replica_needs_a_running_healthy_store(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(14)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 40)
    data = master.read_replica(0, SEGMENT)
    full = True
    real_create = LazyMappedFile.create_sparse.__func__  # type: ignore[attr-defined]

    def create(
        cls: type[LazyMappedFile], path: Path, start: int, size: int, cache: MappingCache
    ) -> LazyMappedFile:
        if full and "/consumequeue/" in str(path):
            raise OSError(errno.ENOSPC, "injected: no space for a consume-queue file")
        made: LazyMappedFile = real_create(cls, path, start, size, cache)
        return made

    monkeypatch.setattr(LazyMappedFile, "create_sparse", classmethod(create))
    with pytest.raises(StoreError, match="dispatch of replicated records failed"):
        slave.append_replica(0, data)
    written = slave.max_physical_offset
    assert written > 0  # in the log, not yet in the queues
    with pytest.raises(StoreError, match="re-dispatched"):
        slave.append_replica(written, master.read_replica(written, SEGMENT))
    full = False
    slave.clock.advance(DISPATCH_RETRY_INTERVAL_MS_MAX)  # type: ignore[attr-defined]
    Feed(master, slave, written).run(rng)  # the due retry heals it first
    assert_same_store(master, slave, 40)
    slave.shutdown()
    with pytest.raises(StoreError, match="not running"):
        slave.append_replica(slave.max_physical_offset, b"")


def test_store_tools_read_a_slave_store(opener: Opener) -> None:
    rng = random.Random(15)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 120)
    replicate(master, slave, rng)
    report = verify(slave.config.root_dir)
    assert report.ok, report.problems
    assert report.end_offset == master.max_physical_offset
    master_lines, slave_lines = _dump_lines(master), _dump_lines(slave)
    assert slave_lines == master_lines
    assert len(master_lines) > 120


def _dump_lines(store: FileMessageStore) -> list[str]:
    import io

    out = io.StringIO()
    dump(store.config.root_dir, out)
    return out.getvalue().splitlines()


def test_the_callers_buffer_is_free_after_each_append(opener: Opener) -> None:
    """The HA slave keeps its pending bytes in a bytearray and passes a view: no view of it may
    outlive the call, whatever the call did, or resizing it raises BufferError."""
    rng = random.Random(16)
    master, slave = open_store(opener, "master"), open_store(opener, "slave")
    put_traffic(master, rng, 30)
    pending = bytearray(master.read_replica(0, 5_000))
    with memoryview(pending) as view:
        consumed = slave.append_replica(0, view)
    assert 0 < consumed < len(pending)
    del pending[:consumed]  # BufferError if a view were still exported
    pending[5] ^= 0xFF
    with memoryview(pending) as view, pytest.raises(ReplicaCorruptError):
        slave.append_replica(consumed, view)
    pending += b"more"


def test_two_layouts_of_a_full_segment_have_different_tails(opener: Opener) -> None:
    """Logs that diverged before a rollover differ in the tail a slave and its master compare,
    though both segments end in the same zeros after their markers (review finding: the tail
    was the last 4 KiB of zeros, and a diverged slave was accepted)."""
    tails = []
    for name, size, count in (("one", 1_000, 40), ("other", 1_200, 30)):
        store = open_store(opener, name)
        store.put_messages([message(i, body=b"x" * size) for i in range(count)])
        store.put_message(message(count, body=b"y" * 30_000))  # does not fit: rolls over
        assert store.max_physical_offset > SEGMENT
        tails.append(store.bytes_before(SEGMENT, 4096))
    assert tails[0]
    assert tails[1]
    assert tails[0] != tails[1]
    assert all(tail[-8:-4] != b"\0" * 4 for tail in tails)  # each ends at its marker
