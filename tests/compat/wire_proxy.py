"""A logging TCP proxy for remoting frames: the evidence behind a compat failure report.

Put it in front of a name server and, optionally, a broker:

    python tests/compat/wire_proxy.py --listen 19876 --target 127.0.0.1:9876 \\
        --listen 20911 --target 127.0.0.1:10911 \\
        --rewrite 127.0.0.1:10911=127.0.0.1:20911 --log /tmp/frames.jsonl

then point the client at 127.0.0.1:19876. Each frame, in both directions, becomes one JSON line
(connection, direction, code, flag, opaque, extFields, remark, body length and a body preview).
`--rewrite OLD=NEW` replaces OLD in the bodies of frames coming back from a server: route answers
carry the broker address, so rewriting it routes the client's broker traffic through the second
listener too. Only the body changes; the length prefix is adjusted and the header bytes are
forwarded untouched. (Addresses inside pulled message records are binary and are not rewritten.)

Frames are split with the project's own codec (protocol/frame.py) so a malformed frame shows up
as a decode error line instead of killing the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import struct
from pathlib import Path
from typing import IO

from tidemq.errors import ProtocolError
from tidemq.protocol.frame import decode_frame

BODY_PREVIEW_BYTES = 300  # Enough to see a route or a heartbeat body, short enough to read.
READ_CHUNK_BYTES = 65536

_LENGTH = struct.Struct(">I")
_TYPE_AND_HEADER_LENGTH = struct.Struct(">I")


class FrameLog:
    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def frame(self, connection: int, direction: str, frame: bytes) -> None:
        record: dict[str, object] = {"conn": connection, "dir": direction}
        try:
            command = decode_frame(frame)
        except ProtocolError as exc:
            record.update(error=str(exc), raw=frame[:BODY_PREVIEW_BYTES].hex())
        else:
            record.update(
                code=command.code,
                flag=command.flag,
                opaque=command.opaque,
                language=command.language,
                ser=int(command.serialize_type),
                ext=command.ext_fields,
                remark=command.remark,
                body_len=len(command.body),
                body=command.body[:BODY_PREVIEW_BYTES].decode("latin-1"),
            )
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def note(self, connection: int, text: str) -> None:
        self._out.write(json.dumps({"conn": connection, "note": text}) + "\n")
        self._out.flush()


def rewrite_body(frame: bytes, rewrites: list[tuple[bytes, bytes]]) -> bytes:
    """The frame (without length prefix) with OLD replaced by NEW in its body only."""
    (type_and_length,) = _TYPE_AND_HEADER_LENGTH.unpack_from(frame, 0)
    body_start = 4 + (type_and_length & 0xFFFFFF)
    body = frame[body_start:]
    for old, new in rewrites:
        body = body.replace(old, new)
    return frame[:body_start] + body


async def pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    log: FrameLog,
    connection: int,
    direction: str,
    rewrites: list[tuple[bytes, bytes]],
) -> None:
    try:
        while True:
            prefix = await reader.readexactly(4)
            (total,) = _LENGTH.unpack(prefix)
            frame = await reader.readexactly(total)
            log.frame(connection, direction, frame)
            if rewrites:
                frame = rewrite_body(frame, rewrites)
            writer.write(_LENGTH.pack(len(frame)) + frame)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        log.note(connection, f"{direction} closed: {exc!r}")
    finally:
        writer.close()


async def serve(listen: int, target: str, log: FrameLog, rewrites: list[tuple[bytes, bytes]],
                ids: itertools.count[int]) -> asyncio.Server:  # fmt: skip
    host, port = target.rsplit(":", 1)

    async def on_client(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        connection = next(ids)
        log.note(connection, f"client {client_writer.get_extra_info('peername')} -> {target}")
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(
            pump(client_reader, server_writer, log, connection, "c>s", []),
            pump(server_reader, client_writer, log, connection, "s>c", rewrites),
        )

    return await asyncio.start_server(on_client, "127.0.0.1", listen)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, action="append", required=True)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--rewrite", action="append", default=[], help="OLD=NEW in s>c bodies")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    if len(args.listen) != len(args.target):
        parser.error("give one --target per --listen")
    rewrites = [
        (old, new) for old, _, new in (item.encode().partition(b"=") for item in args.rewrite)
    ]
    ids = itertools.count(1)
    with args.log.open("a") as out:
        log = FrameLog(out)
        servers = [
            await serve(listen, target, log, rewrites, ids)
            for listen, target in zip(args.listen, args.target, strict=True)
        ]
        for server in servers:
            log.note(0, f"listening on {server.sockets[0].getsockname()}")
        await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    asyncio.run(main())
