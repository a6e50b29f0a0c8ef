"""Produce 1 KiB messages with the official RocketMQ C++ client (PyPI rocketmq 0.4.4).

Runs as its own process (librocketmq's threads and its process-wide client factory must not live
in the suite's process) with HOME set to a scratch dir (the library writes ~/logs there).
Prints one JSON line: {"rate": msgs/s, "count": n, "seconds": s} or {"error": "..."}.

    sync   producer.send_sync, one at a time
    async  producer.send_async with `window` sends in flight (callbacks on librocketmq threads)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

SEND_TIMEOUT_MS = 10_000
WARM_UP_COUNT = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mode", choices=["sync", "async"], required=True)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    from rocketmq.client import Message, Producer

    producer = Producer(f"bench_cpp_{os.getpid()}", timeout=SEND_TIMEOUT_MS)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    body = os.urandom(args.size // 2).hex()  # the binding takes str bodies
    failures: list[str] = []

    def message() -> Message:
        msg = Message(args.topic)
        msg.set_body(body)
        return msg

    for _ in range(WARM_UP_COUNT):
        producer.send_sync(message())
    count = 0
    start = time.monotonic()
    deadline = start + args.seconds
    if args.mode == "sync":
        while count < args.count and time.monotonic() < deadline:
            producer.send_sync(message())
            count += 1
    else:
        slots = threading.Semaphore(args.window)
        acked = threading.Semaphore(0)
        in_flight: dict[int, Message] = {}  # the binding needs each message alive until acked
        lock = threading.Lock()

        def settle(key: int) -> None:
            with lock:
                in_flight.pop(key, None)
            slots.release()
            acked.release()

        def on_error(key: int, exc: Exception) -> None:
            failures.append(repr(exc))
            settle(key)

        while count < args.count and time.monotonic() < deadline:
            slots.acquire()
            msg = message()
            key = count
            with lock:
                in_flight[key] = msg
            producer.send_async(
                msg,
                lambda _result, key=key: settle(key),
                lambda exc, key=key: on_error(key, exc),
            )
            count += 1
        for _ in range(count):
            if not acked.acquire(timeout=30):
                failures.append("ack timeout")
                break
    elapsed = time.monotonic() - start
    if failures:
        print(json.dumps({"error": f"{len(failures)} failed: {failures[0]}"}), flush=True)
    else:
        print(json.dumps({"rate": count / elapsed, "count": count, "seconds": elapsed}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip the binding's __del__ shutting the client down a second time


if __name__ == "__main__":
    main()
