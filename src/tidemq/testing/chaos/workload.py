"""The chaos suite's clients: one process per role, each appending JSON lines to its own file.

    python -m tidemq.testing.chaos.workload ROLE --namesrv ADDR --out FILE --index K [--db F]

    producer  sync sends to ChaosTopic; "try" before each send, "ack" only for SEND_OK, "nack"
              (stored but not as durable as asked) or "err" (exception) otherwise
    ordered   sends to ChaosOrder with a sharding key (k0..k7, one queue per key) and a per-key
              sequence number; a failed send is retried with the same sequence number, so the
              stored order of a key's acknowledged messages must be increasing
    tx        transactional sends to ChaosTx; the local transaction writes its decision into a
              SQLite "database" (as examples/transfer does): commit, rollback, or commit but
              answer UNKNOW (the broker's check-back settles it from the database). "try" before
              each, "half" with the transaction's state once it ended (ROLLBACK_MESSAGE without
              running the local transaction if the half was stored but not as durable as asked),
              "err" if the half send raised (the local transaction did not run). A check-back
              for a half whose local transaction never ran decides rollback (INSERT first wins)
    consumer  clustering-mode push consumer of the three topics; one line per delivery with
              the queue and queue offset

Every body is the message's id (`{"id": ...}`) and the id is also the message key. Each process
writes {"ev": "ready"} once started and stops on SIGTERM after its current send, so the
runner's drain knows what was attempted. Timestamps are wall-clock seconds (`time.time()`): all
processes run on one machine, and the checker compares them with the fault log's.

Only the runner (`python -m tidemq.testing.chaos`) starts these.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

from tidemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendStatus,
    TransactionProducer,
)

TOPIC: Final = "ChaosTopic"
ORDER_TOPIC: Final = "ChaosOrder"
TX_TOPIC: Final = "ChaosTx"
TOPICS: Final = (TOPIC, ORDER_TOPIC, TX_TOPIC)
CONSUMER_GROUP: Final = "CG_CHAOS"
ORDER_KEYS: Final = tuple(f"k{i}" for i in range(8))
# After a failed send, wait this long: a dead master answers at once and would be hammered.
FAILED_SEND_PAUSE_S: Final = 0.1
ROLES: Final = ("producer", "ordered", "tx", "consumer")


class Journal:
    """Append-only JSON lines, flushed per line: a killed runner still finds every record."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        record = {"ev": event, "t": time.time(), **fields}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _body(message_id: str) -> bytes:
    return json.dumps({"id": message_id}).encode()


async def _send_recorded(
    journal: Journal, producer: Producer, message_id: str, message: Message, **how: Any
) -> bool:
    """Send once; record the outcome. True only for an acknowledged SEND_OK."""
    extra = {k: v for k, v in how.items() if k in ("key", "seq")}
    journal.write("try", id=message_id, **extra)
    try:
        result = await producer.send(message, sharding_key=how.get("sharding_key"))
    except Exception as exc:  # every failure is data here
        journal.write("err", id=message_id, err=f"{type(exc).__name__}: {exc}"[:200], **extra)
        return False
    if result.status is not SendStatus.SEND_OK:
        journal.write("nack", id=message_id, status=result.status.value, **extra)
        return False
    queue = result.message_queue
    journal.write(
        "ack",
        id=message_id,
        msg_id=result.msg_id,
        b=queue.broker_name,
        q=queue.queue_id,
        qo=result.queue_offset,
        **extra,
    )
    return True


async def _settle(journal: Journal, leave: asyncio.Event) -> None:
    """Sending is over: say so, and keep the client open until told to leave."""
    journal.write("settled")
    await leave.wait()


async def run_producer(
    args: argparse.Namespace, journal: Journal, stop: asyncio.Event, leave: asyncio.Event
) -> None:
    async with Producer(f"PG_CHAOS_{args.index}", args.namesrv, topics=[TOPIC]) as producer:
        journal.write("ready")
        number = 0
        while not stop.is_set():
            message_id = f"p{args.index}-{number}"
            message = Message(TOPIC, _body(message_id), keys=message_id)
            if not await _send_recorded(journal, producer, message_id, message):
                await asyncio.sleep(FAILED_SEND_PAUSE_S)
            number += 1
            await asyncio.sleep(args.interval_ms / 1000)
        await _settle(journal, leave)


async def run_ordered(
    args: argparse.Namespace, journal: Journal, stop: asyncio.Event, leave: asyncio.Event
) -> None:
    group = f"PG_CHAOS_ORDER_{args.index}"
    async with Producer(group, args.namesrv, topics=[ORDER_TOPIC]) as producer:
        journal.write("ready")
        sequences = dict.fromkeys(ORDER_KEYS, 0)
        turn = 0
        while not stop.is_set():
            key = ORDER_KEYS[turn % len(ORDER_KEYS)]
            seq = sequences[key]
            message_id = f"o{args.index}-{key}-{seq}"
            message = Message(ORDER_TOPIC, _body(message_id), keys=message_id)
            acked = await _send_recorded(
                journal, producer, message_id, message, key=key, seq=seq, sharding_key=key
            )
            if acked:
                sequences[key] = seq + 1
                turn += 1
            else:
                await asyncio.sleep(FAILED_SEND_PAUSE_S)
            await asyncio.sleep(args.interval_ms / 1000)
        await _settle(journal, leave)


class LedgerListener:
    """The local transaction and the check-back, both against one SQLite table:
    decision(id PRIMARY KEY, state 'commit' | 'rollback'). The first writer of an id decides."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.db = open_ledger(db_path)
        self.plans: dict[str, str] = {}

    def _decide(self, db: sqlite3.Connection, message_id: str, state: str) -> str:
        db.execute("INSERT OR IGNORE INTO decision VALUES (?, ?)", (message_id, state))
        row = db.execute("SELECT state FROM decision WHERE id = ?", (message_id,)).fetchone()
        return str(row[0])

    def decide(self, message_id: str, state: str) -> str:
        return self._decide(self.db, message_id, state)

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        message_id, plan = str(arg[0]), str(arg[1])
        wanted = "rollback" if plan == "rollback" else "commit"
        decided = self._decide(self.db, message_id, wanted)
        if decided == "rollback":
            return LocalTransactionState.ROLLBACK_MESSAGE
        if plan == "unknown":
            return LocalTransactionState.UNKNOW
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        db = open_ledger(self.db_path)  # check-backs run on worker threads
        try:
            message_id = json.loads(message.body)["id"]
            decided = self._decide(db, message_id, "rollback")
        finally:
            db.close()
        if decided == "commit":
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE


def open_ledger(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS decision (id TEXT PRIMARY KEY, state TEXT)")
    return db


def read_ledger(path: Path) -> dict[str, str]:
    """id → 'commit' | 'rollback': the committed local transactions and the rolled-back ones."""
    if not path.exists():
        return {}
    db = open_ledger(path)
    try:
        return {str(i): str(s) for i, s in db.execute("SELECT id, state FROM decision")}
    finally:
        db.close()


async def run_tx(
    args: argparse.Namespace, journal: Journal, stop: asyncio.Event, leave: asyncio.Event
) -> None:
    listener = LedgerListener(args.db)
    rng = random.Random(args.seed * 7919 + args.index)
    async with TransactionProducer(
        f"PG_CHAOS_TX_{args.index}", args.namesrv, listener=listener, topics=[TX_TOPIC]
    ) as producer:
        journal.write("ready")
        number = 0
        while not stop.is_set():
            message_id = f"t{args.index}-{number}"
            plan = rng.choices(("commit", "rollback", "unknown"), (75, 15, 10))[0]
            message = Message(TX_TOPIC, _body(message_id), keys=message_id)
            journal.write("try", id=message_id, plan=plan)
            try:
                result = await producer.send_message_in_transaction(message, (message_id, plan))
            except Exception as exc:
                journal.write("err", id=message_id, err=f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(FAILED_SEND_PAUSE_S)
            else:
                journal.write("half", id=message_id, state=result.local_transaction_state.name)
            # A half whose local transaction never ran ("err": the send raised; or "half"
            # ROLLBACK_MESSAGE: stored but not durable) is rolled back; recorded so the checker
            # sees it if it ever becomes visible. A decision the local transaction or a
            # check-back already made stays (the first writer wins).
            listener.decide(message_id, "rollback")
            number += 1
            await asyncio.sleep(args.interval_ms / 1000)
        await _settle(journal, leave)


async def run_consumer(args: argparse.Namespace, journal: Journal, stop: asyncio.Event) -> None:
    consumer = PushConsumer(
        CONSUMER_GROUP,
        args.namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_concurrency=2,
        instance_name=f"chaos-consumer-{args.index}",
    )
    for topic in TOPICS:
        consumer.subscribe(topic)

    def on_messages(messages: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        for m in messages:
            try:
                message_id = json.loads(m.body)["id"]
            except (ValueError, KeyError, TypeError):
                message_id = f"?{m.msg_id}"
            journal.write(
                "recv", id=message_id, topic=m.topic, b=m.broker_name, q=m.queue_id,
                qo=m.queue_offset, msg_id=m.msg_id, rc=m.reconsume_times,
            )  # fmt: skip
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer.register_listener(on_messages)
    async with consumer:
        journal.write("ready")
        await stop.wait()


_RUNNERS: Final = {"producer": run_producer, "ordered": run_ordered, "tx": run_tx}


async def main_async(args: argparse.Namespace) -> int:
    """Run the role. SIGUSR1 (the drain): stop sending, write "settled", stay connected (a
    transactional producer still answers check-backs); SIGTERM: leave."""
    stop_sending = asyncio.Event()
    leave = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, stop_sending.set)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, leave.set)
        loop.add_signal_handler(signum, stop_sending.set)
    journal = Journal(args.out)
    try:
        if args.role == "consumer":
            await run_consumer(args, journal, leave)
        else:
            await _RUNNERS[args.role](args, journal, stop_sending, leave)
        journal.write("stopped")
    finally:
        journal.close()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a chaos-suite client process")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--db", type=Path, default=None)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
