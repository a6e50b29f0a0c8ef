"""END_TRANSACTION (37): a producer's COMMIT, ROLLBACK or NOT for a half message (§4.11, §8).

    slave? ─▶ SLAVE_NOT_AVAILABLE
    commitOrRollback NOT (0) ─▶ no response at all (Java returns null; C++ waits in vain)
    half record at commitLogOffset? ─▶ else SYSTEM_ERROR "Find prepared transaction message failed"
    PGROUP == producerGroup, queue offset == tranStateTableOffset, physical offset matches
        ─▶ else SYSTEM_ERROR with the upstream remarks
    ledger (resolution.py): COMMIT stores the real message and an op message; ROLLBACK an op
        message; a repeat of the known outcome is SUCCESS and stores nothing; a contradiction
        (ROLLBACK after COMMIT, COMMIT after ROLLBACK or discard) is TRANSACTION_FAILED naming
        the outcome
    durability awaited (durability.py, every role) of the committed message, or of the log end
        when nothing tracks the end of the record that set the outcome (a ROLLBACK's op message,
        a repeat's earlier record, which may not be durable: a COMMIT answered
        FLUSH_SLAVE_TIMEOUT, repeated, must not read SUCCESS before it is) ─▶ when not achieved:
        FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE or (controller mode, lease
        lost) SERVICE_NOT_AVAILABLE, remark "<state>: <why>"

Both the oneway (Java, and our client) and the request form (C++) are accepted. Nobody reads the
answer to a oneway request (the remoting layer drops it), so a oneway answer that passes the
checks above is not resolved at once: it joins the *round* of the current loop turn, which
`TransactionResolver.end_many` stores once every request decoded in that turn has been handled
(one store call for the real messages, one op message per outcome), and its commit's
durability is not awaited. A failure is logged, as the refusal of a oneway request always is, and
the transaction stays pending until a check-back settles it, as if the request had been lost. A
request-form answer first stores the round (answers keep their arrival order) and then is
resolved on its own, so its response says what happened.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from tidemq.broker.access import NO_ACL, AccessGate
from tidemq.broker.config import BrokerConfig
from tidemq.broker.durability import WaitDurable
from tidemq.broker.handlers.common import (
    PUT_STATUS_CODES,
    Refusal,
    guarded,
    response_name,
    slave_refusal_remark,
)
from tidemq.broker.trace import BrokerTrace
from tidemq.broker.transaction.ledger import TransactionForgotten
from tidemq.broker.transaction.resolution import Answer, EndResult, TransactionResolver
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput
from tidemq.errors import ProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FLAG_ONEWAY, RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import PGROUP, REAL_TOPIC, SysFlag
from tidemq.protocol.names import RMQ_SYS_TRANS_HALF_TOPIC
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.permissions import Perm as AclPerm

log = logging.getLogger(__name__)

_INPUTS: Final = {
    SysFlag.TRANSACTION_NOT: TxInput.UNKNOWN,
    SysFlag.COMMIT: TxInput.COMMIT,
    SysFlag.ROLLBACK: TxInput.ROLLBACK,
}
# Oneway answers collected in one round; a full round is stored at once, so one loop turn's work
# and the round's memory stay bounded however many requests one read delivers.
END_ROUND_MAX: Final = 1_024


class EndTransactionHandler:
    def __init__(
        self,
        config: BrokerConfig,
        resolver: TransactionResolver,
        wait_durable: WaitDurable,
        gate: AccessGate = NO_ACL,
        trace: BrokerTrace | None = None,
    ) -> None:
        """`trace`: the message trace told of each answer that passed the checks (None: off)."""
        self._trace = trace
        self._gate = gate
        self._config = config
        self._resolver = resolver
        self._wait_durable = wait_durable
        # The oneway answers of this loop turn, with the message id and peer for the log.
        self._round: list[tuple[Answer, str, Connection]] = []

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.END_TRANSACTION, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        if not self._config.is_master:
            raise Refusal(
                ResponseCode.SLAVE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )
        header = EndTransactionRequestHeader.from_fields(request.ext_fields)
        tx_input = _INPUTS.get(header.commit_or_rollback)
        if tx_input is None:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"commitOrRollback {header.commit_or_rollback} is not 0, 8 or 12",
            )
        if tx_input is TxInput.UNKNOWN:
            # Upstream answers nothing; a check-back will ask again.
            log.debug(
                "%s of %s: state unknown (%s)", _source(header), header.msg_id, request.remark
            )
            return None
        answer = self._answer(header, tx_input)
        if self._gate.enabled:
            # Under ACL: PUB on the half's real topic, asked before the checks that would tell
            # the producer group or queue offset of someone else's half (the remark names
            # neither it nor its topic: a stranger learns only that a half is there, which
            # "Find prepared transaction message failed" tells anyone).
            self._gate.require(
                connection,
                request,
                answer.props.get(REAL_TOPIC) or RMQ_SYS_TRANS_HALF_TOPIC,
                AclPerm.PUB,
                shown="the transaction's topic",
            )
        self._check_answer(header, answer)
        if self._trace is not None:
            self._trace.ended(header, answer.props, tx_input)
        if request.flag & FLAG_ONEWAY:
            self._join_round(answer, header.msg_id, connection)
            return None
        self.store_round()
        (result,) = self._resolver.end_many([answer])
        if isinstance(result, Exception):
            raise _refusal(result, tx_input, header.msg_id)
        if result.failure is not None:
            raise _failure_refusal(result, tx_input)
        log.debug("%s of %s: %s", _source(header), header.msg_id, result.state.value)
        # A repeat or a ROLLBACK tracks no end: the log end covers the record that set the state.
        stored = result.stored
        end = (
            self._resolver.store.max_physical_offset
            if stored is None
            else stored.physical_offset + stored.size
        )
        code, remark = await self._wait_durable(end)
        if code != ResponseCode.SUCCESS:
            return request.response(code, remark=f"{result.state.value}: {remark}")
        return request.response(ResponseCode.SUCCESS)

    def _answer(self, header: EndTransactionRequestHeader, tx_input: TxInput) -> Answer:
        """The answer about the half record the header names (SYSTEM_ERROR when none)."""
        answer = self._resolver.answer_at(header.commit_log_offset, tx_input)
        if answer is None:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        return answer

    @staticmethod
    def _check_answer(header: EndTransactionRequestHeader, answer: Answer) -> None:
        """The upstream checks of the header against the half it names."""
        if answer.props.get(PGROUP) != header.producer_group:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if answer.queue_offset != header.tran_state_table_offset:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        if answer.physical_offset != header.commit_log_offset:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The commit log offset wrong")

    # -- the round of oneway answers ---------------------------------------------------------

    def _join_round(self, answer: Answer, msg_id: str, peer: Connection) -> None:
        if not self._round:
            # Runs after the read callbacks already queued in this loop turn, so one round
            # takes every END_TRANSACTION they decode, from every connection.
            asyncio.get_running_loop().call_soon(self._store_scheduled)
        self._round.append((answer, msg_id, peer))
        if len(self._round) >= END_ROUND_MAX:
            self.store_round()

    def _store_scheduled(self) -> None:
        try:
            self.store_round()
        except Exception:
            # A callback boundary: the round's transactions stay pending (a check-back settles
            # them, as if their END had been lost); the next round starts afresh.
            log.exception("storing a round of END_TRANSACTION answers failed")

    def store_round(self) -> None:
        """Resolve the collected oneway answers now (also run by the loop after their turn)."""
        answers, self._round = self._round, []
        if not answers:
            return
        results = self._resolver.end_many([answer for answer, _, _ in answers])
        for (answer, msg_id, peer), result in zip(answers, results, strict=True):
            if isinstance(result, EndResult) and result.failure is None:
                continue
            refusal = (
                _refusal(result, answer.tx_input, msg_id)
                if isinstance(result, Exception)
                else _failure_refusal(result, answer.tx_input)
            )
            log.warning(
                "END_TRANSACTION (oneway) from %s refused with %s: %s",
                peer.peer_text,
                response_name(refusal.code),
                refusal.remark,
            )


def _source(header: EndTransactionRequestHeader) -> str:
    return "check-back answer" if header.from_transaction_check else "producer"


def _refusal(error: Exception, tx_input: TxInput, msg_id: str) -> Refusal:
    """The answer to an END that `end_many` refused with `error`."""
    if isinstance(error, IllegalStateTransition):
        return Refusal(
            ResponseCode.TRANSACTION_FAILED,
            f"{tx_input.value} refused for message {msg_id}: the transaction is already "
            f"{error.state.value}",
        )
    if isinstance(error, TransactionForgotten):
        return Refusal(
            ResponseCode.TRANSACTION_FAILED,
            f"{tx_input.value} refused for message {msg_id}: the transaction was resolved "
            "longer ago than the broker remembers outcomes",
        )
    if isinstance(error, ProtocolError):
        return Refusal(ResponseCode.SYSTEM_ERROR, str(error))
    raise error


def _failure_refusal(result: EndResult, tx_input: TxInput) -> Refusal:
    failure = result.failure
    assert failure is not None
    return Refusal(
        PUT_STATUS_CODES.get(failure.status, ResponseCode.SYSTEM_ERROR),
        f"{tx_input.value} not stored: {failure.status.value} {failure.error}".rstrip(),
    )
