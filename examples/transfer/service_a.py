"""Service A: debits its account inside the local transaction of a half message.

    for each planned transfer not yet debited (resumes after a crash):
      1. send_half(message)          the half message, invisible to service B
      2. local transaction           INSERT debit row + UPDATE balance, one SQLite transaction
      3. end_transaction(COMMIT)     oneway; if it is lost (or A dies first) the broker checks
                                     back and the listener answers from the database

`--pause-at N:POINT` stops at a kill point of transfer N (half_sent, local_committed or
end_sent): A prints "PAUSED N POINT" and waits to be killed (run.py sends SIGKILL). After the
last transfer A prints "DONE" and keeps answering check-backs until it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from ledger import PRODUCER_GROUP, TOPIC, TRANSFER_ID, amount_of, open_db, transfer_id

from tidemq import LocalTransactionState, Message, MessageExt, TransactionProducer

POINTS = ("half_sent", "local_committed", "end_sent")
# A half send that failed is retried after this long (the broker may be busy or restarting).
RETRY_DELAY_S = 0.2


class DebitListener:
    """The local transaction and the check-back answer, both against a.db."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.db = open_db(db_path, "debit")

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        tid = message.properties[TRANSFER_ID]
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT INTO debit VALUES (?, ?)", (tid, arg))
            self.db.execute("UPDATE account SET balance = balance - ? WHERE name = 'main'", (arg,))
        except sqlite3.Error:
            self.db.execute("ROLLBACK")
            return LocalTransactionState.ROLLBACK_MESSAGE
        self.db.execute("COMMIT")
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        # Runs on the producer's check worker threads: a connection of its own each time.
        db = open_db(self.db_path, "debit")
        try:
            row = db.execute(
                "SELECT 1 FROM debit WHERE transfer_id = ?", (message.properties[TRANSFER_ID],)
            ).fetchone()
        finally:
            db.close()
        if row is not None:
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE


def say(line: str) -> None:
    print(line, flush=True)


async def pause_if(pause: tuple[int, str] | None, number: int, point: str) -> None:
    if pause == (number, point):
        say(f"PAUSED {number} {point}")
        await asyncio.Event().wait()  # until SIGKILL


async def run(args: argparse.Namespace) -> int:
    listener = DebitListener(args.db)
    # Transfers are debited in order, so the rows present are exactly transfers 0 .. count-1.
    (start,) = listener.db.execute("SELECT COUNT(*) FROM debit").fetchone()
    pause = None
    if args.pause_at:
        number, point = args.pause_at.split(":")
        pause = (int(number), point)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with TransactionProducer(
        PRODUCER_GROUP, args.namesrv, listener=listener, instance_name=f"A-{args.incarnation}"
    ) as producer:
        say(f"STARTED at {start}")
        for number in range(start, args.transfers):
            tid = transfer_id(number)
            amount = amount_of(args.seed, number)
            message = Message(
                TOPIC,
                json.dumps({"id": tid, "amount": amount}).encode(),
                keys=tid,
                properties={TRANSFER_ID: tid},
            )
            while True:
                half = await producer.send_half(message)
                if half.run_local:
                    break
                await asyncio.sleep(RETRY_DELAY_S)
            await pause_if(pause, number, "half_sent")
            state = listener.execute_local_transaction(half.message, amount)
            await pause_if(pause, number, "local_committed")
            await producer.end_transaction(half, state)
            await pause_if(pause, number, "end_sent")
        say(f"DONE {args.transfers}")
        await stop.wait()  # keep answering check-backs for earlier incarnations' transfers
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--transfers", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--incarnation", type=int, default=0)
    parser.add_argument("--pause-at", default=None, metavar="N:POINT")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
