"""Lookups by id or key: VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12), remoting.md §4.8."""

from __future__ import annotations

from typing import Final

from tidemq.broker.access import NO_ACL, AccessGate
from tidemq.broker.handlers.common import Refusal, guarded
from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.permissions import Perm
from tidemq.store.message_store import FileMessageStore

# A unique-key lookup names one message; Java caps it at 32 hits (duplicates from retries).
UNIQUE_KEY_QUERY_MAX: Final = 32
# Any key query: bounded so one request cannot make the broker read the whole index.
KEY_QUERY_MAX: Final = 64


class QueryHandlers:
    def __init__(self, store: FileMessageStore, clock: Clock, gate: AccessGate = NO_ACL) -> None:
        self._store = store
        self._clock = clock
        self._gate = gate

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.VIEW_MESSAGE_BY_ID, guarded(self.view_message))
        table.register(RequestCode.QUERY_MESSAGE, guarded(self.query_message))

    async def view_message(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = ViewMessageRequestHeader.from_fields(request.ext_fields)
        offset = header.offset
        record = self._store.read_record(offset, from_peer=True) if offset >= 0 else None
        if record is None:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {header.offset}"
            )
        if self._gate.enabled:
            # Under ACL: SUB on the record's own topic (a system topic: an admin's), the
            # topic not told to an account that may not read it.
            try:
                topic = rec.decode_record(record, verify_crc=False).topic
            except (CorruptRecordError, ProtocolError):
                raise Refusal(
                    ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
                ) from None
            self._gate.require(
                connection, request, topic, Perm.SUB, shown="the message at this offset"
            )
        return request.response(ResponseCode.SUCCESS, body=record)

    async def query_message(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = QueryMessageRequestHeader.from_fields(request.ext_fields)
        cap = UNIQUE_KEY_QUERY_MAX if header.unique_key_query else KEY_QUERY_MAX
        max_num = max(1, min(header.max_num, cap))
        records = self._store.query_by_key(
            header.topic, header.key, max_num, header.begin_timestamp, header.end_timestamp
        )
        fields = QueryMessageResponseHeader(
            index_last_update_timestamp=self._clock.now_ms(),
            index_last_update_phyoffset=self._store.max_physical_offset,
        ).to_fields()
        if not records:
            return request.response(
                ResponseCode.QUERY_NOT_FOUND,
                fields,
                remark=f"can not find message, maybe time range not correct (key {header.key})",
            )
        return request.response(ResponseCode.SUCCESS, fields, b"".join(records))
