"""Delivery-time error of delayed messages (actual - scheduled) with 100,000 others pending.

One in-process broker (port 0, a temporary store). First `--pending` messages are parked that
stay pending for the whole run: half on delay levels of an hour, half on TIMER_DELIVER_MS
spread over the next 7 days (so both the schedule topic and ~10,000 timer buckets are full).
They are put straight into the store through the broker's own DelayRouter, which is what a send
does after parsing, to keep the setup short. Then `--probes` probe messages are sent over TCP
while a consumer long-polls their topic: half with a delay level (1 s, 2 s or 3 s), half with
TIMER_DELIVER_MS 0.5..3 s ahead. For each probe, error = time the consumer received it minus
its scheduled time (client clock: send ack + level for levels, the property for timers).

Usage: python benchmarks/bench_delay.py [--pending 100000] [--probes 400]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from tidemq.protocol.message import encode_properties
from tidemq.protocol.record import decode_records
from tidemq.remoting.client import RemotingClient
from tidemq.store.types import MessageToStore

LEVELS = "1s 2s 3s 1h"
TOPIC = "BenchDelay"
WEEK_MS = 7 * 24 * 3600 * 1000


def park_pending(app: BrokerApp, count: int, rng: random.Random) -> float:
    started = time.perf_counter()
    now = app.clock.now_ms()
    for i in range(count):
        props = (
            {"DELAY": "4"}
            if i % 2 == 0
            else {"TIMER_DELIVER_MS": str(now + 3_600_000 + rng.randrange(WEEK_MS - 7_200_000))}
        )
        message = MessageToStore(
            topic="BenchPending",
            queue_id=0,
            body=b"p" * 100,
            flag=0,
            properties=encode_properties(props),
            sys_flag=0,
            born_timestamp=now,
            born_host=("127.0.0.1", 1),
            store_host=("127.0.0.1", 2),
        )
        assert app.store.put_message(app.delays.route(message)).ok
    return time.perf_counter() - started


async def run(pending: int, probes: int) -> None:
    rng = random.Random(42)
    with tempfile.TemporaryDirectory() as tmp:
        config = load_broker_config(
            None,
            {},
            {
                "storePathRootDir": str(Path(tmp) / "store"),
                "listenPort": "0",
                "listenHost": "127.0.0.1",
                "messageDelayLevel": LEVELS,
            },
        )
        app = BrokerApp(config, SystemClock())
        await app.start()
        client = RemotingClient()
        try:
            setup_s = park_pending(app, pending, rng)
            print(f"parked {pending} pending messages in {setup_s:.1f} s")
            print(f"timer buckets pending: {app.timer.pending_buckets}")
            due: dict[bytes, float] = {}
            errors_ms: dict[str, list[float]] = {"level": [], "timer": []}
            done = asyncio.Event()

            async def consume() -> None:
                offset = 0
                while len(errors_ms["level"]) + len(errors_ms["timer"]) < probes:
                    header = PullMessageRequestHeader(
                        consumer_group="CG_BENCH",
                        topic=TOPIC,
                        queue_id=0,
                        queue_offset=offset,
                        max_msg_nums=32,
                        sys_flag=0x2 | 0x4,
                        commit_offset=0,
                        suspend_timeout_millis=5_000,
                        subscription="*",
                        sub_version=0,
                    )
                    cmd = RemotingCommand(
                        code=RequestCode.PULL_MESSAGE, ext_fields=header.to_fields()
                    )
                    response = await client.invoke(app.address, cmd, 10_000)
                    received = time.time() * 1000
                    if response.code != 0:
                        offset = int(response.ext_fields.get("nextBeginOffset", offset))
                        continue
                    for message in decode_records(response.body):
                        kind = "level" if message.body.startswith(b"L") else "timer"
                        errors_ms[kind].append(received - due[message.body])
                        offset = message.queue_offset + 1
                done.set()

            consumer = asyncio.create_task(consume())
            for i in range(probes):
                body = b"%s%d" % (b"L" if i % 2 == 0 else b"T", i)
                if i % 2 == 0:
                    level = 1 + i % 3
                    props = {"DELAY": str(level)}
                else:
                    target = time.time() * 1000 + rng.uniform(500, 3_000)
                    props = {"TIMER_DELIVER_MS": str(int(target))}
                header = SendMessageRequestHeader(
                    producer_group="PG_BENCH",
                    topic=TOPIC,
                    queue_id=0,
                    born_timestamp=int(time.time() * 1000),
                    properties=encode_properties(props),
                )
                cmd = RemotingCommand(
                    code=RequestCode.SEND_MESSAGE, ext_fields=header.to_fields(), body=body
                )
                sent = time.time() * 1000
                response = await client.invoke(app.address, cmd, 10_000)
                assert response.code == 0, response.remark
                if i % 2 == 0:
                    # The broker stamps on arrival, between `sent` and the ack: take the midpoint.
                    acked = time.time() * 1000
                    due[body] = (sent + acked) / 2 + 1000 * level
                else:
                    due[body] = int(props["TIMER_DELIVER_MS"])
                await asyncio.sleep(rng.uniform(0, 0.01))
            await asyncio.wait_for(done.wait(), 30)
            await consumer
            for kind, values in errors_ms.items():
                values.sort()
                p50 = statistics.median(values)
                p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
                print(
                    f"{kind:5}  n={len(values)}  error p50={p50:.1f} ms  p99={p99:.1f} ms  "
                    f"min={values[0]:.1f} ms  max={values[-1]:.1f} ms"
                )
            assert app.store.max_offset("BenchPending", 0) == 0, "a pending message came out"
        finally:
            await client.close()
            await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--probes", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(run(args.pending, args.probes))


if __name__ == "__main__":
    main()
