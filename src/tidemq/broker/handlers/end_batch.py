"""TIDEMQ_END_BATCH (10003, TideMQ-private): the Spark sink driver ends one batch on this broker.

    header sinkId, batchId, commitOrRollback (8 COMMIT, 12 ROLLBACK, as END_TRANSACTION)
    body   JSON {"txns": ["<partition>/<attempt>", ...]} (at most BATCH_TXNS_MAX), and
           "final": true on a ROLLBACK that closes the batch for good (batch writes: every
           half of it, even one sent after the abort, rolls back; no COMMIT of it is accepted);
           on a COMMIT, "phase": "lookup" | "decide" | "commit" (the default), "brokers":
           {"<name>": "<addr>"} (the brokers holding halves of the decision) and, on a
           decide, "replace": true (swap an unpublished decision with other txns)

    slave? ─▶ SLAVE_NOT_AVAILABLE
    malformed header or body ─▶ SYSTEM_ERROR naming what is wrong
    lookup ─▶ the log end's durability awaited (below), then
        SUCCESS, body {"state": "NONE" | "DECIDED" | "COMMITTED", "txns", "brokers"}
    batch.py SinkBatchResolver.end_batch: record first (in the request's turn), then
    (commit, rollback) resolve the batch's halves in chunks, the loop running between them
    (batch_finish.py: a big batch no longer holds every other request for seconds); one run
    per batch: a repeat arriving meanwhile awaits it and answers its counts, its durability
    covering every message the run stored
        contradiction (COMMIT of rolled-back txns or with other txns than the decision,
        ROLLBACK of a decided batch) ─▶ TRANSACTION_FAILED with the reason (ext
        batchRolledBack=true when the COMMIT lists txns rolled back here)
        store refused ─▶ the put status's code
    durability awaited (durability.py, every role) of the record and committed messages, or
        for a repeat, which stores none, of the log end ─▶ when not achieved: FLUSH_DISK_TIMEOUT,
        FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE or (lease lost) SERVICE_NOT_AVAILABLE.
        Why a repeat waits: the record it repeats may not be durable. After a DECIDE answered
        FLUSH_SLAVE_TIMEOUT, a retry answered SUCCESS at once lets the driver publish on other
        brokers; a failover here to a replica without the record then rolls these halves back.
    SUCCESS, ext: alreadyCommitted (true|false), committed, rolledBack (halves resolved now)

The driver's two phases over every broker make a batch atomic across brokers (ARCHITECTURE.md,
"Batch ends for the exactly-once Spark sink").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import orjson

from tidemq.broker.access import NO_ACL, AccessGate
from tidemq.broker.config import BrokerConfig
from tidemq.broker.durability import WaitDurable
from tidemq.broker.handlers.common import (
    PUT_STATUS_CODES,
    Refusal,
    guarded,
    slave_refusal_remark,
)
from tidemq.broker.transaction.batch import (
    BATCH_TXNS_MAX,
    BatchOutcome,
    BatchPhase,
    BatchRefused,
    BatchState,
    Holders,
    SinkBatchResolver,
    parse_holders,
)
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndBatchRequestHeader
from tidemq.protocol.message import SysFlag
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.permissions import Perm as AclPerm

log = logging.getLogger(__name__)

_OUTCOMES: Final = {SysFlag.COMMIT: BatchOutcome.COMMIT, SysFlag.ROLLBACK: BatchOutcome.ROLLBACK}


@dataclass(frozen=True, slots=True)
class EndBatchBody:
    txns: frozenset[str]
    final: bool = False
    phase: BatchPhase = BatchPhase.PUBLISH
    holders: Holders = ()
    replace: bool = False


def parse_body(body: bytes | None) -> EndBatchBody:
    """The request body. Raises Refusal (SYSTEM_ERROR) naming the problem."""
    try:
        data = orjson.loads(body or b"{}")
        phase = BatchPhase(data.get("phase", BatchPhase.PUBLISH.value))
        txns = data["txns"] if phase is not BatchPhase.LOOKUP else data.get("txns", [])
        final = data.get("final", False)
        replace = data.get("replace", False)
        holders = parse_holders(data.get("brokers", {}))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise Refusal(
            ResponseCode.SYSTEM_ERROR, f'the body is not {{"txns": [...]}}: {exc}'
        ) from None
    if not isinstance(final, bool) or not isinstance(replace, bool):
        raise Refusal(ResponseCode.SYSTEM_ERROR, "final and replace must be true or false")
    if not isinstance(txns, list) or not all(isinstance(t, str) and t for t in txns):
        raise Refusal(ResponseCode.SYSTEM_ERROR, "txns must be a list of non-empty strings")
    if len(txns) > BATCH_TXNS_MAX:
        raise Refusal(ResponseCode.SYSTEM_ERROR, f"more than {BATCH_TXNS_MAX} txns in one batch")
    return EndBatchBody(frozenset(txns), final, phase, holders, replace)


def lookup_body(state: BatchState | None) -> bytes:
    """The answer to a lookup: the batch's COMMIT decision as this broker records it."""
    if state is None or state.committed is None:
        return orjson.dumps({"state": "NONE", "txns": [], "brokers": {}})
    return orjson.dumps(
        {
            "state": "COMMITTED" if state.published else "DECIDED",
            "txns": sorted(state.committed),
            "brokers": dict(state.holders),
        }
    )


class EndBatchHandler:
    def __init__(
        self,
        config: BrokerConfig,
        batches: SinkBatchResolver,
        wait_durable: WaitDurable,
        *,
        ledger: TransactionLedger | None = None,
        gate: AccessGate = NO_ACL,
    ) -> None:
        assert ledger is not None or not gate.enabled
        self._ledger = ledger
        self._gate = gate
        self._config = config
        self._batches = batches
        self._wait_durable = wait_durable

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.TIDEMQ_END_BATCH, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        if not self._config.is_master:
            raise Refusal(
                ResponseCode.SLAVE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )
        header = EndBatchRequestHeader.from_fields(request.ext_fields)
        outcome = _OUTCOMES.get(header.commit_or_rollback)
        if outcome is None:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"commitOrRollback {header.commit_or_rollback} is not 8 or 12",
            )
        if "/" in header.sink_id or header.batch_id < 0:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "sinkId may not hold '/'; batchId >= 0")
        body = parse_body(request.body)
        if body.final and outcome is not BatchOutcome.ROLLBACK:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "only a ROLLBACK can be final")
        if outcome is BatchOutcome.ROLLBACK and body.phase is not BatchPhase.PUBLISH:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "only a COMMIT has a phase")
        if outcome is BatchOutcome.COMMIT and body.phase is BatchPhase.LOOKUP:
            return await self._lookup(request, header)
        if self._gate.enabled:
            self._check_halves(connection, request, header)
        try:
            result = await self._batches.end_batch(
                header.sink_id,
                header.batch_id,
                outcome,
                body.txns,
                final=body.final,
                phase=body.phase,
                holders=body.holders,
                replace=body.replace,
            )
        except BatchRefused as exc:
            # batchRolledBack: this broker can never record that COMMIT (it rolled back txns
            # of it): a driver finishing an earlier attempt's decision decides its own instead.
            fields = {"batchRolledBack": "true"} if exc.rolled_back else None
            raise Refusal(ResponseCode.TRANSACTION_FAILED, str(exc), fields) from None
        if result.failure is not None:
            raise Refusal(
                PUT_STATUS_CODES.get(result.failure.status, ResponseCode.SYSTEM_ERROR),
                f"end batch not stored: {result.failure.status.value} "
                f"{result.failure.error}".rstrip(),
            )
        log.debug("end batch %s/%d %s: %s", header.sink_id, header.batch_id, outcome.value, result)
        fields = {
            "alreadyCommitted": "true" if result.already_committed else "false",
            "committed": str(result.committed),
            "rolledBack": str(result.rolled_back),
        }
        # A repeat's durable_end is the log end: the record it repeats may not be durable yet.
        code, remark = await self._wait_durable(result.durable_end)
        if code != ResponseCode.SUCCESS:
            return request.response(code, fields, remark=f"batch ended and {remark}")
        return request.response(ResponseCode.SUCCESS, fields)

    def _check_halves(
        self, connection: Connection, request: RemotingCommand, header: EndBatchRequestHeader
    ) -> None:
        """Under ACL: PUB on the real topic of every half of the batch this broker holds
        pending (those end_batch resolves, now or once published), refused before anything
        is recorded or resolved. The remark names no topic."""
        assert self._ledger is not None
        topics = set()
        for origin in self._batches.index.pending(header.sink_id, header.batch_id):
            entry = self._ledger.pending(origin)
            if entry is not None:  # gone: end_batch forgets it and resolves nothing
                topics.add(entry.real_topic)
        for topic in sorted(topics):
            self._gate.require(
                connection, request, topic, AclPerm.PUB, shown="a topic of the batch's messages"
            )

    async def _lookup(
        self, request: RemotingCommand, header: EndBatchRequestHeader
    ) -> RemotingCommand:
        """The batch's state, once the records it comes from are durable. The index is applied
        when a record is stored, before its durability is known: a DECIDE answered
        FLUSH_SLAVE_TIMEOUT is in it, and a replica that never got the record may become
        master. The log end read now covers every record the state comes from (its own end is
        not kept); awaiting it also fences a master whose lease is lost (durability.py)."""
        state = self._batches.lookup(header.sink_id, header.batch_id)
        code, remark = await self._wait_durable(self._batches.store.max_physical_offset)
        if code != ResponseCode.SUCCESS:
            return request.response(code, remark=f"batch state not durable: {remark}")
        return request.response(ResponseCode.SUCCESS, body=lookup_body(state))
