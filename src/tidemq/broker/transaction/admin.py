"""The TideMQ-private admin requests behind `tidemq tx list` and `tidemq tx stats`.

    TIDEMQ_TX_LIST (10001)   ext `limit` (optional, at most TX_LIST_ROWS_MAX)
        body {"inFlight": N, "transactions": [{"origin", "queueOffset", "topic",
              "producerGroup", "state", "ageMs", "checkTimes", "key"}, ...]}  (oldest first)
    TIDEMQ_TX_STATS (10002)
        body {"prepared", "committed", "rolled_back", "checked", "check_no_producer",
              "discarded", "duplicate_answers", "refused_answers", "in_flight"}

JSON bodies, as RocketMQ's admin answers; codes documented in ARCHITECTURE.md and codes.py.
"""

from __future__ import annotations

from typing import Final

import orjson

from tidemq.broker.handlers.common import Refusal, guarded
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import Clock
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable

# One answer lists at most this many transactions; `inFlight` tells how many there are.
TX_LIST_ROWS_MAX: Final = 1_000


class TransactionAdminHandlers:
    def __init__(self, ledger: TransactionLedger, stats: TransactionStats, clock: Clock) -> None:
        self._ledger = ledger
        self._stats = stats
        self._clock = clock

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.TIDEMQ_TX_LIST, guarded(self.tx_list))
        table.register(RequestCode.TIDEMQ_TX_STATS, guarded(self.tx_stats))

    async def tx_list(self, _connection: Connection, request: RemotingCommand) -> RemotingCommand:
        text = request.ext_fields.get("limit", "").strip() or str(TX_LIST_ROWS_MAX)
        if not text.isdigit():
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"limit is not a count: {text!r}")
        limit = min(int(text), TX_LIST_ROWS_MAX)
        now_ms = self._clock.now_ms()
        rows = [
            {
                "origin": p.origin,
                "queueOffset": p.queue_offset,
                "topic": p.real_topic,
                "producerGroup": p.producer_group,
                "state": p.state.value,
                "ageMs": now_ms - p.first_store_ms,
                "checkTimes": p.check_times,
                "key": p.key,
            }
            for p in self._ledger.pending_list()[:limit]
        ]
        body = orjson.dumps({"inFlight": self._ledger.in_flight, "transactions": rows})
        return request.response(ResponseCode.SUCCESS, body=body)

    async def tx_stats(self, _connection: Connection, request: RemotingCommand) -> RemotingCommand:
        body = orjson.dumps(self._stats.snapshot(self._ledger.in_flight))
        return request.response(ResponseCode.SUCCESS, body=body)
