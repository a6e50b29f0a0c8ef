"""Consumer offsets and offset lookups: codes 14, 15 (§4.3) and 29, 30, 31, 32 (§4.7).

QUERY_CONSUMER_OFFSET for a group with no stored offset answers 0 when the queue still starts at
offset 0 (or is empty or unknown), so a new group on a young topic consumes from the beginning as
it does against Java; otherwise QUERY_NOT_FOUND (22), and the client applies its
consumeFromWhere. Every message counts as "in memory" here (Java also requires that).
"""

from __future__ import annotations

from tidemq.broker.handlers.common import guarded
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    EarliestMsgStoretimeResponseHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore

NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


class OffsetHandlers:
    def __init__(self, store: FileMessageStore, offsets: ConsumerOffsetTable) -> None:
        self._store = store
        self._offsets = offsets

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.QUERY_CONSUMER_OFFSET, guarded(self.query_consumer_offset))
        table.register(RequestCode.UPDATE_CONSUMER_OFFSET, guarded(self.update_consumer_offset))
        table.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, guarded(self.search_offset))
        table.register(RequestCode.GET_MAX_OFFSET, guarded(self.max_offset))
        table.register(RequestCode.GET_MIN_OFFSET, guarded(self.min_offset))
        table.register(RequestCode.GET_EARLIEST_MSG_STORETIME, guarded(self.earliest_time))

    async def query_consumer_offset(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = QueryConsumerOffsetRequestHeader.from_fields(request.ext_fields)
        offset = self._offsets.query(header.consumer_group, header.topic, header.queue_id)
        if offset is None:
            if self._store.min_offset(header.topic, header.queue_id) > 0:
                return request.response(ResponseCode.QUERY_NOT_FOUND, remark=NOT_FOUND_REMARK)
            offset = 0
        return request.response(
            ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset).to_fields()
        )

    async def update_consumer_offset(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = UpdateConsumerOffsetRequestHeader.from_fields(request.ext_fields)
        self._offsets.commit(
            header.consumer_group, header.topic, header.queue_id, header.commit_offset
        )
        return request.response(ResponseCode.SUCCESS)

    async def search_offset(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = SearchOffsetRequestHeader.from_fields(request.ext_fields)
        offset = self._store.offset_by_time(header.topic, header.queue_id, header.timestamp)
        return request.response(
            ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset).to_fields()
        )

    async def max_offset(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = GetMaxOffsetRequestHeader.from_fields(request.ext_fields)
        offset = self._store.max_offset(header.topic, header.queue_id)
        return request.response(
            ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset).to_fields()
        )

    async def min_offset(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = GetMinOffsetRequestHeader.from_fields(request.ext_fields)
        offset = self._store.min_offset(header.topic, header.queue_id)
        return request.response(
            ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset).to_fields()
        )

    async def earliest_time(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetEarliestMsgStoretimeRequestHeader.from_fields(request.ext_fields)
        timestamp = self._store.earliest_store_time(header.topic, header.queue_id)
        fields = EarliestMsgStoretimeResponseHeader(timestamp=timestamp).to_fields()
        return request.response(ResponseCode.SUCCESS, fields)
