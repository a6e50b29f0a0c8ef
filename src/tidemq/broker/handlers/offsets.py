"""Consumer offsets and offset lookups: codes 14, 15 (§4.3) and 29, 30, 31, 32 (§4.7).

QUERY_CONSUMER_OFFSET for a group with no stored offset answers 0 when the queue still starts at
offset 0 (or is empty or unknown), so a new group on a young topic consumes from the beginning as
it does against Java; otherwise QUERY_NOT_FOUND (22), and the client applies its
consumeFromWhere. Every message counts as "in memory" here (Java also requires that).

Commits are checked at this edge (names validated, the topic must exist, queueId below its queue
count) and the offset is clamped to the queue's [min, max]: the table is persisted and read back
by every consumer of the group, so one bad client must not be able to grow it or rewind others
past the log's start or beyond its end. On a slave the end is not clamped (the slave may lag
what the consumer read from the master) and the commit is remembered as pending: the slave's
next copies of its master's offsets keep it and push it to the master (broker/offsets.py).

A controller-mode master (issue 14, `visible_end`: its confirm offset) shows only the queue's
visible end (store ConsumeQueue.max_offset_within: past the last entry whose record ends at or
below it) as a queue's max offset, as the bound of commits and of time searches. The entries
past it are not on every replica: a failover may cut them off and write other records at their
queue offsets, which a group started, reset or committed there would skip.

    queue      | ... | k-1 | k | k+1 |        k-1 confirmed, k and k+1 not
    max offset             k            (GET_MAX_OFFSET, commit bound, time search bound)
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.broker.handlers.common import Refusal, guarded
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.topics import TopicTable
from tidemq.broker.trace import BrokerTrace
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
from tidemq.protocol.message import validate_group, validate_topic
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore

NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


def commit_clamped(
    store: FileMessageStore,
    offsets: ConsumerOffsetTable,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    lagging: bool = False,
    log_end: int | None = None,
    trace: BrokerTrace | None = None,
) -> bool:
    """Commit `offset` clamped to the queue's [min, max] (names and queue id already checked);
    with `log_end` (a controller-mode master's confirm offset), max is the visible end.

    `lagging`: a consumer's commit on a slave. The store is a copy, which may not hold yet what
    the consumer read from the master, so an offset past its end is kept as it is (clamping it
    would deliver those messages again); and the commit is pending until the master has it
    (broker/offsets.py: the slave's copies of the master's table keep it and push it there).
    `trace`: told the offsets it passes (message trace, broker/trace.py; None when off)."""
    if offset < 0:
        return offsets.commit(group, topic, queue_id, offset)  # ignored there, and logged
    offset = max(offset, store.min_offset(topic, queue_id))
    if not lagging:
        offset = min(offset, queue_end(store, topic, queue_id, log_end))
    if trace is not None:
        trace.acked(group, topic, queue_id, offsets.query(group, topic, queue_id), offset)
    return offsets.commit(group, topic, queue_id, offset, pending=lagging)


def queue_end(store: FileMessageStore, topic: str, queue_id: int, log_end: int | None) -> int:
    """The queue's max offset as a client may see it: the visible end under `log_end`."""
    if log_end is None:
        return store.max_offset(topic, queue_id)
    return store.visible_max_offset(topic, queue_id, log_end)


class OffsetHandlers:
    def __init__(
        self,
        store: FileMessageStore,
        offsets: ConsumerOffsetTable,
        topics: TopicTable,
        *,
        is_slave: bool = False,
        visible_end: Callable[[], int] | None = None,
        trace: BrokerTrace | None = None,
    ) -> None:
        """`is_slave`: commits past the store's end are kept (`commit_clamped`'s `lagging`).
        `visible_end`: a controller-mode master's confirm offset (None: no limit; module doc).
        `trace`: the message trace told of commits (None when off)."""
        self._trace = trace
        self._store = store
        self._offsets = offsets
        self._topics = topics
        self._is_slave = is_slave
        self._visible_end = visible_end

    def _log_end(self) -> int | None:
        visible_end = self._visible_end
        return visible_end() if visible_end is not None else None

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
        validate_topic(header.topic)
        validate_group(header.consumer_group)
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
        validate_topic(header.topic)
        validate_group(header.consumer_group)
        topic_config = self._topics.get(header.topic)
        if topic_config is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
        queue_nums = max(topic_config.read_queue_nums, topic_config.write_queue_nums)
        if not 0 <= header.queue_id < queue_nums:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal, topic[{header.topic}] has {queue_nums}",
            )
        commit_clamped(
            self._store,
            self._offsets,
            header.consumer_group,
            header.topic,
            header.queue_id,
            header.commit_offset,
            lagging=self._is_slave,
            log_end=self._log_end(),
            trace=self._trace,
        )
        return request.response(ResponseCode.SUCCESS)

    async def search_offset(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = SearchOffsetRequestHeader.from_fields(request.ext_fields)
        offset = self._store.offset_by_time(header.topic, header.queue_id, header.timestamp)
        log_end = self._log_end()
        if log_end is not None:
            offset = min(offset, queue_end(self._store, header.topic, header.queue_id, log_end))
        return request.response(
            ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset).to_fields()
        )

    async def max_offset(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = GetMaxOffsetRequestHeader.from_fields(request.ext_fields)
        offset = queue_end(self._store, header.topic, header.queue_id, self._log_end())
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
