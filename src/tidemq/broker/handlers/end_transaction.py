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
    SYNC_FLUSH ─▶ the committed message's flush is awaited (FLUSH_DISK_TIMEOUT when late)

Both the oneway (Java) and the request form (C++) are accepted; the remoting layer drops the
response of a oneway request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.common import PUT_STATUS_CODES, Refusal, guarded
from tidemq.broker.transaction.resolution import TransactionForgotten, TransactionResolver
from tidemq.broker.transaction.states import IllegalStateTransition, TxInput
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import PGROUP, SysFlag
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable

log = logging.getLogger(__name__)

_INPUTS: Final = {
    SysFlag.TRANSACTION_NOT: TxInput.UNKNOWN,
    SysFlag.COMMIT: TxInput.COMMIT,
    SysFlag.ROLLBACK: TxInput.ROLLBACK,
}

WaitFlushed = Callable[[int], Awaitable[bool]]


class EndTransactionHandler:
    def __init__(
        self, config: BrokerConfig, resolver: TransactionResolver, wait_flushed: WaitFlushed
    ) -> None:
        self._config = config
        self._resolver = resolver
        self._wait_flushed = wait_flushed

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.END_TRANSACTION, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        if not self._config.is_master:
            raise Refusal(
                ResponseCode.SLAVE_NOT_AVAILABLE,
                "the broker is a slave: end transaction is forbidden",
            )
        header = EndTransactionRequestHeader.from_fields(request.ext_fields)
        tx_input = _INPUTS.get(header.commit_or_rollback)
        if tx_input is None:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"commitOrRollback {header.commit_or_rollback} is not 0, 8 or 12",
            )
        source = "check-back answer" if header.from_transaction_check else "producer"
        if tx_input is TxInput.UNKNOWN:
            # Upstream answers nothing; a check-back will ask again.
            log.debug("%s of %s: state unknown (%s)", source, header.msg_id, request.remark)
            return None
        half = self._resolver.load_half(header.commit_log_offset)
        if half is None:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        if half.property_map().get(PGROUP) != header.producer_group:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != header.tran_state_table_offset:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        if half.physical_offset != header.commit_log_offset:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "The commit log offset wrong")
        try:
            result = self._resolver.end(half, tx_input)
        except IllegalStateTransition as exc:
            raise Refusal(
                ResponseCode.TRANSACTION_FAILED,
                f"{tx_input.value} refused for message {header.msg_id}: the transaction is "
                f"already {exc.state.value}",
            ) from None
        except TransactionForgotten:
            raise Refusal(
                ResponseCode.TRANSACTION_FAILED,
                f"{tx_input.value} refused for message {header.msg_id}: the transaction was "
                "resolved longer ago than the broker remembers outcomes",
            ) from None
        if result.failure is not None:
            raise Refusal(
                PUT_STATUS_CODES.get(result.failure.status, ResponseCode.SYSTEM_ERROR),
                f"{tx_input.value} not stored: {result.failure.status.value} "
                f"{result.failure.error}".rstrip(),
            )
        log.debug("%s of %s: %s", source, header.msg_id, result.state.value)
        stored = result.stored
        if stored is not None and not await self._wait_flushed(
            stored.physical_offset + stored.size
        ):
            return request.response(
                ResponseCode.FLUSH_DISK_TIMEOUT,
                remark=f"committed, but not flushed within {self._config.sync_flush_timeout_ms} ms",
            )
        return request.response(ResponseCode.SUCCESS)
