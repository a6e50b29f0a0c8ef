"""Batch-scoped ends of the exactly-once Spark sink: batch records, their index and the resolver.

A Spark sink task sends half messages tagged with the property __SPARKTXN# =
`<sinkId>/<batchId>/<partition>/<attempt>`; the driver ends the whole batch with TIDEMQ_END_BATCH
requests (handlers/end_batch.py). The batch's *record* is what makes that call durable and
idempotent, and it is stored BEFORE any half is acted on, so a crash mid-way is finished at
restart (`rebuild`):

    RMQ_SYS_TRANS_BATCH_TOPIC queue 0, one message per decision, body JSON:
        {"sinkId": "...", "batchId": 7, "outcome": "COMMIT" | "ROLLBACK", "txns": ["0/0-ab", ...],
         "brokers": {"broker-a": "host:port", ...}, "published": true | false}
        (+ "final": true on a ROLLBACK that closes the batch for good, see below)

A batch spread over several brokers is committed in two phases (ARCHITECTURE.md, "Batch ends"):
DECIDE stores a COMMIT record with `published: false` (the decision: its txns and the brokers
holding their halves) and resolves nothing; PUBLISH stores `published: true` and resolves the
halves. The driver publishes nowhere before every broker it asked has recorded the decision, so
a replay of the batch finds the decision on any of them (LOOKUP answers it) and finishes it
instead of committing its own, differently routed rows. A record without `published` (older
drivers) is a published COMMIT.

Per (sinkId, batchId) the index keeps the COMMIT decision (at most one; a DECIDE with `replace`
swaps an unpublished one, never a published one) and the txns rolled back (ROLLBACK records; a
later COMMIT of the same batch is accepted when it lists none of them, because a query restarted
from its checkpoint replays an aborted batch under the same id with new attempts). PUBLISH then
resolves every pending half of the batch through the ordinary resolver (resolution.py: state
table, op messages, exactly once): the listed txns commit, the rest roll back; ROLLBACK rolls
back every pending half of the batch. A repeated PUBLISH stores nothing new and answers "already
committed"; a PUBLISH or DECIDE with other txns than the decision is refused.

A *final* ROLLBACK closes the batch: no COMMIT of it is accepted afterwards and every half of
it, however late, is rolled back. The driver of a batch (non-streaming) write sends it: that
sink id is never replayed nor followed by a later batch, and the tasks Spark kills on an abort
may still be sending halves after the abort, so without it those halves would wait for the
orphan timeout. For the same reason it also closes a decision that is not published here (the
write's commit failed between decide and publish): nothing would ever publish it, and a decided
batch's halves never time out. A published batch refuses it.

Orphans (halves no END_BATCH resolved: failed attempts, writes landing after an abort) are never
checked back with a producer (Spark executors cannot answer): the check-back service asks
`decide_orphan`, which commits a half in its batch's published set, rolls it back when the batch
is published without it, when its txn was rolled back, when a later batch of the same sink is
recorded (micro-batches of one query are strictly ordered: the driver starts batch N+1 only once
every broker holding halves of N's decision published it) or, unless the batch is decided and
not yet published here, when it is older than the orphan timeout; otherwise it stays pending. A
decided batch's halves never time out: a replay may still publish that decision.

Memory: the last BATCH_RECORDS_PER_SINK_MAX batches per sink, BATCH_SINKS_MAX sinks (LRU); the
pending index holds one entry per live tagged half, so it is bounded by the ledger's
in-flight limit. A sink the LRU evicted is read back from its records on disk (the key index:
a record's KEYS is its sink id) when it is next asked about, so a replay still finds its
decision; records older than the commit log's retention are gone, and with them what they
decided (a replay after `fileReservedTime` decides anew).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Final

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.batch_finish import BatchDecision, BatchFinisher, FinishTally
from tidemq.broker.transaction.batch_index import (
    BATCH_RECORDS_PER_SINK_MAX,
    BATCH_SINKS_MAX,
    BatchIndex,
    BatchState,
)
from tidemq.broker.transaction.batch_record import (
    BATCH_QUEUE_ID,
    BATCH_TOPIC,
    BATCH_TXNS_MAX,
    BatchOutcome,
    BatchPhase,
    BatchRecord,
    Holders,
    SparkTxn,
    batch_record_message,
    decode_batch_record,
    encode_batch_record,
    parse_holders,
    parse_spark_txn,
    spark_txn_of,
)
from tidemq.broker.transaction.ledger import TransactionForgotten
from tidemq.broker.transaction.rebuild import scan_queue
from tidemq.broker.transaction.resolution import EndResult, TransactionResolver
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput
from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import SPARK_TXN
from tidemq.store.types import PutResult

log = logging.getLogger(__name__)

__all__ = [  # the record types live in batch_record.py; callers import them from here too
    "BATCH_QUEUE_ID",
    "BATCH_RECORDS_PER_SINK_MAX",
    "BATCH_SINKS_MAX",
    "BATCH_TOPIC",
    "BATCH_TXNS_MAX",
    "BatchEndResult",
    "BatchIndex",
    "BatchOutcome",
    "BatchPhase",
    "BatchRecord",
    "BatchRefused",
    "BatchState",
    "Holders",
    "SinkBatchResolver",
    "SparkTxn",
    "batch_record_message",
    "decode_batch_record",
    "encode_batch_record",
    "parse_holders",
    "parse_spark_txn",
    "spark_txn_of",
]

# Records read back from disk for a sink not in memory (evicted, or not seen since the start):
# its newest ones, enough for its last BATCH_RECORDS_PER_SINK_MAX batches (a decide and a
# publish each, plus rollbacks).
BATCH_RECORDS_RELOAD_MAX: Final = 4 * BATCH_RECORDS_PER_SINK_MAX
_FOREVER_MS: Final = 2**62


class BatchRefused(Exception):
    """The END_BATCH contradicts the batch's records (the remark says how). `rolled_back`: a
    COMMIT refused because this broker rolled back txns it lists (or the whole batch), so that
    decision can never be recorded here."""

    def __init__(self, remark: str, *, rolled_back: bool = False) -> None:
        super().__init__(remark)
        self.rolled_back = rolled_back


@dataclass(frozen=True, slots=True)
class BatchEndResult:
    already_committed: bool = False
    committed: int = 0
    rolled_back: int = 0
    durable_end: int = 0  # commit-log end to await before any SUCCESS (handlers/end_batch.py)
    failure: PutResult | None = None


class SinkBatchResolver:
    """Applies END_BATCH decisions and answers the check-back service about orphans."""

    def __init__(
        self,
        resolver: TransactionResolver,
        clock: Clock,
        *,
        orphan_timeout_ms: int,
        index: BatchIndex | None = None,
    ) -> None:
        assert orphan_timeout_ms > 0
        self._resolver = resolver
        self.store = resolver.store
        self._clock = clock
        self.orphan_timeout_ms = orphan_timeout_ms
        self.index = index if index is not None else BatchIndex()
        self._finisher = BatchFinisher(resolver, self.index.forget)
        self.store_host: tuple[str, int] = ("127.0.0.1", 0)

    def set_store_host(self, store_host: tuple[str, int]) -> None:
        self.store_host = store_host

    # -- halves ---------------------------------------------------------------------------------

    def on_prepare(self, origin: int, props: dict[str, str]) -> None:
        """A half message of transaction `origin` with `props` was stored: index it when it is
        tagged."""
        text = props.get(SPARK_TXN)
        if text is None:
            return
        try:
            tag = parse_spark_txn(text)
        except ProtocolError as exc:
            log.warning("half message of transaction %d: %s", origin, exc)
            return
        self.index.track(origin, tag)

    # -- END_BATCH ------------------------------------------------------------------------------

    def lookup(self, sink_id: str, batch_id: int) -> BatchState | None:
        """What this broker's records say about the batch (None: nothing recorded)."""
        self._remember(sink_id)
        return self.index.state(sink_id, batch_id)

    def _remember(self, sink_id: str) -> None:
        """Bring a sink the index does not hold (the LRU evicted it, or the start replayed
        more sinks than it keeps) back from its records on disk, found by the key index (a
        record's KEYS is its sink id). Without them a replay of its last batch would find no
        decision and publish its own rows beside the published ones, and a decided batch's
        halves would time out."""
        if self.index.knows(sink_id):
            return
        found: list[tuple[int, BatchRecord]] = []
        for data in self.store.query_by_key(
            BATCH_TOPIC, sink_id, BATCH_RECORDS_RELOAD_MAX, 0, _FOREVER_MS
        ):
            try:
                message = rec.decode_record(data)
                record = decode_batch_record(message.body)
            except ProtocolError as exc:
                log.warning("skipping a batch record of sink %s: %s", sink_id, exc)
                continue
            if record.sink_id == sink_id:
                found.append((message.queue_offset, record))
        found.sort(key=lambda item: item[0])
        self.index.restore(sink_id, [record for _, record in found])
        if found:
            log.info("sink %s: %d batch records read back from disk", sink_id, len(found))

    async def end_batch(
        self,
        sink_id: str,
        batch_id: int,
        outcome: BatchOutcome,
        txns: frozenset[str],
        *,
        final: bool = False,
        phase: BatchPhase = BatchPhase.PUBLISH,
        holders: Holders = (),
        replace: bool = False,
    ) -> BatchEndResult:
        """Record the decision (unless it repeats one), then, for PUBLISH and ROLLBACK, resolve
        the batch's pending halves: in chunks that let the loop run between them, one run per
        batch at a time (batch_finish.py). The record is stored, and what it decides read, in
        the calling turn, before any await. `final` (ROLLBACK only) closes the batch for good;
        `replace` (DECIDE only) swaps an unpublished decision with other txns.

        Raises BatchRefused when the decision contradicts the records.
        """
        recorded = self._record(sink_id, batch_id, outcome, txns, final, phase, holders, replace)
        if recorded.failure is not None:
            return recorded
        tally = await self._finisher.finish_shared(
            (sink_id, batch_id),
            lambda: self.index.pending(sink_id, batch_id),
            self._snapshot(sink_id, batch_id),
        )
        return self._merge(recorded, self._tally_result(tally))

    def _record(
        self,
        sink_id: str,
        batch_id: int,
        outcome: BatchOutcome,
        txns: frozenset[str],
        final: bool,
        phase: BatchPhase,
        holders: Holders,
        replace: bool,
    ) -> BatchEndResult:
        """Store the decision's record unless it repeats one: the result's durable_end covers
        it (a repeat: the log end, which covers the record it repeats, durable or not)."""
        assert not final or outcome is BatchOutcome.ROLLBACK
        assert phase is not BatchPhase.LOOKUP
        self._remember(sink_id)
        state = self.index.state(sink_id, batch_id)
        what = f"batch {batch_id} of sink {sink_id}"
        if outcome is BatchOutcome.ROLLBACK:
            record = self._rollback_record(state, sink_id, batch_id, txns, final, what)
        elif phase is BatchPhase.DECIDE:
            record = self._decide_record(state, sink_id, batch_id, txns, holders, replace, what)
        else:
            record = self._publish_record(state, sink_id, batch_id, txns, holders, what)
        if record is None:
            repeat = outcome is BatchOutcome.COMMIT and phase is BatchPhase.PUBLISH
            return BatchEndResult(
                already_committed=repeat, durable_end=self.store.max_physical_offset
            )
        put = self.store.put_message(
            batch_record_message(record, store_host=self.store_host, now_ms=self._clock.now_ms())
        )
        if not put.ok:
            return BatchEndResult(failure=put)
        self.index.apply(record)
        return BatchEndResult(durable_end=put.physical_offset + put.size)

    @staticmethod
    def _merge(recorded: BatchEndResult, finished: BatchEndResult) -> BatchEndResult:
        return dataclasses.replace(
            finished,
            already_committed=recorded.already_committed,
            durable_end=max(recorded.durable_end, finished.durable_end),
        )

    @staticmethod
    def _check_committable(state: BatchState | None, txns: frozenset[str], what: str) -> None:
        if state is not None and state.closed:
            raise BatchRefused(f"COMMIT refused: {what} was rolled back for good", rolled_back=True)
        if state is not None and txns & state.rolled_back:
            raise BatchRefused(
                f"COMMIT refused: {what} was rolled back, including "
                f"{sorted(txns & state.rolled_back)[:5]}",
                rolled_back=True,
            )

    def _decide_record(
        self,
        state: BatchState | None,
        sink_id: str,
        batch_id: int,
        txns: frozenset[str],
        holders: Holders,
        replace: bool,
        what: str,
    ) -> BatchRecord | None:
        """The DECIDE record to store; None when this decision is already recorded."""
        if state is not None and state.closed:
            raise BatchRefused(f"DECIDE refused: {what} was rolled back for good", rolled_back=True)
        if state is not None and state.committed is not None:
            if state.committed == txns:
                return None
            if state.published or not replace:
                raise BatchRefused(
                    f"DECIDE refused: {what} is {'committed' if state.published else 'decided'} "
                    f"with other txns ({len(state.committed)} txns on {dict(state.holders)})"
                )
            log.warning("%s: its unpublished decision is replaced by another", what)
        self._check_committable(state, txns, what)
        return BatchRecord(
            sink_id, batch_id, BatchOutcome.COMMIT, txns, holders=holders, published=False
        )

    def _publish_record(
        self,
        state: BatchState | None,
        sink_id: str,
        batch_id: int,
        txns: frozenset[str],
        holders: Holders,
        what: str,
    ) -> BatchRecord | None:
        """The PUBLISH record to store; None when the batch is already published with `txns`."""
        if state is not None and state.committed is not None:
            if state.committed != txns:
                raise BatchRefused(
                    f"COMMIT refused: {what} is {'committed' if state.published else 'decided'} "
                    f"with other txns ({len(state.committed)} txns on {dict(state.holders)}); "
                    "finish that decision (look it up first: a connector older than the "
                    "two-phase commit cannot, upgrade it)"
                )
            if state.published:
                return None
            holders = state.holders
        self._check_committable(state, txns, what)
        return BatchRecord(sink_id, batch_id, BatchOutcome.COMMIT, txns, holders=holders)

    def _rollback_record(
        self,
        state: BatchState | None,
        sink_id: str,
        batch_id: int,
        txns: frozenset[str],
        final: bool,
        what: str,
    ) -> BatchRecord | None:
        """The ROLLBACK record to store; None when everything it names is already rolled back.

        A final ROLLBACK (a batch write's abort) also closes an unpublished decision: that sink
        is never replayed, so nothing would ever publish it, and a decided batch's halves never
        time out."""
        if state is not None and state.committed is not None and (state.published or not final):
            raise BatchRefused(
                f"ROLLBACK refused: {what} is already "
                f"{'committed' if state.published else 'decided'}"
            )
        targets = txns | frozenset(self.index.pending(sink_id, batch_id).values())
        if state is not None and targets <= state.rolled_back and (state.closed or not final):
            return None
        return BatchRecord(sink_id, batch_id, BatchOutcome.ROLLBACK, targets, final)

    def _finish(self, sink_id: str, batch_id: int) -> BatchEndResult:
        """Resolve the pending halves of a recorded batch as its records say, all at once."""
        decision = self._snapshot(sink_id, batch_id)
        if decision.decides_nothing:
            return BatchEndResult()
        tally = self._finisher.finish(self.index.pending(sink_id, batch_id), decision.decide)
        return self._tally_result(tally)

    def _snapshot(self, sink_id: str, batch_id: int) -> BatchDecision:
        """What the records decide for the batch's halves now, kept for a whole finish."""
        self._remember(sink_id)
        state = self.index.state(sink_id, batch_id)
        return BatchDecision.of(state, self.index.batch_max(sink_id) > batch_id)

    @staticmethod
    def _tally_result(tally: FinishTally) -> BatchEndResult:
        if tally.failure is not None:
            return BatchEndResult(failure=tally.failure)
        return BatchEndResult(
            committed=tally.committed,
            rolled_back=tally.rolled_back,
            durable_end=tally.durable_end,
        )

    def _decision(self, sink_id: str, batch_id: int, txn: str) -> TxInput | None:
        """COMMIT, ROLLBACK or None (leave pending) for one half, from the records alone (the
        orphan timeout is decide_orphan's: `_timed_out`)."""
        self._remember(sink_id)
        state = self.index.state(sink_id, batch_id)
        superseded = self.index.batch_max(sink_id) > batch_id
        # None: decided, not yet published here (a replay may still publish it), or not recorded.
        return BatchDecision.of(state, superseded, copy=False).decide(txn)

    def _resolve(self, half: rec.StoredMessage, tx_input: TxInput) -> EndResult | None:
        """The resolver's result (a store refusal in `failure` keeps the half indexed, to be
        tried again); None when the ledger refused the answer."""
        origin = hm.origin_of(half)
        try:
            result = self._resolver.end(half, tx_input)
        except (IllegalStateTransition, TransactionForgotten) as exc:
            log.error("sink half %d not resolved (%s): %s", origin, tx_input.value, exc)
            self.index.forget(origin)
            return None
        if result.failure is None:
            self.index.forget(origin)
        return result

    # -- orphans (check-back) -------------------------------------------------------------------

    def owns(self, half: rec.StoredMessage) -> bool:
        """Whether `half` is a sink half (resolved here, never checked back)."""
        return SPARK_TXN in half.property_map()

    def decide_orphan(self, half: rec.StoredMessage, now_ms: int) -> bool | None:
        """Resolve a sink half nobody ended, if the records allow.

        Returns True when resolved, False when it must stay pending, None when the store
        refused the write (try again next pass).
        """
        try:
            tag = spark_txn_of(half)
        except ProtocolError as exc:
            log.error("sink half %d: %s; rolling it back", half.queue_offset, exc)
            tx_input: TxInput | None = TxInput.ROLLBACK
        else:
            assert tag is not None
            self.index.track(hm.origin_of(half), tag)
            tx_input = self._decision(tag.sink_id, tag.batch_id, tag.txn)
            if tx_input is None and self._timed_out(tag, now_ms - half.store_timestamp):
                if not self._record_timeout(tag):
                    return None
                tx_input = TxInput.ROLLBACK
        if tx_input is None:
            return False
        outcome = self._resolve(half, tx_input)
        if outcome is not None and outcome.failure is not None:
            return None
        log.info("orphan sink half %d: %s", half.queue_offset, tx_input.value)
        return True

    def _timed_out(self, tag: SparkTxn, age_ms: int) -> bool:
        """Whether a half the records leave pending has outlived the orphan timeout (never a
        half of a batch decided here: a replay may still publish it)."""
        state = self.index.state(tag.sink_id, tag.batch_id)
        if state is not None and state.committed is not None:
            return False
        return age_ms >= self.orphan_timeout_ms

    def _record_timeout(self, tag: SparkTxn) -> bool:
        """Store a ROLLBACK record of the timed-out txn before rolling its halves back (False:
        the store refused). This broker may hold halves of a decision it never recorded (it
        was down at the commit): the record makes a later DECIDE or PUBLISH of that decision
        here fail (`batchRolledBack`) instead of succeeding without the rows lost."""
        state = self.index.state(tag.sink_id, tag.batch_id)
        if state is not None and tag.txn in state.rolled_back:
            return True
        record = BatchRecord(tag.sink_id, tag.batch_id, BatchOutcome.ROLLBACK, frozenset({tag.txn}))
        put = self.store.put_message(
            batch_record_message(record, store_host=self.store_host, now_ms=self._clock.now_ms())
        )
        if not put.ok:
            log.error("orphan timeout of %s not recorded: %s", tag, put.error)
            return False
        self.index.apply(record)
        log.warning("%s outlived the orphan timeout, undecided here: rolled back", tag)
        return True

    # -- start ----------------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Read the batch records, index the pending tagged halves, and finish every recorded
        batch that still has pending halves (a crash between a record and its resolutions)."""
        start = self.store.min_offset(BATCH_TOPIC, BATCH_QUEUE_ID)
        end = self.store.max_offset(BATCH_TOPIC, BATCH_QUEUE_ID)
        records = 0
        # The batch topic has one queue, 0, as the half topic's (scan_queue reads queue 0).
        for message in scan_queue(self.store, BATCH_TOPIC, start, end):
            try:
                self.index.apply(decode_batch_record(message.body))
                records += 1
            except ProtocolError as exc:
                log.warning("skipping batch record at %d: %s", message.queue_offset, exc)
        for entry in self._resolver.ledger.pending_list():
            half = self._resolver.load_half(entry.physical_offset)
            if half is not None:
                self.on_prepare(entry.origin, half.property_map())
        finished = 0
        for sink_id, batch_id in self.index.pending_batches():
            result = self._finish(sink_id, batch_id)
            finished += result.committed + result.rolled_back
        log.info(
            "sink batches rebuilt: %d records, %d sinks, %d pending sink halves, %d finished",
            records,
            self.index.sinks,
            self.index.pending_count,
            finished,
        )
