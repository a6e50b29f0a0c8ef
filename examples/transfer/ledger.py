"""The two services' SQLite databases: one account each, and the rows that make transfers
idempotent. Shared by service_a.py, service_b.py and run.py.

    a.db  account(name, balance)   debit(transfer_id PRIMARY KEY, amount)
    b.db  account(name, balance)   credit(transfer_id PRIMARY KEY, amount)

A debit row is written in the same SQLite transaction as the balance change, so "the debit row
exists" is exactly "service A's local transaction committed" (what its check listener answers).
A credit row is likewise written with its balance change, so a redelivered or duplicated
message (the same transfer id) credits nothing twice.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

TOPIC = "TransferTopic"
PRODUCER_GROUP = "PG_TRANSFER_A"
CONSUMER_GROUP = "CG_TRANSFER_B"
OPENING_BALANCE = 10_000_000
# The transfer id travels in this user property and as the message key.
TRANSFER_ID = "TRANSFER_ID"


def open_db(path: Path, rows: str) -> sqlite3.Connection:
    """Open (and create) a service database; `rows` is "debit" or "credit"."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS account (name TEXT PRIMARY KEY, balance INTEGER)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {rows} (transfer_id TEXT PRIMARY KEY, amount INTEGER)")
    opening = OPENING_BALANCE if rows == "debit" else 0
    db.execute("INSERT OR IGNORE INTO account VALUES ('main', ?)", (opening,))
    return db


def totals(path: Path, rows: str) -> tuple[int, int, int]:
    """(rows, sum of their amounts, account balance) of a service database."""
    db = open_db(path, rows)
    query = f"SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM {rows}"
    count, amount = db.execute(query).fetchone()
    (balance,) = db.execute("SELECT balance FROM account WHERE name = 'main'").fetchone()
    db.close()
    return int(count), int(amount), int(balance)


def transfer_id(number: int) -> str:
    return f"tx-{number:07d}"


def amount_of(seed: int, number: int) -> int:
    """The planned amount of transfer `number` (1..999 cents), the same in every run of A."""
    return random.Random(seed * 1_000_003 + number).randint(1, 999)
