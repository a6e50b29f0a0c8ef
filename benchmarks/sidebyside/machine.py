"""The machine's limits, measured in the same run as the brokers so ratios hold on any machine.

seq_write_mib_s         1 MiB os.write appends, no fsync (page cache)
seq_write_sync_mib_s    the same, including one fdatasync at the end
fdatasync_4k_per_s      4 KiB append + fdatasync, one after the other
fdatasync_64k_per_s     64 KiB append + fdatasync: the group-commit ceiling is this x 64
                        1 KiB messages per second (`group_commit_msgs_s`)
loopback_pingpong_s     Python asyncio, 1 KiB frame out, 8-byte ack back, one in flight
loopback_stream_mib_s   Python asyncio, 256 KiB writes, the server discards
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def _sequential(path: Path, total_bytes: int, sync: bool) -> float:
    block = os.urandom(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(total_bytes // MIB):
            os.write(fd, block)
        if sync:
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return total_bytes / MIB / elapsed


def _fdatasync_rate(path: Path, block_size: int, seconds: float) -> float:
    block = os.urandom(block_size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return count / elapsed


async def _loopback(seconds: float) -> tuple[float, float]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            mode = await reader.readexactly(1)
            if mode == b"s":
                while await reader.read(MIB):
                    pass
                return
            while True:
                length = int.from_bytes(await reader.readexactly(4), "big")
                await reader.readexactly(length)
                writer.write(b"\0" * 8)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"p")
        frame = (1024).to_bytes(4, "big") + os.urandom(1024)
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            writer.write(frame)
            await reader.readexactly(8)
            count += 1
        ping_pong = count / (time.perf_counter() - start)
        writer.close()
        await writer.wait_closed()

        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"s")
        chunk = os.urandom(256 * 1024)
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
        stream = sent / MIB / (time.perf_counter() - start)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)  # let the server side see EOF before it is closed
    finally:
        server.close()
        await server.wait_closed()
    return ping_pong, stream


def measure(directory: Path, quick: bool) -> dict[str, Any]:
    """One run of every limit; files in `directory` (the same file system as the brokers' data)."""
    total = (32 if quick else 512) * MIB
    seconds = 0.3 if quick else 1.5
    path = directory / "machine-limit.bin"
    fsync_64k = _fdatasync_rate(path, 64 * 1024, seconds)
    ping_pong, stream = asyncio.run(_loopback(seconds))
    return {
        "seq_write_mib_s": _sequential(path, total, sync=False),
        "seq_write_sync_mib_s": _sequential(path, total, sync=True),
        "fdatasync_4k_per_s": _fdatasync_rate(path, 4096, seconds),
        "fdatasync_64k_per_s": fsync_64k,
        "group_commit_msgs_s": fsync_64k * 64,
        "loopback_pingpong_s": ping_pong,
        "loopback_stream_mib_s": stream,
    }
