"""Server capacity: how many 1 KiB messages/s the broker acknowledges when the client is cheap.

A Python client costs about as much CPU per message as the broker, so on a small machine it
would measure itself. The load generator here does no per-message work: each connection holds
`window` pre-encoded SEND_MESSAGE_V2 frames (the same bytes our Producer sends, opaques 0..w-1,
queues round-robin) and writes one back for every response it reads, counting responses by their
length prefix alone. Every 1,000th response and the first are decoded and must be SUCCESS.
`processes` such generators share `connections` connections, like redis-benchmark's `-c`.

The peer figure is `redis-benchmark` itself (C, one thread, epoll): XADD with 1 KiB fields,
50 clients, no pipelining, against a Redis with appendfsync always.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import subprocess
import time
from typing import Any

from sidebyside.common import Options

CHECK_EVERY = 1000  # responses between two decoded ones
REDIS_BENCHMARK_COUNT = 50_000
REDIS_BENCHMARK_TIMEOUT_S = 120.0


def _frames(topic: str, window: int, base_opaque: int) -> list[bytes]:
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.frame import RemotingCommand, encode
    from tidemq.protocol.headers_send import SendMessageRequestHeader

    body = bytes(1024)
    frames = []
    for index in range(window):
        header = SendMessageRequestHeader(
            producer_group="bench_capacity",
            topic=topic,
            queue_id=index % 4,
            born_timestamp=int(time.time() * 1000),
        )
        command = RemotingCommand(
            code=int(RequestCode.SEND_MESSAGE_V2),
            opaque=base_opaque + index,
            ext_fields=header.to_fields(v2=True),
            body=body,
        )
        frames.append(encode(command))
    return frames


class _Generator(asyncio.Protocol):
    def __init__(self, frames: list[bytes], counters: dict[str, int]) -> None:
        self.frames = frames
        self.counters = counters
        self.buffer = bytearray()
        self.next_frame = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # uvloop's transport is no asyncio.Transport subclass
        transport.write(b"".join(self.frames))

    def data_received(self, data: bytes) -> None:
        from tidemq.protocol.frame import decode_frame

        buffer = self.buffer
        buffer += data
        replies = 0
        position = 0
        while len(buffer) - position >= 4:
            length = int.from_bytes(buffer[position : position + 4], "big")
            if len(buffer) - position - 4 < length:
                break
            if self.counters["ok"] % CHECK_EVERY == 0:
                reply = decode_frame(bytes(buffer[position + 4 : position + 4 + length]))
                if reply.code != 0:
                    self.counters["errors"] += 1
            position += 4 + length
            replies += 1
            self.counters["ok"] += 1
        del buffer[:position]
        if replies and self.transport is not None and self.counters["running"]:
            frames = self.frames
            out = []
            for _ in range(replies):
                out.append(frames[self.next_frame])
                self.next_frame = (self.next_frame + 1) % len(frames)
            self.transport.write(b"".join(out))


def _protocol_factory(frames: list[bytes], counters: dict[str, int]) -> Any:
    return lambda: _Generator(frames, counters)


def _generator_process(
    host: str,
    port: int,
    topic: str,
    connections: int,
    window: int,
    start_at: float,
    seconds: float,
    results: Any,
) -> None:
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()

    async def main() -> tuple[int, int]:
        counters = {"ok": 0, "errors": 0, "running": 1}
        loop = asyncio.get_running_loop()
        transports = []
        for number in range(connections):
            frames = _frames(topic, window, number * window)
            transport, _ = await loop.create_connection(
                _protocol_factory(frames, counters),
                host,
                port,
            )
            transports.append(transport)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        first = counters["ok"]
        await asyncio.sleep(seconds)
        last = counters["ok"]
        counters["running"] = 0
        for transport in transports:
            transport.close()
        return last - first, counters["errors"]

    results.put(asyncio.run(main()))


def tidemq_capacity(
    broker_address: str, topic: str, options: Options, window: int
) -> dict[str, Any]:
    """Messages/s acknowledged with `options.capacity_connections` connections x `window`."""
    host, port = broker_address.split(":")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = options.capacity_processes
    per_process = options.capacity_connections // processes
    start_at = time.time() + 3.0  # all generators connected and warm before the window opens
    workers = [
        context.Process(
            target=_generator_process,
            args=(
                host,
                int(port),
                topic,
                per_process,
                window,
                start_at,
                options.capacity_s,
                results,
            ),
            daemon=True,
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        counts = [results.get(timeout=options.capacity_s + 60) for _ in workers]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    acked = sum(count for count, _ in counts)
    errors = sum(errors for _, errors in counts)
    if errors:
        raise RuntimeError(f"{errors} sampled responses were not SUCCESS")
    return {"rate": acked / options.capacity_s, "in_flight": per_process * processes * window}


def redis_benchmark_xadd(address: str, fsync: str, clients: int) -> dict[str, Any]:
    """redis-benchmark XADD with a 1 KiB field, `clients` clients, no pipelining."""
    import redis

    host, port = address.split(":")
    connection = redis.Redis(host=host, port=int(port))
    connection.config_set("appendfsync", fsync)
    connection.delete("cbench")
    argv = ["redis-benchmark", "-h", host, "-p", port, "-n", str(REDIS_BENCHMARK_COUNT)]
    argv += ["-c", str(clients), "-P", "1", "--csv", "XADD", "cbench", "*", "d", "x" * 1024]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=REDIS_BENCHMARK_TIMEOUT_S, check=True
    )
    connection.delete("cbench")
    connection.close()
    rows = [line for line in done.stdout.splitlines() if re.match(r'^"XADD', line)]
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no XADD row: {done.stdout[-300:]}")
    fields = [field.strip('"') for field in rows[-1].split(",")]
    return {"rate": float(fields[1]), "p50_ms": float(fields[5]) if len(fields) > 5 else None}
