"""Service B: consumes committed transfers and credits its account, once per transfer id.

The credit row and the balance change are one SQLite transaction, and the credit row's primary
key is the transfer id: a message delivered twice (a consumer retry, or the same transfer
committed from two half messages after A crashed and retried it) credits nothing the second
time. Prints "READY" once subscribed; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import sys
import threading
from pathlib import Path

from ledger import CONSUMER_GROUP, TOPIC, TRANSFER_ID, open_db

from tidemq import ConsumeConcurrentlyStatus, ConsumeFromWhere, MessageExt, PushConsumer


class Crediter:
    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._local = threading.local()
        open_db(db_path, "credit").close()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = open_db(self.db_path, "credit")
        return db

    def __call__(self, messages: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        db = self._db()
        for message in messages:
            tid = message.properties[TRANSFER_ID]
            amount = int(json.loads(message.body)["amount"])
            db.execute("BEGIN IMMEDIATE")
            inserted = db.execute(
                "INSERT OR IGNORE INTO credit VALUES (?, ?)", (tid, amount)
            ).rowcount
            if inserted:
                db.execute(
                    "UPDATE account SET balance = balance + ? WHERE name = 'main'", (amount,)
                )
            db.execute("COMMIT")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = PushConsumer(
        CONSUMER_GROUP,
        args.namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_concurrency=4,
    )
    consumer.subscribe(TOPIC)
    consumer.register_listener(Crediter(args.db))
    async with consumer:
        print("READY", flush=True)
        await stop.wait()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--db", type=Path, required=True)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
