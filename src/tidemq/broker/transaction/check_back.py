"""CheckBackService: asks producers about half messages nobody answered for (remoting.md §8).

One pass, every transactionCheckInterval:

    half queue, from the CID_RMQ_SYS_TRANS offset to its end *as the pass began*
      │ for each record:
      ├─ not the newest record of a pending transaction ─▶ skip (resolved, or a stale copy;
      │                                 told by its queue offset alone, without decoding it)
      ├─ a Spark sink half (__SPARKTXN#) ─▶ resolved from the batch records (batch.py), never
      │                                 checked back; one that must wait is rewritten when old
      ├─ TRANSACTION_CHECK_TIMES >= transactionCheckMax, or older than fileReservedTime
      │                                 ─▶ discard: TRANS_CHECK_MAX_TIME_TOPIC + op DISCARD
      ├─ younger than CHECK_IMMUNITY_TIME_IN_SECONDS (else transactionTimeOut)
      │     ├─ immunity longer than transactionTimeOut ─▶ rewrite it at the queue's end
      │     └─ otherwise ─▶ leave it: it pins the half offset (due within transactionTimeOut)
      ├─ due, but no live connection of PGROUP that may be asked (the producers are gone, a
      │     restarted broker has not yet had their heartbeat, or under ACL no account of theirs
      │     has PUB on the real topic) ─▶ the check would reach nobody, so it does not
      │     count toward transactionCheckMax:
      │     ├─ __TXUNREACHED# >= transactionUnreachedCheckMax ─▶ discard, as above
      │     └─ otherwise ─▶ put back a copy with __TXUNREACHED# + 1, TRANSACTION_CHECK_TIMES kept
      └─ due ─▶ put back a copy with TRANSACTION_CHECK_TIMES + 1 (its offsets are what the
                producer answers with), then CHECK_TRANSACTION_STATE (oneway, body = the copy
                with its real topic and queue) to one live connection of PGROUP, the next one
                if that write fails; round-robin across passes, so a producer that crashed
                without closing its socket is replaced by another of the group next time
    then: half offset := the first record left (or where the pass stopped); op offset advanced
          past op messages stored before that record (rebuild must replay the rest), both
          committed to the consumer-offset table (persisted with the other groups' offsets)

Why unreached checks are not counted: RocketMQ counts every due check, so after a broker restart
(producers unknown until their next heartbeat, up to 30 s) or before a started producer has sent
anything, passes that asked nobody used up transactionCheckMax and committed local transactions
were discarded (issue 11, item 6). "Reached" means a live connection of the group when the pass
visits the record; a write that then fails still counts (rare: the connection closed in between).
A group gone for good keeps its halves at most transactionUnreachedCheckMax passes (then
discarded) and never beyond fileReservedTime; unreached copies are written once per pass, as
counted checks are. The unreached transactions of a pass are logged in one line.

Records are only ever appended, so "skip what the op queue marks resolved" reads the ledger,
which is the op queue's in-memory form (resolution.py). Ages count from the transaction's first
store time, which every copy carries as its own store timestamp. A pass stops after
`pass_time_max_ms` or `pass_messages_max` records (RocketMQ caps a pass at 60 s) and yields the
event loop every SCAN_BATCH_MAX records; each record's visit is synchronous, so END_TRANSACTION
handled in between sees a consistent ledger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Self

from tidemq.broker.config import BrokerConfig
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.service import PeriodicService
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.batch import SinkBatchResolver
from tidemq.broker.transaction.rebuild import (
    SCAN_BATCH_MAX,
    scan_queue,
    scan_records,
    start_offset,
)
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.broker.transaction.states import TxInput
from tidemq.clock import Clock
from tidemq.errors import ConnectionClosedError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import CheckTransactionStateRequestHeader
from tidemq.protocol.message import PGROUP, REAL_TOPIC, TRANS_CHECK_GROUP, UNIQ_KEY, offset_msg_id
from tidemq.remoting.connection import Connection

log = logging.getLogger(__name__)

# As RocketMQ: one pass over the half queue gives up after 60 s and resumes next interval.
CHECK_PASS_TIME_MAX_MS: Final = 60_000
# Records visited per pass, so a huge backlog is worked off over several passes.
CHECK_PASS_MESSAGES_MAX: Final = 100_000

# (producer group, the half's real topic) → the connections of the group that may be asked
# about a half of that topic (under ACL: those whose account has PUB on it; app.py).
ProducerConnections = Callable[[str, str], list[Connection]]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckBackConfig:
    interval_ms: int = 60_000
    timeout_ms: int = 6_000
    check_max: int = 15
    file_reserved_ms: int = 72 * 3_600_000
    unreached_max: int = 60
    pass_time_max_ms: int = CHECK_PASS_TIME_MAX_MS
    pass_messages_max: int = CHECK_PASS_MESSAGES_MAX

    def __post_init__(self) -> None:
        assert self.interval_ms > 0
        assert self.timeout_ms > 0
        assert self.check_max >= 0
        assert self.unreached_max >= 1
        assert self.file_reserved_ms > 0
        assert self.pass_time_max_ms > 0
        assert self.pass_messages_max > 0

    @classmethod
    def from_broker(cls, config: BrokerConfig) -> Self:
        return cls(
            interval_ms=config.transaction_check_interval_ms,
            timeout_ms=config.transaction_timeout_ms,
            check_max=config.transaction_check_max,
            unreached_max=config.transaction_unreached_check_max,
            file_reserved_ms=int(config.file_reserved_time_hours * 3_600_000),
        )


@dataclass(slots=True)
class PassReport:
    """What one pass did (logged, and returned for tests)."""

    scanned: int = 0
    checked: int = 0
    unreached: int = 0  # due, but no live producer of the group: put back, not counted
    discarded: int = 0
    rewritten: int = 0
    left: int = 0
    resolved_sink: int = 0
    capped: bool = False
    half_offset: int = 0
    op_offset: int = 0


class CheckBackService:
    def __init__(
        self,
        config: CheckBackConfig,
        resolver: TransactionResolver,
        offsets: ConsumerOffsetTable,
        producers: ProducerConnections,
        clock: Clock,
        sink_batches: SinkBatchResolver | None = None,
    ) -> None:
        self.config = config
        # Spark sink halves are resolved from their batch records, never checked back.
        self._sink_batches = sink_batches
        self._resolver = resolver
        self._store = resolver.store
        self._ledger = resolver.ledger
        self._stats = resolver.stats
        self._offsets = offsets
        self._producers = producers
        self._clock = clock
        self._half_min_seen = -1
        self._periodic = PeriodicService("transaction-check", config.interval_ms, self.run_once)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def trigger(self) -> None:
        self._periodic.trigger()

    # -- one pass ------------------------------------------------------------------------------

    async def run_once(self) -> PassReport:
        report = PassReport()
        self._forget_removed()
        started_ms = self._clock.monotonic_ms()
        now_ms = self._clock.now_ms()
        half_start = start_offset(self._store, self._offsets, hm.HALF_TOPIC)
        half_end = self._store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        position = half_start
        pin: int | None = None
        copies: list[rec.StoredMessage] = []
        unreached_groups: set[str] = set()
        # Only a record that is the newest of a pending transaction needs a visit (what _visit
        # checks first); the others, most of the queue, are passed over without decoding. No
        # record of the walk becomes one during the pass: new records go after its end.
        live = self._ledger.pending_queue_offsets()
        for queue_offset, data in scan_records(self._store, hm.HALF_TOPIC, half_start, half_end):
            if report.scanned >= self.config.pass_messages_max or (
                self._clock.monotonic_ms() - started_ms >= self.config.pass_time_max_ms
            ):
                report.capped = True
                break
            report.scanned += 1
            if queue_offset in live:
                # The store serves only records whose whole-record CRC it checked.
                half = rec.decode_record(data, verify_crc=False)
                visited = self._visit(half, now_ms, report, copies, unreached_groups)
                if not visited and pin is None:
                    pin = queue_offset
            position = queue_offset + 1
            if report.scanned % SCAN_BATCH_MAX == 0:
                await asyncio.sleep(0)
        else:
            position = half_end
        report.half_offset = pin if pin is not None else position
        self._offsets.commit(TRANS_CHECK_GROUP, hm.HALF_TOPIC, hm.HALF_QUEUE_ID, report.half_offset)
        report.op_offset = self._advance_op_offset(report.half_offset)
        for copy in copies:
            await self._send_check(copy)
        if unreached_groups:
            log.warning(
                "%d transactions due for a check found no live producer of %s; not counted "
                "toward transactionCheckMax (%d such passes allowed each)",
                report.unreached,
                ", ".join(sorted(unreached_groups)),
                self.config.unreached_max,
            )
        if report.scanned:
            log.debug("transaction check pass: %s", report)
        return report

    def _visit(
        self,
        half: rec.StoredMessage,
        now_ms: int,
        report: PassReport,
        copies: list[rec.StoredMessage],
        unreached_groups: set[str],
    ) -> bool:
        """Handle one record; False when it is left for a later pass (it pins the offset)."""
        try:
            origin = hm.origin_of(half)
            entry = self._ledger.pending(origin)
            if entry is None or entry.queue_offset != half.queue_offset:
                return True
            age_ms = now_ms - half.store_timestamp
            check_times = hm.check_times_of(half)
            if self._sink_batches is not None and self._sink_batches.owns(half):
                return self._visit_sink_half(half, now_ms, age_ms, check_times, report)
            if check_times >= self.config.check_max or age_ms > self.config.file_reserved_ms:
                log.warning(
                    "discarding transaction %d of %s (checked %d times, %d ms old)",
                    origin,
                    entry.producer_group,
                    check_times,
                    age_ms,
                )
                return self._discard(half, report)
            immunity_ms = hm.immunity_ms_of(half)
            due_ms = immunity_ms if immunity_ms is not None else self.config.timeout_ms
            if age_ms < due_ms:
                if due_ms > self.config.timeout_ms:
                    # A long immunity would pin the offset for long: move the record to the end.
                    if self._resolver.put_back(half, check_times) is None:
                        return False
                    report.rewritten += 1
                    return True
                report.left += 1
                return False
            if not self._has_live_producer(entry.producer_group, entry.real_topic):
                group = entry.producer_group
                return self._visit_unreached(half, group, check_times, report, unreached_groups)
            copy = self._resolver.put_back(half, check_times + 1)
            if copy is None:
                return False
            self._ledger.apply(origin, TxInput.CHECK)
            copies.append(copy)
            report.checked += 1
            return True
        except ProtocolError as exc:
            log.error("skipping malformed half message %d: %s", half.queue_offset, exc)
            return True

    def _discard(self, half: rec.StoredMessage, report: PassReport) -> bool:
        """Discard a half message (its reason logged by the caller); False when the store
        refused, so it is left for a later pass."""
        if not self._resolver.discard(half):
            return False
        report.discarded += 1
        return True

    def _has_live_producer(self, group: str, topic: str) -> bool:
        return any(not connection.closed for connection in self._producers(group, topic))

    def _visit_unreached(
        self,
        half: rec.StoredMessage,
        group: str,
        check_times: int,
        report: PassReport,
        groups: set[str],
    ) -> bool:
        """A due transaction no producer of `group` can be asked about: put back uncounted (the
        group joins `groups`, logged once per pass), or discarded once
        transactionUnreachedCheckMax passes found nobody."""
        unreached = hm.unreached_checks_of(half)
        if unreached >= self.config.unreached_max:
            log.warning(
                "discarding transaction %d of %s: no live producer in %d check passes "
                "(transactionUnreachedCheckMax)",
                hm.origin_of(half),
                group,
                unreached,
            )
            return self._discard(half, report)
        if self._resolver.put_back(half, check_times, unreached + 1) is None:
            return False
        self._stats.check_no_producer += 1
        report.unreached += 1
        groups.add(group)
        return True

    def _visit_sink_half(
        self,
        half: rec.StoredMessage,
        now_ms: int,
        age_ms: int,
        check_times: int,
        report: PassReport,
    ) -> bool:
        """A Spark sink half: resolved from the batch records (batch.py). One that must wait
        pins the offset while young, then is rewritten at the queue's end each pass, as a long
        immunity is, so an idle query's orphans do not stall compaction for hours."""
        assert self._sink_batches is not None
        decided = self._sink_batches.decide_orphan(half, now_ms)
        if decided is None:
            return False
        if decided:
            report.resolved_sink += 1
            return True
        if age_ms < self.config.timeout_ms:
            report.left += 1
            return False
        if self._resolver.put_back(half, check_times) is None:
            return False
        report.rewritten += 1
        return True

    def _forget_removed(self) -> None:
        """Retention removed half records: their transactions can no longer be committed."""
        half_min = self._store.min_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        if half_min == self._half_min_seen:
            return
        self._half_min_seen = half_min
        for entry in self._ledger.drop_below(half_min):
            log.warning("transaction %d lost its half message to retention", entry.origin)
            self._stats.discarded += 1

    def _advance_op_offset(self, half_offset: int) -> int:
        """Move the op offset past ops stored before the half record at `half_offset`: every
        record of their transactions precedes them, hence precedes the half offset."""
        if half_offset < self._store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID):
            boundary = next(
                scan_queue(self._store, hm.HALF_TOPIC, half_offset, half_offset + 1), None
            )
            physical_limit = boundary.physical_offset if boundary is not None else -1
        else:
            physical_limit = self._store.max_physical_offset
        op_offset = start_offset(self._store, self._offsets, hm.OP_TOPIC)
        op_end = self._store.max_offset(hm.OP_TOPIC, hm.HALF_QUEUE_ID)
        op_end = min(op_end, op_offset + self.config.pass_messages_max)
        for op in scan_queue(self._store, hm.OP_TOPIC, op_offset, op_end):
            if op.physical_offset >= physical_limit:
                break
            op_offset = op.queue_offset + 1
        self._offsets.commit(TRANS_CHECK_GROUP, hm.OP_TOPIC, hm.HALF_QUEUE_ID, op_offset)
        return op_offset

    # -- the check request ---------------------------------------------------------------------

    async def _send_check(self, copy: rec.StoredMessage) -> None:
        props = copy.property_map()
        group = props.get(PGROUP, "")
        topic = props.get(REAL_TOPIC, "")
        connections = [c for c in self._producers(group, topic) if not c.closed]
        if connections:
            # Rotate per transaction, not per pass: each successive check of one transaction
            # starts at the next connection, so a connection a crashed producer left half-open
            # cannot absorb every check of a transaction (seed 293 of the simulation found it).
            turn = (hm.origin_of(copy) + hm.check_times_of(copy)) % len(connections)
            connections = connections[turn:] + connections[:turn]
        uniq = props.get(UNIQ_KEY)
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=copy.queue_offset,
            commit_log_offset=copy.physical_offset,
            msg_id=uniq,
            transaction_id=uniq,
            offset_msg_id=offset_msg_id(
                copy.store_host[0], copy.store_host[1], copy.physical_offset
            ),
        )
        body = hm.check_body(copy)
        for connection in connections:
            command = RemotingCommand(
                code=RequestCode.CHECK_TRANSACTION_STATE,
                ext_fields=header.to_fields(),
                body=body,
                language="JAVA",
            )
            try:
                await connection.oneway(command)
            except (ConnectionClosedError, OSError) as exc:
                log.info("check of %d to %s failed: %s", copy.queue_offset, connection, exc)
                continue
            self._stats.checked += 1
            return
        self._stats.check_no_producer += 1
        log.warning(
            "no live producer of group %r to check transaction %d (check %d)",
            group,
            hm.origin_of(copy),
            hm.check_times_of(copy),
        )
