"""Produce and consume throughput of TideMQ with 1 KiB bodies, against references from this run.

The broker runs as a separate `tidemq dev` process (as users run it); this process is the client.
Cases:
  sync       one send at a time, each awaited (durable ack of the configured flush mode)
  pipelined  `window` sends in flight on one connection
  batched    SEND_BATCH_MESSAGE with `batch` messages per request
  consume    pull every message back (32 per pull) and commit offsets

References measured in the same run, so ratios hold on any machine:
  ping-pong  a plain asyncio client/server exchanging 1 KiB length-prefixed frames, one in flight:
             the ceiling for `sync` (the same loopback, loop and Python, no broker work)
  stream     the same server with `window` frames in flight: the ceiling for `pipelined`
  disk       sequential 1 KiB appends to a file in the data directory, no fsync (page cache),
             the ceiling for bytes the broker can take in

Usage: python benchmarks/bench_produce_consume.py [--flush ASYNC_FLUSH|SYNC_FLUSH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.remoting.loop import install_uvloop

BODY_SIZE = 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def dev_server(data_dir: Path, flush: str) -> Iterator[str]:
    namesrv_port, broker_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidemq.cli.main",
            "--log-level",
            "WARNING",
            "dev",
            "--namesrv-port",
            str(namesrv_port),
            "--broker-port",
            str(broker_port),
            "--data-dir",
            str(data_dir),
            "--set",
            f"flushDiskType={flush}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    try:
        for port in (namesrv_port, broker_port):
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), 0.2),
                ):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tidemq dev did not start: {process.stderr.read()!r}")  # type: ignore[union-attr]
                time.sleep(0.05)
        yield f"127.0.0.1:{namesrv_port}"
    finally:
        process.terminate()
        process.wait(20)


# -- references -----------------------------------------------------------------------------


async def _echo_server() -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                payload = await reader.readexactly(length)
                writer.write(struct.pack(">I", 8) + payload[:8])  # a small ack, like a send result
                await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def reference_loopback(count: int, window: int) -> tuple[float, float]:
    """(ping-pong msgs/s, streamed msgs/s) for 1 KiB frames acknowledged one by one."""
    server, port = await _echo_server()
    frame = struct.pack(">I", BODY_SIZE) + os.urandom(BODY_SIZE)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    for _ in range(count):
        writer.write(frame)
        await reader.readexactly(12)
    ping_pong = count / (time.perf_counter() - start)

    async def acks(total: int) -> None:
        await reader.readexactly(12 * total)

    streamed = count * 10
    start = time.perf_counter()
    pending = asyncio.create_task(acks(streamed))
    for index in range(streamed):
        writer.write(frame)
        if index % window == 0:
            await writer.drain()
    await pending
    stream = streamed / (time.perf_counter() - start)
    writer.close()
    server.close()
    await server.wait_closed()
    return ping_pong, stream


def reference_disk(path: Path, count: int) -> float:
    record = os.urandom(BODY_SIZE + 100)  # body plus a stored record's header
    start = time.perf_counter()
    with path.open("wb", buffering=0) as file:
        for _ in range(count):
            file.write(record)
    rate = count / (time.perf_counter() - start)
    path.unlink()
    return rate


# -- TideMQ cases -----------------------------------------------------------------------------


async def case_sync(producer: Producer, topic: str, count: int, body: bytes) -> float:
    start = time.perf_counter()
    for _ in range(count):
        await producer.send(Message(topic, body))
    return count / (time.perf_counter() - start)


async def case_pipelined(
    producer: Producer, topic: str, count: int, body: bytes, window: int
) -> float:
    semaphore = asyncio.Semaphore(window)

    async def one() -> None:
        async with semaphore:
            await producer.send(Message(topic, body))

    start = time.perf_counter()
    tasks = []
    for _ in range(count):
        await semaphore.acquire()
        semaphore.release()
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return count / (time.perf_counter() - start)


async def case_batched(
    producer: Producer, topic: str, count: int, body: bytes, batch: int
) -> float:
    window = 8
    semaphore = asyncio.Semaphore(window)

    async def one() -> None:
        async with semaphore:
            await producer.send_batch([Message(topic, body) for _ in range(batch)])

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count // batch)))
    return (count // batch) * batch / (time.perf_counter() - start)


async def case_consume(namesrv: str, topic: str, expected: int) -> float:
    consumer = PullConsumer("bench_consumer", namesrv)
    await consumer.start()
    try:
        queues = await consumer.fetch_subscribe_message_queues(topic)
        received = 0
        start = time.perf_counter()
        for queue in queues:
            offset = 0
            while True:
                result = await consumer.pull(queue, "*", offset, 32)
                if not result.messages:
                    break
                received += len(result.messages)
                offset = result.next_begin_offset
            await consumer.update_consumer_offset(queue, offset)
        elapsed = time.perf_counter() - start
    finally:
        await consumer.shutdown()
    if received != expected:
        raise RuntimeError(f"consumed {received} messages, expected {expected}")
    return received / elapsed


def line(name: str, rate: float, reference: float | None, reference_name: str) -> str:
    mb = rate * BODY_SIZE / 1e6
    ratio = f"{rate / reference:6.2f}x {reference_name}" if reference else ""
    return f"{name:<28} {rate:>10,.0f} msg/s {mb:>8.1f} MB/s   {ratio}"


async def run(args: argparse.Namespace) -> None:
    body = os.urandom(BODY_SIZE)
    scale = 0.2 if args.quick else 1.0
    n_sync, n_pipe, n_batch = int(4000 * scale), int(40_000 * scale), int(100_000 * scale)
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-") as tmp:
        ping_pong, stream = await reference_loopback(n_sync, args.window)
        disk = reference_disk(Path(tmp) / "disk-reference", n_batch)
        with dev_server(Path(tmp) / "data", args.flush) as namesrv:
            producer = Producer("bench_producer", namesrv)
            await producer.start()
            try:
                await producer.send(Message("BenchSync", body))  # route lookup, topic creation
                await producer.send(Message("BenchPipe", body))
                await producer.send(Message("BenchBatch", body))
                sync = await case_sync(producer, "BenchSync", n_sync, body)
                pipelined = await case_pipelined(producer, "BenchPipe", n_pipe, body, args.window)
                batched = await case_batched(producer, "BenchBatch", n_batch, body, args.batch)
            finally:
                await producer.shutdown()
            consume = await case_consume(namesrv, "BenchPipe", n_pipe + 1)
    print(
        f"TideMQ produce/consume, 1 KiB bodies, flushDiskType={args.flush}, "
        f"window={args.window}, batch={args.batch}, python {sys.version.split()[0]}"
    )
    print(line("reference ping-pong", ping_pong, None, ""))
    print(line("reference stream", stream, None, ""))
    print(line("reference disk append", disk, None, ""))
    print(line(f"sync ({n_sync})", sync, ping_pong, "ping-pong"))
    print(line(f"pipelined ({n_pipe})", pipelined, stream, "stream"))
    print(line(f"batched ({n_batch})", batched, disk, "disk"))
    print(line(f"consume ({n_pipe + 1})", consume, stream, "stream"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a fifth of the counts")
    args = parser.parse_args()
    install_uvloop()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
