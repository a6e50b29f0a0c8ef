"""A send flagged COMPRESSED whose body does not inflate is refused (issue 11, item 1).

Raw send frames against a real broker: before the fix the broker stored such a body (answer 0)
and every pull covering its offset then failed in the client, so consumers of the queue stalled.
Each path a body enters by is tried (coalesced single sends, pipelined, delayed, transactional
half, batch), and the store is then walked to show no flagged body that fails to inflate is in it.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from pathlib import Path

import pytest
from broker_harness import Harness, messages, running_broker

from tidemq.broker.handlers.send_body import POISON_REMARK_PREFIX
from tidemq.protocol import compression
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import (
    PGROUP,
    RMQ_SYS_TRANS_HALF_TOPIC,
    TRAN_MSG,
    BatchItem,
    SysFlag,
    encode_batch,
    inflate,
)

TOPIC = "TopicPoison"
POISON = b"this is not zlib data at all"
V2 = RequestCode.SEND_MESSAGE_V2
COMPRESSED = int(SysFlag.COMPRESSED)


def stored(harness: Harness, topic: str, queue_id: int = 0) -> list[rec.StoredMessage]:
    result = harness.app.store.get_messages(topic, queue_id, 0, 256)
    return [rec.decode_record(r) for r in result.records]


def assert_no_poison(harness: Harness) -> None:
    """Every stored message flagged COMPRESSED inflates (what a consumer will do with it)."""
    store = harness.app.store
    seen = 0
    for topic, queue_ids in store.topics_and_queues().items():
        for queue_id in queue_ids:
            for record in stored(harness, topic, queue_id):
                if record.sys_flag & SysFlag.COMPRESSED:
                    inflate(record.body)
                seen += 1
    assert seen > 0


def assert_poison_refused(response: object) -> None:
    assert getattr(response, "code", None) == ResponseCode.MESSAGE_ILLEGAL, response
    assert POISON_REMARK_PREFIX in (getattr(response, "remark", "") or "")


async def test_a_body_that_does_not_inflate_is_refused_and_a_good_one_stored(
    tmp_path: Path,
) -> None:
    segment = str(4 * 1024 * 1024)  # room for the 1 MiB body's compressed form
    async with running_broker(tmp_path / "store", mappedFileSizeCommitLog=segment) as broker:
        await refuse_poison_store_good(broker)


async def refuse_poison_store_good(broker: Harness) -> None:
    poison = await broker.send(TOPIC, POISON, code=V2, sys_flag=COMPRESSED)
    assert_poison_refused(poison)
    assert "not zlib data" in (poison.remark or "")
    good_body = b"".join(b'{"line": %d, "text": "some payload"}\n' % i for i in range(30_000))
    assert len(good_body) > 1024 * 1024
    good = await broker.send(TOPIC, zlib.compress(good_body, 5), code=V2, sys_flag=COMPRESSED)
    assert good.code == ResponseCode.SUCCESS, good.remark
    (record,) = stored(broker, TOPIC)
    assert record.sys_flag & SysFlag.COMPRESSED
    assert inflate(record.body) == good_body
    # A consumer's pull covering the queue gets the good message and can inflate it.
    (pulled,) = messages(await broker.pull(TOPIC))
    assert inflate(pulled.body) == good_body
    assert_no_poison(broker)


async def test_truncated_and_oversized_streams_are_refused(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", maxMessageSize="4096") as broker:
        truncated = zlib.compress(b"x" * 3000)[:-4]
        assert_poison_refused(await broker.send(TOPIC, truncated, sys_flag=COMPRESSED))
        # A zip bomb: 1 KiB on the wire, 1 MB inflated; refused at maxMessageSize.
        bomb = zlib.compress(b"\0" * 1_000_000, 9)
        assert len(bomb) < 4096
        response = await broker.send(TOPIC, bomb, sys_flag=COMPRESSED)
        assert_poison_refused(response)
        assert "exceeds 4096 bytes" in (response.remark or "")
        exact = zlib.compress(b"y" * 4096)
        assert (await broker.send(TOPIC, exact, sys_flag=COMPRESSED)).code == 0
        assert [inflate(m.body) for m in stored(broker, TOPIC)] == [b"y" * 4096]


async def test_pipelined_sends_around_a_poison_one_are_stored(broker: Harness) -> None:
    """Frames of one read take the coalesced path: only the poison one is refused."""
    bodies = [zlib.compress(b"a" * 100), POISON, zlib.compress(b"c" * 100), b"plain"]
    flags = [COMPRESSED, COMPRESSED, COMPRESSED, 0]
    responses = await asyncio.gather(
        *(broker.send(TOPIC, b, code=V2, sys_flag=f) for b, f in zip(bodies, flags, strict=True))
    )
    assert [r.code for r in responses] == [0, ResponseCode.MESSAGE_ILLEGAL, 0, 0]
    records = stored(broker, TOPIC)
    assert [r.body for r in records] == [bodies[0], bodies[2], bodies[3]]
    assert_no_poison(broker)


async def test_a_poison_delayed_send_is_refused(broker: Harness) -> None:
    response = await broker.send(TOPIC, POISON, sys_flag=COMPRESSED, properties={"DELAY": "2"})
    assert_poison_refused(response)
    assert broker.app.store.max_offset("SCHEDULE_TOPIC_XXXX", 1) == 0


async def test_a_poison_half_message_is_refused(broker: Harness) -> None:
    props = {TRAN_MSG: "true", PGROUP: "PG_TX"}
    response = await broker.send(TOPIC, POISON, code=V2, sys_flag=COMPRESSED, properties=props)
    assert_poison_refused(response)
    assert stored(broker, RMQ_SYS_TRANS_HALF_TOPIC) == []
    assert broker.app.transactions.ledger.in_flight == 0
    good = zlib.compress(b"half" * 100)
    assert (await broker.send(TOPIC, good, sys_flag=COMPRESSED, properties=props)).code == 0
    assert [m.body for m in stored(broker, RMQ_SYS_TRANS_HALF_TOPIC)] == [good]


async def test_a_compressed_batch_must_inflate(broker: Harness) -> None:
    """A batch's COMPRESSED flag deflates the whole body (C++); its messages are stored plain."""
    code = RequestCode.SEND_BATCH_MESSAGE
    response = await broker.send(TOPIC, POISON, code=code, sys_flag=COMPRESSED)
    assert_poison_refused(response)
    body = encode_batch([BatchItem(0, b"one", ""), BatchItem(0, b"two", "")])
    good = await broker.send(TOPIC, zlib.compress(body), code=code, sys_flag=COMPRESSED)
    assert good.code == ResponseCode.SUCCESS, good.remark
    records = stored(broker, TOPIC)
    assert [(r.body, r.sys_flag & SysFlag.COMPRESSED) for r in records] == [
        (b"one", 0),
        (b"two", 0),
    ]
    assert_no_poison(broker)


async def test_refusals_are_logged_once_per_interval(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidemq")
    for _ in range(5):
        assert_poison_refused(await broker.send(TOPIC, POISON, sys_flag=COMPRESSED))
    lines = [r for r in caplog.records if POISON_REMARK_PREFIX in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert TOPIC in lines[0].getMessage()


@pytest.mark.parametrize("codec", [SysFlag.COMPRESSION_LZ4, SysFlag.COMPRESSION_ZSTD])
async def test_a_body_another_codec_compressed_is_checked_by_its_codec(
    broker: Harness, codec: int
) -> None:
    """RocketMQ 5 producers name LZ4 or ZSTD in sysFlag bits 8-10: a body of that codec is
    stored as sent, one that is not data of the codec it names is refused as a zlib one is."""
    body = compression.compress(b"a body of another codec " * 200, codec, 5)
    assert body is not None
    response = await broker.send(TOPIC, body, code=V2, sys_flag=COMPRESSED | codec)
    assert response.code == ResponseCode.SUCCESS, response.remark
    (record,) = stored(broker, TOPIC)
    assert record.body == body
    assert record.sys_flag & SysFlag.COMPRESSION_TYPE_MASK == codec
    poison = await broker.send(TOPIC, POISON, code=V2, sys_flag=COMPRESSED | codec)
    assert_poison_refused(poison)
    # Naming zlib explicitly is checked like the 4.x flag alone.
    named_zlib = await broker.send(
        TOPIC, POISON, code=V2, sys_flag=COMPRESSED | SysFlag.COMPRESSION_ZLIB
    )
    assert_poison_refused(named_zlib)


def test_codec_bits() -> None:
    assert SysFlag.is_zlib_compressed(SysFlag.COMPRESSED)
    assert SysFlag.is_zlib_compressed(SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZLIB)
    assert not SysFlag.is_zlib_compressed(SysFlag.COMPRESSED | SysFlag.COMPRESSION_LZ4)
    assert not SysFlag.is_zlib_compressed(SysFlag.COMPRESSION_ZLIB)
