"""Durability in controller mode: the sync set's acknowledgement is always waited for, and a
SUCCESS given while the master's lease is lost becomes SERVICE_NOT_AVAILABLE (the message is
stored, the producer must not count it); other codes pass unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from test_durability import Acks, Flushes, flush_service, outcome

from tidemq.broker.durability import LEASE_LOST_REMARK, Durability
from tidemq.broker.flush import FlushService
from tidemq.broker.ha import HAMaster, HASettings
from tidemq.clock import SystemClock
from tidemq.protocol.codes import ResponseCode
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig

LOST = (ResponseCode.SERVICE_NOT_AVAILABLE, LEASE_LOST_REMARK)


class Lease:
    """A stand-in LeaseKeeper.valid: flipped by the test; counts the questions."""

    def __init__(self, valid: bool = True) -> None:
        self.valid = valid
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.valid


async def test_group_mode_always_waits_and_needs_the_ha_master() -> None:
    acks = Acks()
    durability = Durability(flush_service(sync=False), acks, sync_master=False, group=True)
    assert durability.waits
    assert await outcome(durability, 42) == (ResponseCode.SUCCESS, "")
    assert acks.ends == [42, 42]
    with pytest.raises(ValueError, match="HA master"):
        Durability(flush_service(sync=False), None, sync_master=False, group=True)


@pytest.mark.parametrize("valid", [True, False])
async def test_a_success_is_fenced_by_the_lease(valid: bool) -> None:
    lease = Lease(valid)
    durability = Durability(
        flush_service(sync=False), Acks(), sync_master=False, group=True, fence=lease
    )
    answer = await outcome(durability, 7)  # on_durable, then wait_durable: the same answer
    assert answer == ((ResponseCode.SUCCESS, "") if valid else LOST)
    assert lease.asked == 2


async def test_the_fence_is_read_when_the_answer_is_given() -> None:
    """A lease lost while the send waited for its acks fences it (and a lease back in time
    lets a later one through)."""
    lease = Lease(True)
    acks = Acks(None)
    flushes = Flushes()
    durability = Durability(
        cast(FlushService, flushes), acks, sync_master=False, group=True, fence=lease
    )
    got: list[tuple[int, str]] = []
    durability.on_durable(10, lambda code, remark: got.append((code, remark)))
    waiting = asyncio.ensure_future(durability.wait_durable(10))
    await asyncio.sleep(0)
    assert lease.asked == 0
    lease.valid = False
    for held in flushes.held:
        held(True)
    acks.held[0](ResponseCode.SUCCESS)
    assert got == [LOST]
    lease.valid = True
    acks.held[1](ResponseCode.SUCCESS)
    assert await waiting == (ResponseCode.SUCCESS, "")


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (ResponseCode.FLUSH_SLAVE_TIMEOUT, "not every replica of the sync set acknowledged it"),
        (ResponseCode.SLAVE_NOT_AVAILABLE, "stopped before the sync set acknowledged it"),
    ],
)
async def test_other_codes_pass_the_fence_unchanged(code: int, needle: str) -> None:
    lease = Lease(False)
    durability = Durability(
        flush_service(sync=False), Acks(code), sync_master=False, group=True, fence=lease
    )
    answer, remark = await outcome(durability, 3)
    assert answer == code
    assert needle in remark
    assert lease.asked == 0


async def test_a_flush_failure_passes_the_fence_unchanged() -> None:
    flushes = Flushes()
    flushes.on_flushed = lambda end, callback: callback(False)  # type: ignore[method-assign]
    lease = Lease(False)
    durability = Durability(
        cast(FlushService, flushes), Acks(), sync_master=False, group=True, fence=lease
    )
    code, _ = await outcome(durability, 3)
    assert code == ResponseCode.FLUSH_DISK_TIMEOUT
    assert lease.asked == 0


async def test_a_fence_that_raises_is_a_lost_lease(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> bool:
        raise RuntimeError("fence bug")

    durability = Durability(
        flush_service(sync=False), Acks(), sync_master=False, group=True, fence=broken
    )
    assert await outcome(durability, 1) == LOST
    assert "lease fence" in caplog.text


# -- with a real HA master ------------------------------------------------------------------------


def _message() -> MessageToStore:
    return MessageToStore(
        topic="T",
        queue_id=0,
        body=b"x" * 100,
        flag=0,
        properties="",
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
    )


async def test_a_real_master_alone_and_one_that_misses_a_member(tmp_path: Path) -> None:
    clock = SystemClock()
    store = FileMessageStore(StoreConfig(root_dir=tmp_path, commit_log_file_size=64 * 1024), clock)
    store.start()
    settings = HASettings(
        secret=b"s" * 16, listen_host="127.0.0.1", listen_port=0, sync_timeout_ms=100
    )
    master = HAMaster(store, settings, clock)
    lease = Lease(True)
    try:
        await master.start()
        durability = Durability(
            flush_service(sync=False),
            master,
            sync_master=False,
            sync_flush_timeout_ms=100,
            group=True,
            fence=lease,
        )
        result = store.put_message(_message())
        end = result.physical_offset + result.size
        master.set_sync_set(frozenset({1}), 1)  # the master alone: acknowledged at once
        assert await durability.wait_durable(end) == (ResponseCode.SUCCESS, "")
        lease.valid = False
        assert await durability.wait_durable(end) == LOST
        lease.valid = True
        master.set_sync_set(frozenset({1, 2}), 1)  # member 2 never connects: waited for
        code, remark = await durability.wait_durable(end)
        assert code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert "within 100 ms" in remark
    finally:
        await master.stop()
        store.shutdown()
