"""Consuming as Python (issue 16 items 7 and 8): subscriptions and the listener given to the
constructor, `async for message in consumer`, the blocking push consumer and its iterator; what
the loop finished is committed, and a failure in the loop body sends the message back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq import (
    Admin,
    BlockingPullConsumer,
    BlockingPushConsumer,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
)
from tidemq.client import iterate
from tidemq.errors import ClientError
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

TOPIC = "IterTopic"
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
# Level 3 (the first retry of a message sent back) is 300 ms here instead of 10 s.
FAST_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms"
# Shutdown must not wait for what the loop never received (the consumer's own wait is 10 s).
SHUTDOWN_S_MAX = 5
# How long a loop waits to show nothing more comes (a retry here comes within ~1 s).
NOTHING_MORE_S = 2
# A blocking loop's idle timeout: generous, as this 2-core machine may be loaded.
IDLE_S = 5


class Boom(Exception):
    pass


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings={"messageDelayLevel": FAST_LEVELS}) as c:
        async with Admin(c.namesrv_addr) as admin:
            # One queue: the committed offset is one number, the order is the send order.
            await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
        async with Producer("PG-iter", c.namesrv_addr) as producer:
            for n in range(10):
                await producer.send(Message(TOPIC, f"m{n}", tags="even" if n % 2 else "odd"))
        yield c


def consumer(cluster: LocalCluster, group: str, **options: object) -> PushConsumer:
    return PushConsumer(
        group,
        cluster.namesrv_addr,
        subscriptions={TOPIC: "*"},
        consume_from_where=FIRST,
        rebalance_interval_ms=200,
        **options,  # type: ignore[arg-type]
    )


async def committed(cluster: LocalCluster, group: str) -> int:
    async with PullConsumer(group, cluster.namesrv_addr) as reader:
        (mq,) = await reader.fetch_subscribe_message_queues(TOPIC)
        return await reader.fetch_consumer_offset(mq)


async def test_constructor_takes_subscriptions_and_listener(cluster: LocalCluster) -> None:
    got: list[MessageExt] = []
    async with PushConsumer(
        "CG-ctor",
        cluster.namesrv_addr,
        subscriptions={TOPIC: "odd"},
        listener=got.extend,
        consume_from_where=FIRST,
    ):
        await eventually(lambda: len(got) == 5, what="the five odd-tagged messages")
    assert sorted(m.body for m in got) == [b"m0", b"m2", b"m4", b"m6", b"m8"]


async def test_start_says_how_to_subscribe(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match=r"pass subscriptions=\{topic: expression\}"):
        await PushConsumer("CG-none", cluster.namesrv_addr).start()
    both = consumer(cluster, "CG-both", listener=print)
    with pytest.raises(ClientError, match="calls its listener"):
        aiter(both)
    await both.shutdown()


async def test_async_for_commits_what_the_loop_finished(cluster: LocalCluster) -> None:
    seen: list[bytes] = []
    async with asyncio.timeout(SHUTDOWN_S_MAX), consumer(cluster, "CG-iter") as c:
        async for message in c:
            seen.append(message.body)
            if len(seen) == 5:
                break  # the `async with` ends normally: m4 is finished too
    assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert await committed(cluster, "CG-iter") == 5

    rest: list[bytes] = []
    async with consumer(cluster, "CG-iter") as again:
        async for message in again:
            rest.append(message.body)
            if len(rest) == 5:
                break
    assert rest == [b"m5", b"m6", b"m7", b"m8", b"m9"]
    assert await committed(cluster, "CG-iter") == 10


async def test_a_failing_loop_body_sends_the_message_back(cluster: LocalCluster) -> None:
    async def fail_on_m3() -> None:
        async with asyncio.timeout(SHUTDOWN_S_MAX), consumer(cluster, "CG-fail") as c:
            async for message in c:
                if message.body == b"m3":
                    raise Boom

    with pytest.raises(Boom):
        await fail_on_m3()
    # m0..m2 finished, m3 failed and went back (so it counts as done here), m4.. never received.
    assert await committed(cluster, "CG-fail") == 4

    got: list[MessageExt] = []
    async with consumer(cluster, "CG-fail") as again:
        async for message in again:
            got.append(message)
            if len(got) == 7:
                break
    assert sorted(m.body for m in got) == [b"m%d" % n for n in range(3, 10)]
    (retried,) = [m for m in got if m.body == b"m3"]
    assert retried.reconsume_times == 1
    assert retried.topic == TOPIC  # restored from %RETRY%CG-fail, as a listener sees it


async def read_until_m3_fails(c: PushConsumer, bodies: list[tuple[bytes, int]]) -> None:
    async for message in c:
        bodies.append((message.body, message.reconsume_times))
        if message.body == b"m3":
            raise Boom


async def test_break_then_a_new_loop_goes_on(cluster: LocalCluster) -> None:
    bodies: list[tuple[bytes, int]] = []
    async with consumer(cluster, "CG-again") as c:
        async for message in c:
            bodies.append((message.body, message.reconsume_times))
            if message.body == b"m3":
                break  # the body that received m3 completed: m3 is finished
        with contextlib.suppress(TimeoutError):
            # m4..m9, then nothing: m3 does not come back (a retry would within 2 s here).
            async with asyncio.timeout(NOTHING_MORE_S):
                async for message in c:
                    bodies.append((message.body, message.reconsume_times))
    assert bodies == [(b"m%d" % n, 0) for n in range(10)]
    assert await committed(cluster, "CG-again") == 10


async def test_a_task_that_raises_in_its_loop_is_logged(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    bodies: list[tuple[bytes, int]] = []
    async with consumer(cluster, "CG-task-raises") as c:
        task = asyncio.create_task(read_until_m3_fails(c, bodies))
        await eventually(task.done, what="the loop's task raised")

        # Nobody awaits the task: the exception must still be seen (not only retrieved). The
        # task's done callbacks run a loop turn after it is done: wait for the record.
        def boom_records() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.exc_info and r.exc_info[0] is Boom]

        await eventually(boom_records, what="the loop's failure logged")
        (record,) = boom_records()
        assert "go back for a retry" in record.getMessage()
        with pytest.raises(Boom):
            await task


async def test_a_consumer_nothing_reads_says_so(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(iterate, "NOTHING_ITERATES_WARN_S", 0.5, raising=False)
    async with consumer(cluster, "CG-forgot-listener"):
        await eventually(
            lambda: any("nothing iterates this consumer" in r.getMessage() for r in caplog.records),
            what="the warning that nothing reads the consumer",
        )
    (record,) = [r for r in caplog.records if "nothing iterates" in r.getMessage()]
    assert "register_listener()" in record.getMessage()
    assert "async for message in consumer" in record.getMessage()


async def test_workers_iterate_one_consumer(cluster: LocalCluster) -> None:
    seen: list[bytes] = []

    async def worker(c: PushConsumer) -> None:
        async for message in c:
            seen.append(message.body)
            await asyncio.sleep(0)  # let the other worker take one

    async with consumer(cluster, "CG-workers") as c:
        workers = [asyncio.create_task(worker(c)) for _ in range(3)]
        await eventually(lambda: len(seen) == 10, what="all ten read by the workers")
        for task in workers:
            # A worker cancelled while on a message sends it back (counted done here); one
            # waiting for the next has finished its last.
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    assert sorted(seen) == sorted(b"m%d" % n for n in range(10))
    assert await committed(cluster, "CG-workers") == 10


async def test_leaving_async_with_leaves_a_workers_message_unfinished(
    cluster: LocalCluster,
) -> None:
    finished: list[bytes] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def worker(c: PushConsumer) -> None:
        async for message in c:
            if message.body == b"m0":
                holding.set()
                await release.wait()  # mid-body when the `async with` below ends
            else:
                finished.append(message.body)

    async with consumer(cluster, "CG-mid-body") as c:
        workers = [asyncio.create_task(worker(c)) for _ in range(2)]
        await holding.wait()
        await eventually(lambda: len(finished) == 9, what="m1..m9 finished by the other worker")
    release.set()
    await asyncio.gather(*workers)
    # m0 was never finished: it is read again, and so is everything after it (one queue).
    assert await committed(cluster, "CG-mid-body") == 0


async def test_blocking_push_consumer_iterates(cluster: LocalCluster) -> None:
    def run() -> tuple[list[bytes], int]:
        with BlockingPushConsumer(
            "CG-blocking",
            cluster.namesrv_addr,
            subscriptions={TOPIC: "*"},
            consume_from_where=FIRST,
            rebalance_interval_ms=200,
        ) as c:
            seen: list[bytes] = []
            for message in c.iterate(idle_timeout_s=IDLE_S):
                seen.append(message.body)
                if len(seen) == 10:
                    break  # leaving the `with` normally: m9 is finished too
        with BlockingPullConsumer("CG-blocking", cluster.namesrv_addr) as reader:
            (mq,) = reader.fetch_subscribe_message_queues(TOPIC)
            return seen, reader.fetch_consumer_offset(mq)

    seen, offset = await asyncio.to_thread(run)
    assert seen == [b"m%d" % n for n in range(10)]
    assert offset == 10


async def test_leaving_with_leaves_another_threads_message_unfinished(
    cluster: LocalCluster,
) -> None:
    holding, nine_finished, release = threading.Event(), threading.Event(), threading.Event()
    finished: list[bytes] = []

    def worker(c: BlockingPushConsumer) -> None:
        for message in c.iterate(idle_timeout_s=IDLE_S):
            if message.body == b"m0":
                holding.set()
                release.wait(SHUTDOWN_S_MAX)  # mid-body when the `with` below ends
            else:
                finished.append(message.body)
                if len(finished) == 9:
                    nine_finished.set()

    def run() -> int:
        with BlockingPushConsumer(
            "CG-blocking-mid-body",
            cluster.namesrv_addr,
            subscriptions={TOPIC: "*"},
            consume_from_where=FIRST,
            rebalance_interval_ms=200,
        ) as c:
            threads = [threading.Thread(target=worker, args=(c,)) for _ in range(2)]
            for thread in threads:
                thread.start()
            assert holding.wait(SHUTDOWN_S_MAX)
            assert nine_finished.wait(SHUTDOWN_S_MAX)
        release.set()
        for thread in threads:
            thread.join(SHUTDOWN_S_MAX)
        with BlockingPullConsumer("CG-blocking-mid-body", cluster.namesrv_addr) as reader:
            (mq,) = reader.fetch_subscribe_message_queues(TOPIC)
            return reader.fetch_consumer_offset(mq)

    # m0 was never finished (its thread was mid-body): it is read again, and all after it.
    assert await asyncio.to_thread(run) == 0


async def test_blocking_push_consumer_with_a_listener(cluster: LocalCluster) -> None:
    got: list[bytes] = []
    all_in = threading.Event()

    def listener(messages: list[MessageExt]) -> None:  # runs on the consumer's thread pool
        got.extend(m.body for m in messages)
        if len(got) == 5:
            all_in.set()

    def run() -> bool:
        with BlockingPushConsumer(
            "CG-blocking-listener",
            cluster.namesrv_addr,
            subscriptions={TOPIC: "even"},
            listener=listener,
            consume_from_where=FIRST,
        ):
            return all_in.wait(10)

    assert await asyncio.to_thread(run)
    assert sorted(got) == [b"m1", b"m3", b"m5", b"m7", b"m9"]


async def test_blocking_loop_that_raises_sends_the_message_back(cluster: LocalCluster) -> None:
    def run() -> None:
        with BlockingPushConsumer(
            "CG-blocking-fail",
            cluster.namesrv_addr,
            subscriptions={TOPIC: "*"},
            consume_from_where=FIRST,
        ) as c:
            for message in c:
                if message.body == b"m2":
                    raise Boom

    with pytest.raises(Boom):
        await asyncio.to_thread(run)
    assert await committed(cluster, "CG-blocking-fail") == 3  # m2 went back: done here


async def test_orderly_consumer_iterates_in_order(cluster: LocalCluster) -> None:
    seen: list[bytes] = []
    async with consumer(cluster, "CG-orderly", orderly=True) as c:
        async for message in c:
            seen.append(message.body)
            if len(seen) == 10:
                break
    assert seen == [b"m%d" % n for n in range(10)]
    assert await committed(cluster, "CG-orderly") == 10
