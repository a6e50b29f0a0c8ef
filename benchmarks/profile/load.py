"""A load generator for profiling: one shape of produce traffic against a running TideMQ.

Usage: python benchmarks/profile/load.py NAMESRV {sync,pipelined,batched} COUNT [--profile OUT]

With --profile the client side runs under cProfile and writes OUT (for the client's own costs).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import time

from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.remoting.loop import install_uvloop

BODY_SIZE = 1024


async def run(namesrv: str, shape: str, count: int, window: int, batch: int) -> float:
    body = os.urandom(BODY_SIZE)
    topic = f"Profile{shape.capitalize()}"
    producer = Producer("profile_producer", namesrv)
    await producer.start()
    try:
        await producer.send(Message(topic, body))
        start = time.perf_counter()
        cpu_start = time.process_time()
        if shape == "sync":
            for _ in range(count):
                await producer.send(Message(topic, body))
        elif shape == "pipelined":
            semaphore = asyncio.Semaphore(window)

            async def one() -> None:
                async with semaphore:
                    await producer.send(Message(topic, body))

            tasks = []
            for _ in range(count):
                await semaphore.acquire()
                semaphore.release()
                tasks.append(asyncio.create_task(one()))
            await asyncio.gather(*tasks)
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
    parser.add_argument("shape", choices=["sync", "pipelined", "batched"])
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
