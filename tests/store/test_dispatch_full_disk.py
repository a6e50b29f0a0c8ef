"""A full disk while creating a consume-queue file heals without a restart (issue 11, item 5).

The record is in the commit log and answered as stored, but its consume-queue file could not be
created (ENOSPC). Before, the store then refused every send ("restart the broker to
re-dispatch") and the acknowledged message stayed unreadable until a restart, even after space
was freed. Now the store re-dispatches by itself with backoff (store/dispatch_retry.py), driven
by refused sends and by the broker's tick.

The full disk is injected where it strikes, as tests/store/test_put_failures.py does: the
creation of a consume-queue file raises OSError(ENOSPC) (a real posix_fallocate of its first page
on a full disk does), for as long as the test keeps the disk "full".
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from store_helpers import bodies, make_config, message

from tidemq.client.message import Message, SendStatus
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.clock import FakeClock
from tidemq.protocol.bodies_client import MessageQueue
from tidemq.store import DispatchEvent, FileMessageStore, PutStatus
from tidemq.store.dispatch_retry import (
    DISPATCH_RETRY_INTERVAL_MS_MAX,
    DISPATCH_RETRY_INTERVAL_MS_MIN,
)
from tidemq.store.lazy_file import LazyMappedFile, MappingCache
from tidemq.testing import eventually_async, local_cluster

TOPIC: Final = "FullDiskTopic"
# The broker ticks the retry every DISPATCH_RETRY_INTERVAL_MS_MIN; the first retry after space
# is back comes within one backoff step (at most DISPATCH_RETRY_INTERVAL_MS_MAX) plus a tick.
READABLE_WITHIN_S: Final = 10.0


class FullDisk:
    """While `full`, creating a consume-queue file of `queue_dir` fails with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, queue_dir: str) -> None:
        self.full = True
        self.refused = 0
        real_create = LazyMappedFile.create_sparse.__func__  # type: ignore[attr-defined]

        def create(
            cls: type[LazyMappedFile], path: Path, start: int, size: int, cache: MappingCache
        ) -> LazyMappedFile:
            if self.full and f"/consumequeue/{queue_dir}/" in str(path):
                self.refused += 1
                raise OSError(errno.ENOSPC, "injected: no space for a consume-queue file")
            made: LazyMappedFile = real_create(cls, path, start, size, cache)
            return made

        monkeypatch.setattr(LazyMappedFile, "create_sparse", classmethod(create))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileMessageStore]:
    opened = FileMessageStore(make_config(tmp_path, commit_log_file_size=1 << 20), FakeClock())
    opened.start()
    yield opened
    opened.shutdown()


def test_the_store_redispatches_by_itself_once_space_is_back(
    store: FileMessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    events: list[DispatchEvent] = []
    store.add_dispatch_listener(events.append)
    assert store.put_message(message(0, queue_id=0)).ok
    disk = FullDisk(monkeypatch, "T/1")
    stored = store.put_message(message(1, queue_id=1))
    assert stored.status is PutStatus.PUT_OK  # in the log: acknowledged
    assert bodies(store, queue_id=1) == []  # but not readable yet
    refused = store.put_message(message(2, queue_id=0))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "re-dispatched" in refused.error
    # Still full: retries back off (100, 200, 400 ... 5000 ms), they do not spin.
    for _ in range(1_000):
        clock.advance(10)
        assert not store.retry_dispatch()
    assert 5 <= disk.refused <= 8, disk.refused
    # Space is back: no send needed, the next due retry dispatches the stored record.
    disk.full = False
    clock.advance(DISPATCH_RETRY_INTERVAL_MS_MAX)
    assert store.retry_dispatch()
    assert bodies(store, queue_id=1) == [message(1, queue_id=1).body]
    assert [(e.queue_id, e.queue_offset) for e in events] == [(0, 0), (1, 0)]
    after = store.put_message(message(3, queue_id=1))
    assert after.status is PutStatus.PUT_OK
    assert after.queue_offset == 1
    assert bodies(store, queue_id=1) == [message(1, queue_id=1).body, message(3, queue_id=1).body]


def test_a_send_after_space_is_back_triggers_the_retry(
    store: FileMessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    disk = FullDisk(monkeypatch, "T/0")
    assert store.put_message(message(0)).ok
    disk.full = False
    clock.advance(DISPATCH_RETRY_INTERVAL_MS_MIN)
    resumed = store.put_message(message(1))
    assert resumed.status is PutStatus.PUT_OK, resumed.error
    assert bodies(store) == [message(0).body, message(1).body]


@pytest.mark.integration
async def test_an_acknowledged_message_becomes_readable_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_cluster(tmp_path) as cluster:
        broker_name = cluster.brokers[0].config.broker_name
        q0, q1 = (MessageQueue(TOPIC, broker_name, n) for n in (0, 1))
        async with Producer("FullDiskPG", cluster.namesrv_addr) as producer:
            first = await producer.send(Message(TOPIC, b"before"), queue=q0)
            assert first.status is SendStatus.SEND_OK
            disk = FullDisk(monkeypatch, f"{TOPIC}/1")
            acked = await producer.send(Message(TOPIC, b"acknowledged"), queue=q1)
            assert acked.status is SendStatus.SEND_OK
            assert disk.refused >= 1
            async with PullConsumer("FullDiskCG", cluster.namesrv_addr) as consumer:
                assert (await consumer.pull(q1, "*", 0, 32)).messages == []
                disk.full = False  # space freed; nothing is sent from here on

                async def readable() -> bool:
                    pulled = await consumer.pull(q1, "*", 0, 32)
                    return [m.body for m in pulled.messages] == [b"acknowledged"]

                await eventually_async(readable, READABLE_WITHIN_S, what="re-dispatch")
            later = await producer.send(Message(TOPIC, b"after"), queue=q1)
            assert later.status is SendStatus.SEND_OK
            assert later.queue_offset == 1
