"""µs per put_message of a 1 KiB message on a real store in a temporary directory (no flush).

Usage: python benchmarks/profile/store_put.py [COUNT] [--batch N] [--profile OUT]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import tempfile
import time
from pathlib import Path

from tidemq.clock import SystemClock
from tidemq.protocol.message import encode_properties
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=50_000)
    parser.add_argument("--batch", type=int, default=1, help="put_messages of this many")
    parser.add_argument("--profile")
    args = parser.parse_args()
    body = os.urandom(1024)
    with tempfile.TemporaryDirectory(prefix="tidemq-put-") as tmp:
        store = FileMessageStore(StoreConfig(root_dir=Path(tmp)), SystemClock())
        store.start()
        messages = [
            MessageToStore(
                topic="ProfileTopic",
                queue_id=index % 8 if args.batch == 1 else 0,
                body=body,
                flag=0,
                properties=encode_properties(
                    {"UNIQ_KEY": f"7F0000010001{index:020X}", "CLUSTER": "DefaultCluster"}
                ),
                sys_flag=0,
                born_timestamp=1_700_000_000_000,
                born_host=("127.0.0.1", 40000),
                store_host=("127.0.0.1", 10911),
            )
            for index in range(args.count)
        ]
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        if args.batch == 1:
            for message in messages:
                store.put_message(message)
        else:
            for first in range(0, args.count, args.batch):
                store.put_messages(messages[first : first + args.batch])
        elapsed = time.perf_counter() - start
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        store.shutdown()
    print(f"put (batch {args.batch}): {elapsed / args.count * 1e6:.1f} µs per 1 KiB message")


if __name__ == "__main__":
    main()
