"""CPU µs per 1 KiB message inside the broker's send handler, without sockets or a client.

A BrokerApp on a temporary directory (ASYNC_FLUSH); the SEND handler is called directly with
prebuilt requests: single SEND_MESSAGE_V2 one per loop turn ("single", a lone send), 32 per loop
turn ("turn32": pipelined sends the coalescer stores with one put), and SEND_BATCH_MESSAGE of 64
(the client's own properties: UNIQ_KEY and WAIT). Measures the event-loop thread's CPU time,
which other processes on the shared cores disturb much less than a msg/s figure. Frame decode
and socket I/O are not included.

Usage: python benchmarks/profile/handler.py [COUNT] [--only single|turn32|batch64] [--profile OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import tempfile
import time
from typing import Any

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_send import SendMessageRequestHeader
from tidemq.protocol.message import BatchItem, encode_batch, encode_properties

BATCH = 64
TURN = 32


class _Peer:
    """The connection a handler sees: answers deferred by the coalescer land here (a response
    must be a success; a pre-encoded frame is dropped unread)."""

    peer = ("127.0.0.1", 40000)

    def defer(self, request: RemotingCommand) -> None:
        pass

    def respond(self, request: RemotingCommand, response: RemotingCommand) -> None:
        assert response.code == 0, response.remark

    def respond_frame(self, request: RemotingCommand, frame: bytes) -> None:
        pass


def _request(code: int, body: bytes, properties: str | None, batch: bool) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="ProfileHandler",
        default_topic="TBW102",
        default_topic_queue_nums=8,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties=properties,
        batch=batch,
    )
    return RemotingCommand(code=code, ext_fields=header.to_fields(v2=True), body=body)


def _props(n: int) -> str:
    return encode_properties({"UNIQ_KEY": f"7F000001000118B4AAC2{n:012X}", "WAIT": "true"})


async def run(count: int, profiler: cProfile.Profile | None, only: str | None) -> None:
    body = os.urandom(1024)
    with tempfile.TemporaryDirectory(prefix="tidemq-handler-") as tmp:
        overrides = {"storePathRootDir": tmp, "listenPort": "0", "brokerIP1": "127.0.0.1"}
        app = BrokerApp(load_broker_config(None, {}, overrides), SystemClock())
        await app.start()
        try:
            # A second table over the same store and durability: the handler as served.
            assert app.durability is not None
            handle: Any = app._handler_table(app.durability).get(RequestCode.SEND_MESSAGE_V2)
            peer = _Peer()
            singles = [
                _request(RequestCode.SEND_MESSAGE_V2, body, _props(n), False) for n in range(count)
            ]
            batches = [
                _request(
                    RequestCode.SEND_BATCH_MESSAGE,
                    encode_batch([BatchItem(0, body, _props(b * BATCH + i)) for i in range(BATCH)]),
                    None,
                    True,
                )
                for b in range(count // BATCH)
            ]
            await handle(peer, singles[0])  # creates the topic
            await asyncio.sleep(0)
            shapes = (("single", singles, 1, 1), ("turn32", singles, 1, TURN))
            for name, requests, per, turn in (*shapes, ("batch64", batches, BATCH, 1)):
                if only and name != only:
                    continue
                if profiler:
                    profiler.enable()
                cpu = time.thread_time()
                for n, request in enumerate(requests):
                    response = await handle(peer, request)
                    assert response is None or response.code == 0, response.remark
                    if n % turn == turn - 1:
                        await asyncio.sleep(0)  # the loop turn ends: the coalescer stores
                await asyncio.sleep(0)
                cpu = time.thread_time() - cpu
                if profiler:
                    profiler.disable()
                print(f"{name}: {cpu / (len(requests) * per) * 1e6:.1f} µs/msg CPU")
        finally:
            await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=32_000)
    parser.add_argument("--only", choices=["single", "turn32", "batch64"])
    parser.add_argument("--profile")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    asyncio.run(run(args.count, profiler, args.only))
    if profiler:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
