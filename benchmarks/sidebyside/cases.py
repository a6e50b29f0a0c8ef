"""The measured cases. Each takes a connected driver and returns one run's figures as a dict.

Every case starts on a fresh stream/topic (`driver.reset()`), warms up, then measures until its
count or `options.measure_s`, whichever comes first. Throughput cases report `rate` (messages
per second acknowledged); latency cases report microsecond percentiles.

The latency case runs its consumer in a separate process (spawned, so no state is shared) and
an open-loop producer here: message i is sent at t0 + i / rate whatever the acks do, with each
body stamped with time.monotonic_ns() (one clock for both processes on Linux).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sidebyside.common import (
    Options,
    age_us,
    cpu_foreign_cores,
    cpu_snapshot,
    payload,
    percentile,
    stamped,
    window_for,
)
from sidebyside.drivers import DRIVERS, Driver

WARM_UP_COUNT = 50
PREFILL_S = 20.0  # cap on writing the consume case's backlog
LATENCY_DRAIN_S = 10.0  # after the producer stops, how long the consumer may still take
CPP_TIMEOUT_S = 60.0


async def produce_sync(driver: Driver, options: Options) -> dict[str, Any]:
    body = payload(1024)
    await driver.reset()
    for _ in range(WARM_UP_COUNT):
        await driver.send(body)
    acks_us: list[float] = []
    start = time.monotonic()
    deadline = start + options.measure_s
    while len(acks_us) < options.count_sync and time.monotonic() < deadline:
        sent_ns = time.perf_counter_ns()
        await driver.send(body)
        acks_us.append((time.perf_counter_ns() - sent_ns) / 1e3)
    elapsed = time.monotonic() - start
    return {
        "rate": len(acks_us) / elapsed,
        "ack_p50_us": percentile(acks_us, 0.5),
        "ack_p99_us": percentile(acks_us, 0.99),
        "count": len(acks_us),
    }


async def produce_pipelined(driver: Driver, options: Options, size: int = 1024) -> dict[str, Any]:
    body = payload(size)
    window = window_for(size, options)
    await driver.reset()
    await driver.send_pipelined(
        min(1000, options.count_pipelined), body, time.monotonic() + 5, window
    )
    start = time.monotonic()
    count = await driver.send_pipelined(
        options.count_pipelined, body, start + options.measure_s, window
    )
    elapsed = time.monotonic() - start
    return {"rate": count / elapsed, "mib_s": count * size / elapsed / 2**20, "window": window}


async def produce_batched(driver: Driver, options: Options) -> dict[str, Any]:
    body = payload(1024)
    await driver.reset()
    await driver.send_batched(1000, body, time.monotonic() + 5)
    start = time.monotonic()
    count = await driver.send_batched(options.count_pipelined, body, start + options.measure_s)
    elapsed = time.monotonic() - start
    return {"rate": count / elapsed}


async def consume(driver: Driver, options: Options) -> dict[str, Any]:
    body = payload(1024)
    await driver.reset()
    filled = await driver.send_batched(options.count_consume, body, time.monotonic() + PREFILL_S)
    start = time.monotonic()
    got = await driver.consume(filled, start + max(options.measure_s * 2, 2.0))
    elapsed = time.monotonic() - start
    return {"rate": got / elapsed, "prefilled": filled, "count": got}


def _latency_consumer(
    name: str,
    address: str,
    options: Options,
    state: dict[str, Any],
    count: int,
    until_s: float,
    ready: Any,
    results: Any,
) -> None:
    """Runs in the consumer process: receives until `count` messages or wall time `until_s`."""
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()

    async def main() -> list[float]:
        driver = DRIVERS[name](address, options, state)
        await driver.connect()
        ages: list[float] = []
        ready.set()
        try:
            await driver.consume(
                count,
                time.monotonic() + max(1.0, until_s - time.time()),
                lambda body: ages.append(age_us(body)),
            )
        finally:
            await driver.close()
        return ages

    try:
        results.put(asyncio.run(main()))
    except Exception as exc:  # Reported to the producer side, which records the failed run.
        results.put(f"consumer: {type(exc).__name__}: {exc}")
    results.close()
    results.join_thread()  # the queue's feeder thread must have written before we leave
    os._exit(0)  # the drivers' clients have nothing worth flushing; leave at once


async def latency(driver: Driver, options: Options, rate: int) -> dict[str, Any]:
    await driver.reset()
    count = int(rate * options.latency_s)
    context = multiprocessing.get_context("spawn")
    ready, results = context.Event(), context.Queue()
    until_s = time.time() + options.latency_s + LATENCY_DRAIN_S
    consumer = context.Process(
        target=_latency_consumer,
        args=(driver.name, driver.address, options, driver.state(), count, until_s, ready, results),
        daemon=True,
    )
    consumer.start()
    try:
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, ready.wait, 60):
            raise RuntimeError("latency consumer did not start")
        await asyncio.sleep(0.3)  # let its subscription settle (first long poll in place)
        body = payload(1024)
        acks_us: list[float] = []
        tasks: set[asyncio.Task[None]] = set()
        in_flight = asyncio.Semaphore(options.window)

        async def one() -> None:
            try:
                sent_ns = time.monotonic_ns()
                await driver.send(stamped(body))
                acks_us.append((time.monotonic_ns() - sent_ns) / 1e3)
            finally:
                in_flight.release()

        start = time.monotonic()
        for index in range(count):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await in_flight.acquire()
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        elapsed = time.monotonic() - start
        ages = await loop.run_in_executor(None, results.get, True, LATENCY_DRAIN_S + 30)
        if isinstance(ages, str):
            raise RuntimeError(ages)
    finally:
        consumer.join(10)
        if consumer.is_alive():
            consumer.kill()
    return {
        "rate_achieved": count / elapsed,
        "received": len(ages),
        "e2e_p50_us": percentile(ages, 0.5),
        "e2e_p99_us": percentile(ages, 0.99),
        "ack_p50_us": percentile(acks_us, 0.5),
        "ack_p99_us": percentile(acks_us, 0.99),
    }


async def transactions(address: str, options: Options) -> dict[str, Any]:
    """TideMQ only: half -> local transaction (no-op COMMIT) -> END_TRANSACTION, vs plain sends.

    Both shapes use one TransactionProducer, `options.window` in flight, 1 KiB bodies.
    """
    from tidemq import Admin, LocalTransactionState, Message, QueueError, TransactionProducer

    class Commit:
        def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, message: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    body = payload(1024)
    suffix = int(time.monotonic() * 1000) % 1_000_000
    topics = (f"BenchPlain{suffix}", f"BenchTx{suffix}")
    async with Admin(address) as admin:
        for topic in topics:
            for _ in range(100):
                try:
                    await admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4)
                    break
                except QueueError:
                    await asyncio.sleep(0.1)
    producer = TransactionProducer(f"bench_tx_{suffix}", address, listener=Commit())
    await producer.start()
    rates: dict[str, float] = {}
    try:
        for topic in topics:
            await producer.send(Message(topic, b"warm-up"))

        async def timed(one: Any) -> float:
            done = 0
            deadline = time.monotonic() + options.measure_s

            async def worker() -> None:
                nonlocal done
                while done < options.count_pipelined and time.monotonic() < deadline:
                    done += 1
                    await one()

            start = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(options.window)))
            return done / (time.monotonic() - start)

        rates["plain"] = await timed(lambda: producer.send(Message(topics[0], body)))
        rates["tx"] = await timed(
            lambda: producer.send_message_in_transaction(Message(topics[1], body))
        )
    finally:
        await producer.shutdown()
    return {
        "rate": rates["tx"],
        "plain_rate": rates["plain"],
        "ratio": rates["tx"] / rates["plain"],
    }


RSS_SAMPLE_S = 0.05  # how often the RSS case samples the broker's resident set
RSS_SETTLE_S = 1.5  # three ASYNC_FLUSH intervals: the flush releases what it has synced
RSS_WRITE_S_MAX = 300.0
RSS_CONSUME_S_MAX = 600.0


async def broker_rss(address: str, pid: int, options: Options) -> dict[str, Any]:
    """RSS of the `tidemq dev` process while a backlog of `backlog_bytes` is written, then while
    one consumer catches up through all of it.

    Bodies of 64 KiB in batches keep the backlog's write time short; RssFile counts the store's
    mapped pages the broker has resident, RssAnon the Python heap. Figures: `before`, `after`
    (right after the last send), `settled` (after RSS_SETTLE_S, once flushes ran), the peaks
    (VmRSS sampled every RSS_SAMPLE_S) during the write and during the catch-up read, and
    `consumed` (settled after the read).
    """
    from sidebyside.servers import rss_bytes
    from tidemq import Message

    peak = {"VmRSS": 0}

    async def sample() -> None:
        while True:
            peak["VmRSS"] = max(peak["VmRSS"], rss_bytes(pid).get("VmRSS", 0))
            await asyncio.sleep(RSS_SAMPLE_S)

    def snapshot(name: str) -> dict[str, int]:
        return {f"{name}_{k}": v for k, v in rss_bytes(pid).items()}

    driver = DRIVERS["tidemq"](address, options)
    await driver.connect()
    sampler = asyncio.create_task(sample())
    try:
        await driver.reset()
        figures = snapshot("before")
        body = payload(64 * 1024)
        topic = driver.state()["topic"]
        producer: Any = getattr(driver, "producer")  # noqa: B009 (TideDriver only)
        count = options.backlog_bytes // len(body)
        written = 0
        peak["VmRSS"] = 0
        start = time.monotonic()

        async def worker() -> None:
            nonlocal written
            while written < count and time.monotonic() - start < RSS_WRITE_S_MAX:
                written += 16
                await producer.send_batch([Message(topic, body) for _ in range(16)])

        await asyncio.gather(*(worker() for _ in range(4)))
        elapsed = time.monotonic() - start
        figures |= snapshot("after")
        figures["write_peak_VmRSS"] = peak["VmRSS"]
        await asyncio.sleep(RSS_SETTLE_S)
        figures |= snapshot("settled")
        peak["VmRSS"] = 0
        start = time.monotonic()
        got = await driver.consume(written, start + RSS_CONSUME_S_MAX)
        consume_s = time.monotonic() - start
        figures["consume_peak_VmRSS"] = peak["VmRSS"]
        await asyncio.sleep(RSS_SETTLE_S)
        figures |= snapshot("consumed")
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await driver.close()
    return {
        "backlog_mib": written * len(body) / 2**20,
        "write_mib_s": written * len(body) / elapsed / 2**20,
        "consumed_mib": got * len(body) / 2**20,
        "consume_mib_s": got * len(body) / consume_s / 2**20,
        **figures,
    }


def describe_rss(m: dict[str, Any]) -> str:
    """One sentence of the RSS case's figures (cases.broker_rss), in MiB."""

    def three(name: str) -> str:
        return " / ".join(
            f"{m.get(f'{name}_{k}', 0) / 2**20:.0f}" for k in ("VmRSS", "RssAnon", "RssFile")
        )

    return (
        f"Broker RSS (`tidemq dev`, VmRSS / RssAnon / RssFile MiB): before {three('before')}; "
        f"a {m['backlog_mib']:.0f} MiB backlog written at {m['write_mib_s']:.0f} MiB/s: "
        f"peak VmRSS {m.get('write_peak_VmRSS', 0) / 2**20:.0f}, right after "
        f"{three('after')}, {RSS_SETTLE_S:g} s later {three('settled')}; one consumer "
        f"reading {m.get('consumed_mib', 0):.0f} MiB of it from the start at "
        f"{m.get('consume_mib_s', 0):.0f} MiB/s: peak VmRSS "
        f"{m.get('consume_peak_VmRSS', 0) / 2**20:.0f}, then {three('consumed')}."
    )


def cpp_produce(
    address: str, topic: str, mode: str, options: Options, home: Path
) -> dict[str, Any]:
    """The official C++ client in a subprocess (sync: one at a time; async: `window` in flight)."""
    script = Path(__file__).with_name("cpp_producer.py")
    argv = [sys.executable, str(script), "--namesrv", address, "--topic", topic, "--mode", mode]
    argv += ["--count", str(options.count_pipelined), "--seconds", str(options.measure_s)]
    argv += ["--window", str(options.window)]
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=CPP_TIMEOUT_S,
        env={**os.environ, "HOME": str(home)},
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"C++ producer failed ({done.returncode}): {done.stderr[-500:]}")
    result = dict(json.loads(lines[-1]))
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


async def measured(case: Any, *args: Any) -> dict[str, Any]:
    """Runs one case with the foreign CPU recorded; failures become {"error": ...}."""
    start = cpu_snapshot()
    try:
        result: dict[str, Any] = await case(*args)
    except Exception as exc:  # One failed run must not end the suite; the table shows it.
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    result["cpu_foreign"] = cpu_foreign_cores(start, cpu_snapshot())
    return result
