"""Issue 11 item 1, decode level: one undecodable record in a pull answer is skipped and listed,
and never stops the records behind it (client/pull_answer.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from client_fakes import FakeCluster, QueueBroker, stored_record, until

from tidemq.client.consumer import PushConsumer
from tidemq.client.message import ConsumeFromWhere, MessageExt, PullStatus
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.pull_answer import (
    UNDECODABLE_LOG_INTERVAL_MS,
    UndecodableLog,
    decode_pull_response,
)
from tidemq.clock import FakeClock
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.record import BODY_OFFSET

MQ = MessageQueue("T", "broker-a", 1)
EVERYTHING = pm.parse_tag_expression("*")


def record(offset: int, body: bytes = b"ok", *, sys_flag: int = 0, tags: str = "A") -> bytes:
    return stored_record("T", MQ.queue_id, offset, body, props={"TAGS": tags}, sys_flag=sys_flag)


def poison(offset: int) -> bytes:
    """A record flagged COMPRESSED whose body is not zlib data (issue 11 item 1)."""
    return record(offset, b"not zlib at all", sys_flag=pm.SysFlag.COMPRESSED)


def bad_crc(offset: int) -> bytes:
    raw = bytearray(record(offset, b"flipped"))
    raw[BODY_OFFSET] ^= 0x01
    return bytes(raw)


GARBAGE = b"\x00\x00\x00\x10" + b"\xff" * 60  # no record magic: the framing is lost here


def answer(body: bytes, next_offset: int) -> RemotingCommand:
    fields = {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(next_offset),
        "minOffset": "0",
        "maxOffset": "99",
    }
    return RemotingCommand(code=0, body=body, ext_fields=fields)


@pytest.mark.parametrize("bad", [poison, bad_crc], ids=["not-zlib", "bad-crc"])
def test_undecodable_record_is_skipped_and_those_behind_it_delivered(bad):
    body = record(3) + bad(4) + record(5)
    result = decode_pull_response(answer(body, 6), MQ, EVERYTHING, requested_offset=3, max_nums=32)
    assert result is not None
    assert result.status is PullStatus.FOUND
    assert [m.queue_offset for m in result.messages] == [3, 5]
    assert [(u.message_queue, u.queue_offset) for u in result.undecodable] == [(MQ, 4)]
    assert result.next_begin_offset == 6


def test_reason_names_the_fault():
    result = decode_pull_response(answer(poison(0), 1), MQ, EVERYTHING, max_nums=1)
    assert result is not None
    assert "zlib" in result.undecodable[0].reason
    crc = decode_pull_response(answer(bad_crc(0), 1), MQ, EVERYTHING, max_nums=1)
    assert crc is not None
    assert "CRC" in crc.undecodable[0].reason


def test_only_undecodable_records_still_move_the_offset_on():
    result = decode_pull_response(answer(poison(7), 8), MQ, EVERYTHING, requested_offset=7)
    assert result is not None
    assert (result.messages, result.next_begin_offset) == ([], 8)
    assert [u.queue_offset for u in result.undecodable] == [7]


def test_framing_broken_after_good_records_resumes_right_after_them():
    body = record(3) + record(4, tags="B") + GARBAGE
    tag_a = pm.parse_tag_expression("A")
    result = decode_pull_response(answer(body, 9), MQ, tag_a, requested_offset=3, max_nums=32)
    assert result is not None
    assert [m.queue_offset for m in result.messages] == [3]
    # Record 4 was decoded (and filtered out): the re-pull starts after it, not after 3 or at 9.
    assert result.next_begin_offset == 5
    assert result.undecodable == []


def test_framing_broken_at_once_asks_again_for_one_then_skips_that_one():
    wide = decode_pull_response(
        answer(GARBAGE + record(6), 7), MQ, EVERYTHING, requested_offset=5, max_nums=32
    )
    assert wide is None  # api.pull re-asks with max_nums=1
    one = decode_pull_response(answer(GARBAGE, 6), MQ, EVERYTHING, requested_offset=5, max_nums=1)
    assert one is not None
    assert one.messages == []
    assert [u.queue_offset for u in one.undecodable] == [5]
    assert one.next_begin_offset == 6


def test_process_queue_commits_past_a_skipped_record_once_the_rest_is_done():
    pq = ProcessQueue()
    result = decode_pull_response(
        answer(record(0) + poison(1), 2), MQ, EVERYTHING, requested_offset=0, max_nums=32
    )
    assert result is not None
    pq.put(result.messages)
    pq.pulled_to(result.next_begin_offset)
    assert pq.commit_offset() == 0  # message 0 still pending
    assert pq.remove(result.messages) == 2  # past the skipped record 1


def test_undecodable_log_counts_everything_and_logs_once_per_interval(caplog):
    clock = FakeClock()
    log = UndecodableLog("CG", clock)
    skipped = decode_pull_response(answer(poison(1), 2), MQ, EVERYTHING, requested_offset=1)
    assert skipped is not None
    with caplog.at_level(logging.WARNING, logger="tidemq.client.pull_answer"):
        for _ in range(50):
            log.record(skipped.undecodable)
            clock.advance(10)
        assert log.count == 50
        assert len(caplog.records) == 1
        clock.advance(UNDECODABLE_LOG_INTERVAL_MS)
        log.record(skipped.undecodable)
    assert log.count == 51
    assert len(caplog.records) == 2
    assert "skipped 50 undecodable" in caplog.records[1].getMessage()
    assert "offset 1" in caplog.records[1].getMessage()


@pytest.fixture
async def qfake() -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster([QueueBroker("broker-a")])
    await cluster.start()
    cluster.add_topic("TopicA", queues=1)
    try:
        yield cluster
    finally:
        await cluster.stop()


async def test_push_consumer_gets_past_a_broken_frame_and_a_poison_record(qfake):
    """Against a scripted broker: garbage at offset 5 (framing lost) and a non-zlib body at 8."""
    b = qfake.brokers[0]
    assert isinstance(b, QueueBroker)
    for i in range(10):
        b.put("TopicA", 0, f"m{i}".encode())
    stored = b.queues[("TopicA", 0)]
    stored[5] = GARBAGE
    stored[8] = stored_record("TopicA", 0, 8, b"not zlib", sys_flag=pm.SysFlag.COMPRESSED)
    got: list[MessageExt] = []
    c = PushConsumer(
        "CG",
        qfake.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=100,
        persist_interval_ms=100,
    )
    c.subscribe("TopicA", "*")
    c.register_listener(got.extend)
    await c.start()
    try:
        await until(lambda: len(got) == 8 and b.offsets.get(("CG", "TopicA", 0)) == 10)
    finally:
        await c.shutdown()
    assert sorted(m.queue_offset for m in got) == [0, 1, 2, 3, 4, 6, 7, 9]
    assert c.undecodable_count == 2
    # The framing broke at 5: the consumer asked again for exactly one message there.
    one_at_five = [
        p
        for p in b.of_code(RequestCode.PULL_MESSAGE)
        if p.ext_fields["queueOffset"] == "5" and p.ext_fields["maxMsgNums"] == "1"
    ]
    assert one_at_five


class _ResettableBroker(QueueBroker):
    """Answers PULL_OFFSET_MOVED (next: the queue's end) for an offset past the end, as the
    broker does once a queue starts again from 0 (topic deleted and created, store replaced)."""

    def _pull(self, request: RemotingCommand) -> RemotingCommand:
        topic, qid = request.ext_fields["topic"], int(request.ext_fields["queueId"])
        end = len(self.queues.get((topic, qid), []))
        if int(request.ext_fields["queueOffset"]) > end:
            fields = {
                "suggestWhichBrokerId": "0",
                "minOffset": "0",
                "maxOffset": str(end),
                "nextBeginOffset": str(end),
            }
            return request.response(ResponseCode.PULL_OFFSET_MOVED, fields)
        return super()._pull(request)


async def test_offset_moved_back_is_not_committed_past_by_earlier_pulls():
    """Pulls that reached offset 10 before the queue restarted from 0 must not make the consumer
    commit 10 later: a new owner would start there and skip every message below it."""
    b = _ResettableBroker("broker-a")
    cluster = FakeCluster([b])
    await cluster.start()
    cluster.add_topic("TopicA", queues=1)
    got: list[MessageExt] = []
    c = PushConsumer(
        "CG",
        cluster.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=100,
        persist_interval_ms=50,
    )
    c.subscribe("TopicA", "*")
    c.register_listener(got.extend)
    mq = MessageQueue("TopicA", "broker-a", 0)
    try:
        for i in range(10):
            b.put("TopicA", 0, f"old{i}".encode())
        await c.start()
        await until(lambda: len(got) == 10 and b.offsets.get(("CG", "TopicA", 0)) == 10)
        b.queues[("TopicA", 0)] = []  # the queue starts again from 0
        await until(lambda: c.committed_offsets().get(mq) == 0)
        for i in range(3):
            b.put("TopicA", 0, f"new{i}".encode())
        await until(lambda: len(got) == 13)
        await until(lambda: b.offsets.get(("CG", "TopicA", 0)) == 3)
        await asyncio.sleep(0.3)  # a few more empty pulls and commit rounds
        assert c.committed_offsets().get(mq) == 3
        assert b.offsets.get(("CG", "TopicA", 0)) == 3
    finally:
        await c.shutdown()
        await cluster.stop()
