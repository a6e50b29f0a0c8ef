"""Transactional sends against plain sends from the same producer, and how fast the check-back
settles a transaction whose END_TRANSACTION never came.

The broker runs as a separate `tidemq dev` process with transactionCheckInterval=100 ms and
transactionTimeOut=500 ms (so a missed END is checked 500-600 ms after the half message), once per
flush mode (`--flush`, both by default: ASYNC_FLUSH, then SYNC_FLUSH with group commit).
Cases, one TransactionProducer for all of them (same connection, same route, 1 KiB bodies):
  plain sync       send(), one at a time
  tx sync          send_message_in_transaction(): half send (awaited) -> local transaction (a
                   no-op returning COMMIT_MESSAGE) -> END_TRANSACTION (oneway), one at a time
  plain window     send() with `window` in flight (256, as the side-by-side suite)
  tx window        send_message_in_transaction() with `window` in flight
Each case also reports the broker process's CPU time per message (user + system, from /proc),
which other processes on shared cores disturb much less than msg/s.
Every committed message is then pulled back to check it became visible exactly once.
  missed END       `--missed` half messages (send_half only, 37 ms apart so they sample every
                   phase of the check interval); the check listener answers COMMIT; a pull
                   consumer long-polling the real topic stamps when each becomes visible.
                   Reported: median and p99 of (visible - half send acknowledged).

Usage: python benchmarks/bench_transactions.py [--quick] [--flush ASYNC_FLUSH|SYNC_FLUSH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidebyside import servers

from tidemq import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    PullConsumer,
    QueueError,
    TransactionProducer,
)
from tidemq.broker.config import FLUSH_DISK_TYPES
from tidemq.remoting.loop import install_uvloop

BODY_SIZE = 1024
CHECK_INTERVAL_MS = 100
TRANSACTION_TIMEOUT_MS = 500
MISSED_SPACING_S = 0.037


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0.0 where /proc is not available)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NoOpListener:
    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checks += 1
        return LocalTransactionState.COMMIT_MESSAGE


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float
    broker_cpu_us: float  # broker CPU per message


async def timed(count: int, window: int, one: Callable[[], Awaitable[Any]], pid: int) -> Rate:
    """Messages per second of `count` calls of `one` with `window` in flight, and the broker's
    CPU per message meanwhile."""
    semaphore = asyncio.Semaphore(window)

    async def guarded() -> None:
        async with semaphore:
            await one()

    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    if window == 1:
        for _ in range(count):
            await one()
    else:
        await asyncio.gather(*(guarded() for _ in range(count)))
    elapsed = time.perf_counter() - start
    return Rate(count / elapsed, (cpu_seconds(pid) - cpu) / count * 1e6)


async def visible(namesrv: str, topic: str) -> list[MessageExt]:
    consumer = PullConsumer("bench_tx_check", namesrv)
    await consumer.start()
    try:
        found: list[MessageExt] = []
        for queue in await consumer.fetch_subscribe_message_queues(topic):
            offset = 0
            while True:
                result = await consumer.pull(queue, "*", offset, 32)
                if not result.messages:
                    break
                found += result.messages
                offset = result.next_begin_offset
        return found
    finally:
        await consumer.shutdown()


async def missed_end(
    producer: TransactionProducer, namesrv: str, count: int, body: bytes
) -> list[float]:
    """Seconds from each half send's acknowledgement to its message being pullable."""
    topic = "BenchTxMissed"
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    all_seen = asyncio.Event()
    consumer = PullConsumer("bench_tx_missed", namesrv)
    await consumer.start()
    queues = await consumer.fetch_subscribe_message_queues(topic)

    async def watch(queue: Any) -> None:
        offset = 0
        while len(seen) < count:
            result = await consumer.pull_block_if_not_found(queue, "*", offset, 32)
            now = time.perf_counter()
            for message in result.messages:
                if message.msg_id in sent:
                    seen.setdefault(message.msg_id, now)
            if len(seen) == count:
                all_seen.set()
            offset = result.next_begin_offset

    watchers = [asyncio.create_task(watch(q)) for q in queues]
    try:
        for _ in range(count):
            half = await producer.send_half(Message(topic, body))
            assert half.run_local, half
            sent[half.msg_id] = time.perf_counter()  # END_TRANSACTION is never sent
            await asyncio.sleep(MISSED_SPACING_S)
        async with asyncio.timeout(30):
            await all_seen.wait()
    finally:
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await consumer.shutdown()
    return sorted(seen[k] - sent[k] for k in sent)


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


async def run(args: argparse.Namespace, flush: str) -> None:
    body = os.urandom(BODY_SIZE)
    scale = 0.2 if args.quick else 1.0
    n_sync, n_window, n_missed = int(3000 * scale), int(20_000 * scale), args.missed
    listener = NoOpListener()
    rates: dict[str, Rate] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tidemq-bench-tx-") as tmp,
        servers.tidemq(
            Path(tmp),
            flush,
            f"transactionCheckInterval={CHECK_INTERVAL_MS}",
            f"transactionTimeOut={TRANSACTION_TIMEOUT_MS}",
        ) as server,
    ):
        namesrv = server.address
        async with Admin(namesrv) as admin:
            for topic in ("BenchPlain", "BenchTx", "BenchTxMissed"):
                for _ in range(50):  # until the broker has registered with the name server
                    with contextlib.suppress(QueueError):
                        await admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4)
                        break
                    await asyncio.sleep(0.1)
        producer = TransactionProducer("bench_tx_producer", namesrv, listener=listener)
        await producer.start()
        try:
            for topic in ("BenchPlain", "BenchTx"):
                await producer.send(Message(topic, b"warm-up"))  # route lookup, topic creation

            def plain() -> Awaitable[Any]:
                return producer.send(Message("BenchPlain", body))

            def transactional() -> Awaitable[Any]:
                return producer.send_message_in_transaction(Message("BenchTx", body))

            pid = server.pid
            rates["plain sync"] = await timed(n_sync, 1, plain, pid)
            rates["tx sync"] = await timed(n_sync, 1, transactional, pid)
            rates["plain window"] = await timed(n_window, args.window, plain, pid)
            rates["tx window"] = await timed(n_window, args.window, transactional, pid)
            committed = await visible(namesrv, "BenchTx")
            delays = await missed_end(producer, namesrv, n_missed, body)
        finally:
            await producer.shutdown()
    real = [m for m in committed if m.body == body]
    if len(real) != n_sync + n_window or len({m.msg_id for m in real}) != len(real):
        raise RuntimeError(f"{len(real)} committed messages visible, {n_sync + n_window} sent")
    print(
        f"TideMQ transactions, {flush}, 1 KiB bodies, window={args.window}, "
        f"transactionCheckInterval={CHECK_INTERVAL_MS} ms, "
        f"transactionTimeOut={TRANSACTION_TIMEOUT_MS} ms, python {sys.version.split()[0]}"
    )
    for shape, count in (("sync", n_sync), ("window", n_window)):
        plain_rate, tx_rate = rates[f"plain {shape}"], rates[f"tx {shape}"]
        print(
            f"  plain {shape:<7} {plain_rate.per_s:>9.0f} msg/s  ({count})  "
            f"broker CPU {plain_rate.broker_cpu_us:.0f} µs/msg"
        )
        print(
            f"  tx    {shape:<7} {tx_rate.per_s:>9.0f} msg/s  ({count})  "
            f"broker CPU {tx_rate.broker_cpu_us:.0f} µs/msg  "
            f"ratio to plain {tx_rate.per_s / plain_rate.per_s:.2f}"
        )
    print(
        f"  missed END -> visible ({n_missed}): median {statistics.median(delays) * 1000:.0f} ms, "
        f"p99 {percentile(delays, 0.99) * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms, "
        f"checks answered {listener.checks}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--missed", type=int, default=100, help="transactions without END")
    parser.add_argument("--quick", action="store_true", help="a fifth of the counts")
    parser.add_argument(
        "--flush", choices=FLUSH_DISK_TYPES, action="append", help="flush mode (default: both)"
    )
    args = parser.parse_args()
    install_uvloop()
    for flush in args.flush or FLUSH_DISK_TYPES:
        asyncio.run(run(args, flush))


if __name__ == "__main__":
    main()
