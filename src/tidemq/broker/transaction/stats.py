"""Counters of the transaction feature, for `tidemq tx stats` and, later, the metrics endpoint.

Counted since the broker started (not persisted): RocketMQ's statistics are per process too.
`in_flight` is not a counter but the ledger's live gauge, filled in by whoever snapshots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class TransactionStats:
    prepared: int = 0  # half messages stored
    committed: int = 0  # real messages stored by a COMMIT
    rolled_back: int = 0  # ROLLBACKs that resolved a transaction
    checked: int = 0  # CHECK_TRANSACTION_STATE sent to a producer
    check_no_producer: int = 0  # checks due while no producer of the group was live
    discarded: int = 0  # half messages moved to TRANS_CHECK_MAX_TIME_TOPIC
    duplicate_answers: int = 0  # repeated COMMIT/ROLLBACK answered without storing anything
    refused_answers: int = 0  # answers contradicting the outcome (ROLLBACK after COMMIT, ...)

    def snapshot(self, in_flight: int) -> dict[str, int]:
        values = asdict(self)
        values["in_flight"] = in_flight
        return values
