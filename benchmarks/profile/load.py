"""A load generator for profiling: one shape of produce traffic against a running TideMQ.

Usage: python benchmarks/profile/load.py NAMESRV {sync,pipelined,batched,transactional} COUNT
       [--profile OUT]

"pipelined" keeps `--window` send_nowait futures in flight (awaiting the oldest when full).
"transactional" keeps `--window` send_message_in_transaction in flight with a listener that
commits at once: half send, local transaction, END_TRANSACTION (oneway) per message.

With --profile the client side runs under cProfile and writes OUT (for the client's own costs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import time

from tidemq.client.message import Message, SendResult
from tidemq.client.producer import Producer
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.remoting.loop import install_uvloop

BODY_SIZE = 1024


class CommitListener:
    """The transactional shape's listener: every local transaction commits, checks too."""

    def execute_local_transaction(self, message: object, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def run(namesrv: str, shape: str, count: int, window: int, batch: int) -> float:
    body = os.urandom(BODY_SIZE)
    topic = f"Profile{shape.capitalize()}"
    producer = (
        TransactionProducer("profile_producer", namesrv, listener=CommitListener())
        if shape == "transactional"
        else Producer("profile_producer", namesrv)
    )
    await producer.start()
    try:
        await producer.send(Message(topic, body))
        start = time.perf_counter()
        cpu_start = time.process_time()
        if shape == "sync":
            for _ in range(count):
                await producer.send(Message(topic, body))
        elif shape == "pipelined":
            # send_nowait with a window of `window` futures, awaiting the oldest when it is full
            # (RocketMQ's async send with a window): no coroutine or task per message.
            in_flight: collections.deque[asyncio.Future[SendResult]] = collections.deque()
            for _ in range(count):
                if len(in_flight) >= window:
                    await in_flight.popleft()
                in_flight.append(producer.send_nowait(Message(topic, body)))
            for future in in_flight:
                await future
        elif shape == "transactional":
            # `window` workers, each awaiting one transaction after another (the side-by-side
            # suite's shape): no task per transaction.
            assert isinstance(producer, TransactionProducer)
            transactional = producer
            left = count

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await transactional.send_message_in_transaction(Message(topic, body))

            await asyncio.gather(*(worker() for _ in range(window)))
        else:
            semaphore = asyncio.Semaphore(8)

            async def many() -> None:
                async with semaphore:
                    await producer.send_batch([Message(topic, body) for _ in range(batch)])

            await asyncio.gather(*(many() for _ in range(count // batch)))
            count = count // batch * batch
        rate = count / (time.perf_counter() - start)
        cpu_us = (time.process_time() - cpu_start) / count * 1e6
        print(f"client CPU {cpu_us:.1f} µs/msg")
        return rate
    finally:
        await producer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("namesrv")
    parser.add_argument("shape", choices=["sync", "pipelined", "batched", "transactional"])
    parser.add_argument("count", type=int)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--profile")
    args = parser.parse_args()
    install_uvloop()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    rate = asyncio.run(run(args.namesrv, args.shape, args.count, args.window, args.batch))
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(f"{args.shape} {args.count}: {rate:,.0f} msg/s")


if __name__ == "__main__":
    main()
