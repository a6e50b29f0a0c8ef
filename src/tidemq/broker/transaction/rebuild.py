"""Rebuilding the transaction ledger at start from the store alone, and repairing what a crash
left half done. Apart from resolution.py because it runs once, before any answer, and changes
with the on-disk history (upstream op forms, crash windows), not with the steady-state writes.

    1. op queue from (CID_RMQ_SYS_TRANS op offset - OUTCOMES_REPLAY_EXTRA) to its end
       → outcome per origin (the __TXOUTCOME# property; upstream ops read as ROLLBACK);
    2. half queue from the CID_RMQ_SYS_TRANS half offset to its end → the newest record of each
       origin without an outcome is pending (every live transaction has a record there: the
       check service advances that offset only past records resolved, stale or copied forward);
    3. repair: a pending transaction whose committed real message is already in the store (the
       broker died between storing it and its op message) is marked COMMITTED and its op written,
       so a check-back cannot commit it twice. Found through the key index (UNIQ_KEY of the
       real topic) and preparedTransactionOffset → a record of the same origin.

The queue readers (`start_offset`, `scan_records`, `scan_queue`) are shared with the check-back
service, which walks the same queues while running.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.timer import TIMER_TOPIC_PREFIX
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.ledger import TRANSACTION_OUTCOMES_MAX, PendingHalf, pending_of
from tidemq.broker.transaction.states import TxInput, TxState
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import SCHEDULE_TOPIC_XXXX, TRANS_CHECK_GROUP, UNIQ_KEY, SysFlag
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import GetStatus

if TYPE_CHECKING:
    from tidemq.broker.transaction.resolution import TransactionResolver

# Logged under the name it had before the split: log filters and configurations keep working.
log = logging.getLogger("tidemq.broker.transaction.resolution")

__all__ = [
    "OUTCOMES_REPLAY_EXTRA",
    "REPAIR_CANDIDATES_MAX",
    "SCAN_BATCH_MAX",
    "rebuild_ledger",
    "scan_queue",
    "scan_records",
    "start_offset",
]

# At start, op messages replayed before the persisted op offset, so recent outcomes survive.
OUTCOMES_REPLAY_EXTRA: Final = TRANSACTION_OUTCOMES_MAX
# Records read per store call while scanning a system queue.
SCAN_BATCH_MAX: Final = 64
# Index candidates read when looking for a committed real message at start.
REPAIR_CANDIDATES_MAX: Final = 8

_FOREVER_MS: Final = 2**62

_OUTCOME_STATES: Final = {
    hm.Outcome.COMMIT: TxState.COMMITTED,
    hm.Outcome.ROLLBACK: TxState.ROLLED_BACK,
    hm.Outcome.DISCARD: TxState.DISCARDED,
}


def start_offset(store: FileMessageStore, offsets: ConsumerOffsetTable, topic: str) -> int:
    """The CID_RMQ_SYS_TRANS offset of `topic` queue 0, clamped into the queue's range."""
    committed = offsets.query(TRANS_CHECK_GROUP, topic, hm.HALF_QUEUE_ID)
    low = store.min_offset(topic, hm.HALF_QUEUE_ID)
    high = store.max_offset(topic, hm.HALF_QUEUE_ID)
    return min(max(committed if committed is not None else low, low), high)


def scan_records(
    store: FileMessageStore, topic: str, start: int, end: int
) -> Iterator[tuple[int, bytes]]:
    """(queue offset, record) of `topic` queue 0 with start <= queue offset < end, in order, not
    decoded. Records that fail their checks are skipped by the store (and logged there)."""
    offset = start
    while offset < end:
        result = store.get_messages(topic, hm.HALF_QUEUE_ID, offset, SCAN_BATCH_MAX)
        if result.status is GetStatus.OFFSET_TOO_SMALL or (
            not result.records and result.next_begin_offset > offset
        ):
            offset = result.next_begin_offset
            continue
        if not result.records:
            return
        for data in result.records:
            queue_offset = rec.queue_offset_at(data)
            if queue_offset >= end:
                return
            yield queue_offset, data
        offset = result.next_begin_offset


def scan_queue(
    store: FileMessageStore, topic: str, start: int, end: int
) -> Iterator[rec.StoredMessage]:
    """`scan_records`, decoded."""
    for _queue_offset, data in scan_records(store, topic, start, end):
        # The store serves only records whose whole-record CRC it checked.
        yield rec.decode_record(data, verify_crc=False)


def rebuild_ledger(resolver: TransactionResolver, offsets: ConsumerOffsetTable) -> None:
    """Rebuild `resolver`'s ledger from the op and half queues (see the module docstring)."""
    store, ledger = resolver.store, resolver.ledger
    op_start = start_offset(store, offsets, hm.OP_TOPIC)
    op_start = max(op_start - OUTCOMES_REPLAY_EXTRA, store.min_offset(hm.OP_TOPIC, 0))
    op_end = store.max_offset(hm.OP_TOPIC, hm.HALF_QUEUE_ID)
    outcomes = 0
    for op in scan_queue(store, hm.OP_TOPIC, op_start, op_end):
        try:
            origins = hm.parse_op_body(op.body)
            state = _OUTCOME_STATES[hm.outcome_of_op(op)]
        except ProtocolError as exc:
            log.warning("skipping op message at %d: %s", op.queue_offset, exc)
            continue
        for origin in origins:
            ledger.remember(origin, state)
            outcomes += 1
    half_start = start_offset(store, offsets, hm.HALF_TOPIC)
    half_end = store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
    for half in scan_queue(store, hm.HALF_TOPIC, half_start, half_end):
        origin = hm.origin_of(half)
        if ledger.state(origin) is not None and ledger.pending(origin) is None:
            continue
        try:
            state = TxState.CHECKING if hm.check_times_of(half) else TxState.PREPARED
            ledger.track(pending_of(half, state))
        except ProtocolError as exc:
            log.warning("skipping malformed half message %d: %s", half.queue_offset, exc)
    repaired = sum(_repair(resolver, p) for p in ledger.pending_list())
    log.info(
        "transaction ledger rebuilt: %d outcomes from op offset %d, %d in flight from half "
        "offset %d, %d commits repaired",
        outcomes,
        op_start,
        ledger.in_flight,
        half_start,
        repaired,
    )


def _repair(resolver: TransactionResolver, entry: PendingHalf) -> bool:
    """Mark `entry` COMMITTED (and write its op) if its real message is already stored."""
    store = resolver.store
    data = store.read_record(entry.physical_offset)
    if data is None:
        return False
    half = rec.decode_record(data)
    uniq = half.property_map().get(UNIQ_KEY)
    if not uniq:
        return False
    # A committed message with a delay sits in a parking topic until due (then in the
    # real topic): the index is per topic, so look in each place it can be.
    parking = [t for t in store.topics_and_queues() if t.startswith(TIMER_TOPIC_PREFIX)]
    for topic in (entry.real_topic, SCHEDULE_TOPIC_XXXX, *parking):
        if _repair_from(resolver, entry, topic, uniq):
            return True
    return False


def _repair_from(resolver: TransactionResolver, entry: PendingHalf, topic: str, uniq: str) -> bool:
    for found in resolver.store.query_by_key(
        topic, uniq, REPAIR_CANDIDATES_MAX, entry.first_store_ms, _FOREVER_MS
    ):
        real = rec.decode_record(found)
        if SysFlag.transaction_type(real.sys_flag) != SysFlag.COMMIT:
            continue
        source = resolver.load_half(real.prepared_transaction_offset)
        if source is not None and hm.origin_of(source) == entry.origin:
            log.warning("transaction %d was committed before a crash: op repaired", entry.origin)
            resolver.put_op([entry.origin], hm.Outcome.COMMIT)
            resolver.ledger.apply(entry.origin, TxInput.COMMIT)
            return True
    return False
