"""FlushService: group commit in SYNC mode, timeouts, and a SYNC_FLUSH broker end to end."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from broker_harness import messages, running_broker

from tidemq.broker.flush import FlushService
from tidemq.protocol.codes import ResponseCode


class _Log:
    """A log whose end moves when written and whose flush can be held back."""

    def __init__(self) -> None:
        self.end = 0
        self.flushes = 0
        self.gate = threading.Event()
        self.gate.set()

    def flush(self) -> int:
        self.gate.wait(5)
        self.flushes += 1
        return self.end


@asynccontextmanager
async def _stuck_sync_service(log: _Log, sync_timeout_ms: float) -> AsyncIterator[FlushService]:
    """A started SYNC service whose flushes hang until the block ends; then they go on and the
    service is stopped."""
    log.gate.clear()
    service = FlushService(
        log.flush, sync=True, interval_ms=10_000, sync_timeout_ms=sync_timeout_ms
    )
    service.start()
    try:
        yield service
    finally:
        log.gate.set()
        await service.stop()


async def test_one_flush_serves_many_waiters() -> None:
    log = _Log()
    service = FlushService(log.flush, sync=True, interval_ms=10_000, sync_timeout_ms=5000)
    service.start()
    try:
        log.end = 5000
        results = await asyncio.gather(*(service.wait_flushed(i * 100) for i in range(1, 51)))
        assert all(results)
        assert log.flushes <= 2  # group commit: not one fsync per waiter
        assert service.flushed_offset == 5000
    finally:
        await service.stop()


async def test_waiter_times_out_when_the_flush_is_stuck() -> None:
    log = _Log()
    async with _stuck_sync_service(log, sync_timeout_ms=100) as service:
        log.end = 10
        assert await service.wait_flushed(10) is False
    assert service.flushed_offset == 10


async def test_each_waiter_times_out_at_its_own_deadline() -> None:
    # One expiry timer serves all waiters: it fails the due ones and re-arms for the next.
    log = _Log()
    loop = asyncio.get_running_loop()
    async with _stuck_sync_service(log, sync_timeout_ms=100) as service:

        async def timed_wait(end: int) -> tuple[bool, float]:
            started = loop.time()
            flushed = await service.wait_flushed(end)
            return flushed, loop.time() - started

        log.end = 20
        first = asyncio.ensure_future(timed_wait(10))
        await asyncio.sleep(0.05)  # the second waiter arrives half a timeout later
        second = asyncio.ensure_future(timed_wait(20))
        (ok1, waited1), (ok2, waited2) = await asyncio.gather(first, second)
        assert (ok1, ok2) == (False, False)
        assert waited1 >= 0.09
        assert waited2 >= 0.09


async def test_async_mode_never_waits() -> None:
    log = _Log()
    log.gate.clear()
    service = FlushService(log.flush, sync=False, interval_ms=10_000, sync_timeout_ms=100)
    assert await service.wait_flushed(10**9) is True
    log.gate.set()


async def test_sync_flush_broker(tmp_path: Path) -> None:
    async with running_broker(tmp_path, flushDiskType="SYNC_FLUSH") as broker:
        sends = [broker.send("TopicS", b"%d" % i) for i in range(20)]
        responses = await asyncio.gather(*sends)
        assert {r.code for r in responses} == {ResponseCode.SUCCESS}
        assert broker.app.store.flushed_physical_offset >= broker.app.store.max_physical_offset
        assert len(messages(await broker.pull("TopicS"))) == 20


async def test_callback_waiters_are_released_by_one_flush() -> None:
    # A group of sends waits as one callback: no future, no task.
    log = _Log()
    service = FlushService(log.flush, sync=True, interval_ms=10_000, sync_timeout_ms=5000)
    service.start()
    try:
        log.end = 300
        released: list[tuple[str, bool]] = []
        done = asyncio.Event()

        def waiter(name: str) -> Callable[[bool], None]:
            def release(flushed: bool) -> None:
                released.append((name, flushed))
                if len(released) == 3:
                    done.set()

            return release

        def broken(flushed: bool) -> None:
            raise RuntimeError("a waiter's own failure")

        service.on_flushed(100, waiter("a"))
        service.on_flushed(200, broken)
        service.on_flushed(300, waiter("b"))
        assert service.waiting == 3
        await asyncio.wait_for(service.wait_flushed(300), 5)
        service.on_flushed(300, waiter("flushed already"))  # called at once
        await asyncio.wait_for(done.wait(), 5)
        assert released == [("a", True), ("b", True), ("flushed already", True)]
        assert service.waiting == 0
    finally:
        await service.stop()


async def test_callback_waiter_times_out_and_stop_releases_the_rest() -> None:
    log = _Log()
    released: list[bool] = []
    async with _stuck_sync_service(log, sync_timeout_ms=50) as service:
        log.end = 10
        timed_out = asyncio.get_running_loop().create_future()
        service.on_flushed(10, timed_out.set_result)
        assert await asyncio.wait_for(timed_out, 5) is False
        service.on_flushed(10**6, released.append)  # beyond any flush: released by stop
    assert released == [False]


async def test_async_mode_calls_back_at_once() -> None:
    log = _Log()
    service = FlushService(log.flush, sync=False, interval_ms=10_000, sync_timeout_ms=100)
    released: list[bool] = []
    service.on_flushed(10**9, released.append)
    assert released == [True]


async def test_a_round_does_not_wait_behind_the_full_flush() -> None:
    # SYNC: consume queues, index and checkpoint are flushed beside the group-commit rounds, so
    # an acknowledgement never waits for them (they took tens of ms after a large backlog).
    log = _Log()
    full_entered = threading.Event()
    full_gate = threading.Event()
    full_flushes: list[int] = []

    def full_flush() -> int:
        full_entered.set()
        full_gate.wait(5)
        full_flushes.append(log.end)
        return log.end

    service = FlushService(
        full_flush, sync=True, interval_ms=20, sync_timeout_ms=5000, flush_log=log.flush
    )
    service.start()
    try:
        assert await asyncio.to_thread(full_entered.wait, 5)
        log.end = 700
        assert await asyncio.wait_for(service.wait_flushed(700), 2) is True
        assert log.flushes >= 1
        assert full_flushes == []  # the full flush is still held: the round went past it
    finally:
        full_gate.set()
        await service.stop()
    assert full_flushes  # it did finish, and stop() ran a last one


async def test_a_waiter_arriving_during_a_round_gets_the_next_one() -> None:
    # SYNC rounds run on the service's own thread: the running round may have captured the end
    # before the new waiter's bytes, so that waiter kicks another round right after it.
    log = _Log()
    in_round = threading.Event()
    ends: list[int] = []

    def flush_log() -> int:
        end = log.end
        in_round.set()
        log.gate.wait(5)
        ends.append(end)
        return end

    log.gate.clear()
    service = FlushService(
        log.flush, sync=True, interval_ms=10_000, sync_timeout_ms=5000, flush_log=flush_log
    )
    service.start()
    try:
        log.end = 100
        first = asyncio.ensure_future(service.wait_flushed(100))
        assert await asyncio.to_thread(in_round.wait, 5)
        log.end = 200  # appended while the first round is in its fdatasync
        second = asyncio.ensure_future(service.wait_flushed(200))
        await asyncio.sleep(0)
        assert not first.done()
        log.gate.set()
        assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
        assert ends == [100, 200]
    finally:
        log.gate.set()
        await service.stop()
    assert not any(t.name == "flush-service-rounds" for t in threading.enumerate())
