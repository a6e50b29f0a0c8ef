"""SYNC_FLUSH group commit syncs only the commit log; the full flush still runs (issue 6)."""

from __future__ import annotations

import asyncio

from tidemq.broker.flush import FlushService


class _Store:
    def __init__(self) -> None:
        self.end = 0
        self.full = 0
        self.log_only = 0

    def flush(self) -> int:
        self.full += 1
        return self.end

    def flush_log(self) -> int:
        self.log_only += 1
        return self.end


async def test_rounds_with_waiters_sync_only_the_log() -> None:
    store = _Store()
    service = FlushService(
        store.flush, sync=True, interval_ms=60_000, sync_timeout_ms=5000, flush_log=store.flush_log
    )
    service.start()
    try:
        for end in range(100, 600, 100):
            store.end = end
            assert await service.wait_flushed(end)
        assert store.full <= 1  # at most the first round, then only the interval's
        assert store.log_only >= 4
    finally:
        await service.stop()
    assert store.full >= 1  # stop always runs a full flush


async def test_full_flush_still_runs_under_constant_sync_load() -> None:
    store = _Store()
    service = FlushService(
        store.flush, sync=True, interval_ms=20, sync_timeout_ms=5000, flush_log=store.flush_log
    )
    service.start()
    try:
        full_before = store.full
        async with asyncio.timeout(5):
            while store.full < full_before + 2:
                store.end += 1
                assert await service.wait_flushed(store.end)
    finally:
        await service.stop()


async def test_waiter_timeout_without_wait_for() -> None:
    store = _Store()
    service = FlushService(store.flush, sync=True, interval_ms=60_000, sync_timeout_ms=50)
    # Not started: nobody flushes, so the waiter's own timer must release it.
    assert await service.wait_flushed(10) is False
