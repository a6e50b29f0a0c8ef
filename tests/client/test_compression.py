"""Compression that pays for itself (issue 18): judged before zlib, opt-in LZ4 and ZSTD.

Real broker (local_cluster) and real clients: what the producer sends is read back from the store
through a PullConsumer, with the sysFlag the broker stored.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.broker.handlers.send_body import POISON_REMARK_PREFIX, CompressedBodyCheck
from tidemq.client.message import Message, MessageExt
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.clock import SystemClock
from tidemq.errors import MessageIllegalError, ProtocolError, TopicNotExistError
from tidemq.protocol import compression
from tidemq.protocol.message import SysFlag
from tidemq.testing import LocalCluster, eventually_async, local_cluster

lz4_frame = pytest.importorskip("lz4.frame")
zstandard = pytest.importorskip("zstandard")

MIB = 1024 * 1024
TEXT = json.dumps([{"id": i, "name": f"user{i}", "score": i * 3.5} for i in range(2000)]).encode()
TYPE_MASK = SysFlag.COMPRESSION_TYPE_MASK


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings={"maxMessageSize": str(MIB)}) as running:
        yield running


async def pull_all(cluster: LocalCluster, topic: str, expected: int) -> list[MessageExt]:
    async with PullConsumer("CG", cluster.namesrv_addr) as consumer:

        async def routed() -> bool:  # an auto-created topic reaches the name server a bit later
            with contextlib.suppress(TopicNotExistError):
                return bool(await consumer.fetch_subscribe_message_queues(topic))
            return False

        await eventually_async(routed, what=f"a route of {topic}")
        got: list[MessageExt] = []
        for mq in await consumer.fetch_subscribe_message_queues(topic):
            result = await consumer.pull(mq, "*", 0, 32)
            assert not result.undecodable
            got.extend(result.messages)
    assert len(got) == expected
    return sorted(got, key=lambda m: m.born_timestamp)


async def test_random_body_goes_as_it_is_and_text_is_compressed(cluster: LocalCluster) -> None:
    random_body = os.urandom(64 * 1024)
    async with Producer("PG", cluster.namesrv_addr) as producer:
        await producer.send(Message("Judged", random_body, keys="random"))
        await producer.send(Message("Judged", TEXT, keys="text"))
    by_key = {m.keys[0]: m for m in await pull_all(cluster, "Judged", 2)}
    assert by_key["random"].sys_flag & SysFlag.COMPRESSED == 0
    assert by_key["random"].body == random_body
    assert by_key["text"].sys_flag & SysFlag.COMPRESSED
    assert by_key["text"].sys_flag & TYPE_MASK == 0  # zlib as every 4.x client writes it
    assert by_key["text"].body == TEXT


@pytest.mark.parametrize(
    ("codec", "bits"), [("lz4", SysFlag.COMPRESSION_LZ4), ("zstd", SysFlag.COMPRESSION_ZSTD)]
)
async def test_lz4_and_zstd_round_trip(cluster: LocalCluster, codec: str, bits: int) -> None:
    random_body = os.urandom(8 * 1024)
    async with Producer("PG", cluster.namesrv_addr, compression=codec) as producer:
        await producer.send(Message("Codecs", TEXT, keys="text"))
        await producer.send(Message("Codecs", random_body, keys="random"))
        await producer.send(Message("Codecs", b"small", keys="small"))
    by_key = {m.keys[0]: m for m in await pull_all(cluster, "Codecs", 3)}
    text = by_key["text"]
    assert text.sys_flag & (SysFlag.COMPRESSED | TYPE_MASK) == SysFlag.COMPRESSED | bits
    assert text.body == TEXT
    # A body the codec cannot shrink is sent as it is; a small one is never compressed.
    assert by_key["random"].sys_flag & SysFlag.COMPRESSED == 0
    assert by_key["random"].body == random_body
    assert by_key["small"].sys_flag == 0


class _Commit:
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def test_a_transaction_producer_compresses_halves_with_its_codec(
    cluster: LocalCluster,
) -> None:
    # The half (and so the committed copy) is encoded like a plain send of the same producer:
    # its `compression` option, not the judged zlib every half once got.
    async with TransactionProducer(
        "PG_TX", cluster.namesrv_addr, listener=_Commit(), compression="zstd"
    ) as producer:
        result = await producer.send_message_in_transaction(Message("TxCodec", TEXT))
        assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    (stored,) = await pull_all(cluster, "TxCodec", 1)
    flags = SysFlag.COMPRESSED | TYPE_MASK
    assert stored.sys_flag & flags == SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZSTD
    assert stored.body == TEXT


async def test_broker_refuses_an_lz4_bomb_over_max_message_size(cluster: LocalCluster) -> None:
    # 4 MiB of zeros is ~16 KiB of LZ4: small on the wire, 4x the broker's maxMessageSize inflated.
    async with Producer(
        "PG", cluster.namesrv_addr, compression="lz4", max_message_size=8 * MIB, retry_times=0
    ) as producer:
        with pytest.raises(MessageIllegalError, match=POISON_REMARK_PREFIX):
            await producer.send(Message("Bomb", bytes(4 * MIB)))
        ok = await producer.send(Message("Bomb", bytes(MIB // 2)))
    assert ok.msg_id


def test_unknown_compression_type_bits_are_a_clear_error() -> None:
    sys_flag = SysFlag.COMPRESSED | 0x400
    with pytest.raises(ProtocolError, match="unknown compression type bits 0x400"):
        compression.decompress(zlib.compress(TEXT), sys_flag)
    check = CompressedBodyCheck(MIB, SystemClock())
    remark = check.check(zlib.compress(TEXT), "T", "peer", sys_flag)
    assert remark is not None
    assert "unknown compression type bits 0x400" in remark
    assert check.check(zlib.compress(TEXT), "T", "peer", SysFlag.COMPRESSED) is None


@pytest.mark.parametrize("bits", [SysFlag.COMPRESSION_LZ4, SysFlag.COMPRESSION_ZSTD])
def test_truncated_and_oversized_frames_are_refused(bits: int) -> None:
    packed = compression.compress(TEXT, bits, 5)
    assert packed is not None
    flag = SysFlag.COMPRESSED | bits
    assert compression.decompress(packed, flag) == TEXT
    assert compression.decompressed_size(packed, flag, len(TEXT)) == len(TEXT)
    with pytest.raises(ProtocolError, match=r"exceeds|full frame"):
        compression.decompressed_size(packed, flag, len(TEXT) - 1)
    with pytest.raises(ProtocolError):
        compression.decompress(packed[: len(packed) // 2], flag)
    with pytest.raises(ProtocolError, match="not"):
        compression.decompress(b"this is no frame of any codec", flag)


def test_zstd_frame_declaring_a_huge_size_is_refused_before_decoding() -> None:
    packed = zstandard.ZstdCompressor().compress(bytes(8 * MIB))
    assert zstandard.frame_content_size(packed) == 8 * MIB
    with pytest.raises(ProtocolError, match=f"exceeds {MIB}"):
        compression.decompressed_size(packed, SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZSTD, MIB)


def test_judging_keeps_text_and_drops_random_bytes() -> None:
    assert compression.worth_compressing(TEXT)
    assert not compression.worth_compressing(os.urandom(4096))
    # Text at the start, random bytes after: the middle sample sees them.
    assert not compression.worth_compressing(TEXT[:1024] + os.urandom(64 * 1024))
    assert compression.compress(os.urandom(64 * 1024), 0, 5) is None
    packed = compression.compress(TEXT, 0, 5)
    assert packed is not None
    assert zlib.decompress(packed) == TEXT


def test_a_missing_codec_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_lz4(name: str, *args: Any) -> Any:
        if name.startswith("lz4"):
            raise ImportError(name)
        return real(name, *args)

    packed = lz4_frame.compress(TEXT)
    monkeypatch.setattr(importlib, "import_module", without_lz4)
    with pytest.raises(compression.CodecMissingError, match="'lz4' is needed"):
        Producer("PG", "127.0.0.1:9876", compression="lz4")
    with pytest.raises(compression.CodecMissingError, match="tidemq\\[codecs\\]"):
        compression.decompress(packed, SysFlag.COMPRESSED | SysFlag.COMPRESSION_LZ4)
    # The broker cannot check such a body: it stores it as sent, as upstream does.
    check = CompressedBodyCheck(MIB, SystemClock())
    assert check.check(packed, "T", "peer", SysFlag.COMPRESSED | SysFlag.COMPRESSION_LZ4) is None
    with pytest.raises(ValueError, match="compression must be one of"):
        Producer("PG", "127.0.0.1:9876", compression="snappy")
