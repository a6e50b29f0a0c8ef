"""PULL_MESSAGE (11): remoting.md §4.2.

    pre-checks (broker readable, group exists or auto-created and may consume, topic exists and is
    readable, 0 <= queueId < readQueueNums) ─▶ filter ─▶ store.get_messages ─▶ response code
    ─▶ 19 with SUSPEND: hold (pull_hold.py), then evaluate once more and answer

The filter comes from the request's `subscription` when the SUBSCRIPTION bit is set, else from the
group's heartbeat subscription (missing: 24; older than the request's subVersion: 25). Tag codes
are always recomputed from the expression text: C++ heartbeats carry atoi(tag) as codeSet. A SQL92
expression (enablePropertyFilter) is evaluated on each record that passes the tag-code sieve
(broker/filter/); a bad one is answered SUBSCRIPTION_PARSE_FAILED.

Store status → response code (§4.2 table):

    FOUND                                         0  SUCCESS, body = raw stored records
    NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE  21  if queueOffset != 0, else 19
    OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY      21  PULL_OFFSET_MOVED
    OFFSET_OVERFLOW_ONE                          19  PULL_NOT_FOUND (long-poll candidate)
    NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING     20  PULL_RETRY_IMMEDIATELY
    on a slave: OFFSET_OVERFLOW_BADLY, and       19  with nextBeginOffset = the requested offset,
      NO_MATCHED_LOGIC_QUEUE / NO_MESSAGE_IN_         held like OFFSET_OVERFLOW_ONE: the slave
      QUEUE with queueOffset != 0                     lags its master, the consumer's offset is
                                                      not wrong (RocketMQ's offsetCheckInSlave=
                                                      false); the replicated records wake it
    on a slave: OFFSET_TOO_SMALL                 21  as on a master (retention removed those)

Why 19 and not 20 for a slave that lags: official clients and PullConsumer pull again at once on
20, so with nextBeginOffset unchanged a consumer would spin against a slave whose master is down
(nothing arrives). 19 with SUSPEND is held (pull_hold.py), and the hold is woken only by a record
at or after the requested offset (records before it are skipped by one comparison each), so a
consumer at 1000 on a slave at 900 gets one answer when record 1000 arrives or at its timeout.

Every response, errors included, carries the four header fields (suggestWhichBrokerId,
nextBeginOffset, minOffset, maxOffset) as strings: C++ raises and ali-ons throws without them.
With the COMMIT_OFFSET bit the request's commitOffset is stored for the group as a side effect
(on a master only, as upstream: a slave's offsets are its master's copy, slave_sync.py).

suggestWhichBrokerId (replication, RocketMQ 4.x's rule):

    slave                                                   0 (read from the master when it is up)
    master, slaveReadEnable off                             0
    master, slaveReadEnable on, records found and the last  the group's whichBrokerWhenConsume-
      one starts more than accessMessageInMemoryMaxRatio %    Slowly (1): such reads miss the page
      of physical memory before the log's end                 cache and compete with the writes
    master, slaveReadEnable on, otherwise                   the group's brokerId (0)

A controller-mode master (issue 14) serves only records that end at or below `visible_end()`,
its confirm offset (every replica of the sync set has them): a pull at a record beyond it is
answered like one at the queue's end (19, held; store/get.py), and the VisibilityGate
(broker/visibility.py) wakes it once the confirm offset covers the record. Its every other
answer names the queue's visible end as max offset, and the COMMIT_OFFSET side effect is
bounded by it too (handlers/offsets.py: offsets past it may be reused after a failover).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.config import BrokerConfig
from tidemq.broker.filter import FilterRefused, SubscriptionFilter, build_filter
from tidemq.broker.groups import SubscriptionGroupConfig, SubscriptionGroupTable
from tidemq.broker.handlers.common import Refusal, guarded
from tidemq.broker.handlers.offsets import commit_clamped, queue_end
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.pull_hold import PullHoldService
from tidemq.broker.stats import BrokerStats
from tidemq.broker.topics import TopicTable
from tidemq.broker.trace import BrokerTrace
from tidemq.errors import ProtocolError
from tidemq.limits import PULL_MESSAGE_COUNT_MAX
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    PullSysFlag,
)
from tidemq.protocol.message import MASTER_BROKER_ID, Perm, validate_group, validate_topic
from tidemq.protocol.record import physical_offset_at
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import DispatchEvent, GetResult, GetStatus

log = logging.getLogger(__name__)

_FOUND: Final = ResponseCode.SUCCESS
_NOT_FOUND: Final = ResponseCode.PULL_NOT_FOUND
_RETRY: Final = ResponseCode.PULL_RETRY_IMMEDIATELY
_MOVED: Final = ResponseCode.PULL_OFFSET_MOVED

# Status → code; None means "21 unless the request asked for offset 0, then 19".
_STATUS_CODES: Final[dict[GetStatus, ResponseCode | None]] = {
    GetStatus.FOUND: _FOUND,
    GetStatus.NO_MATCHED_LOGIC_QUEUE: None,
    GetStatus.NO_MESSAGE_IN_QUEUE: None,
    GetStatus.OFFSET_TOO_SMALL: _MOVED,
    GetStatus.OFFSET_OVERFLOW_ONE: _NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: _MOVED,
    GetStatus.NO_MATCHED_MESSAGE: _RETRY,
    GetStatus.MESSAGE_WAS_REMOVING: _RETRY,
}
assert set(_STATUS_CODES) == set(GetStatus)
# A slave's 21s that mean "past what this slave holds yet" (answered 19 and held there).
_AHEAD_OF_SLAVE: Final = frozenset(
    {
        GetStatus.OFFSET_OVERFLOW_BADLY,
        GetStatus.NO_MESSAGE_IN_QUEUE,
        GetStatus.NO_MATCHED_LOGIC_QUEUE,
    }
)


def pull_response_code(status: GetStatus, requested_offset: int) -> ResponseCode:
    """The §4.2 mapping table as a function (tested exhaustively)."""
    code = _STATUS_CODES[status]
    if code is None:
        return _MOVED if requested_offset != 0 else _NOT_FOUND
    return code


def physical_memory_bytes() -> int:
    """The machine's physical memory (RocketMQ's totalPhysicalMemorySize); 0 if unknown."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def slave_read_lag_bytes(config: BrokerConfig, memory_bytes: int) -> int | None:
    """How far behind the log's end a pull may read before a master suggests its slave; None
    when it never does (a slave, or slaveReadEnable off, or the memory is unknown)."""
    if config.is_slave or not config.slave_read_enable or memory_bytes <= 0:
        return None
    return memory_bytes * config.access_message_in_memory_max_ratio_percent // 100


@dataclass(frozen=True, slots=True)
class _Evaluation:
    code: ResponseCode
    result: GetResult


class PullHandler:
    def __init__(
        self,
        config: BrokerConfig,
        store: FileMessageStore,
        topics: TopicTable,
        groups: SubscriptionGroupTable,
        offsets: ConsumerOffsetTable,
        clients: ClientRegistry,
        hold: PullHoldService,
        *,
        visible_end: Callable[[], int] | None = None,
        stats: BrokerStats | None = None,
        trace: BrokerTrace | None = None,
    ) -> None:
        """`visible_end`: the log offset records must end at or below to be served (None:
        every record; the module doc); `stats`: what served pulls are counted in."""
        self._stats = stats
        self._trace = trace  # message trace (broker/trace.py): None when off
        self._config = config
        self._store = store
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._clients = clients
        self._hold = hold
        self._visible_end = visible_end
        self._slave_read_lag = slave_read_lag_bytes(config, physical_memory_bytes())

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.PULL_MESSAGE, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        try:
            header = PullMessageRequestHeader.from_fields(request.ext_fields)
        except ProtocolError as exc:
            # No usable header: still answer with the four fields (zeros), as for any refusal.
            fields = PullMessageResponseHeader(next_begin_offset=0, min_offset=0, max_offset=0)
            raise Refusal(ResponseCode.SYSTEM_ERROR, str(exc), fields.to_fields()) from None
        try:
            group, tag_filter = self._check(connection, header)
        except Refusal as exc:
            # Error answers carry the four fields too (the clients read them unconditionally).
            exc.ext_fields = self._empty_fields(header)
            raise
        first = self._evaluate(header, tag_filter)
        flags = header.sys_flag
        if flags & PullSysFlag.COMMIT_OFFSET and self._config.is_master:
            commit_clamped(
                self._store,
                self._offsets,
                header.consumer_group,
                header.topic,
                header.queue_id,
                header.commit_offset,
                log_end=self._log_end(),
                trace=self._trace,
            )
        if first.code != _NOT_FOUND or not flags & PullSysFlag.SUSPEND:
            return self._response(request, first, group, header)
        timeout_ms = (
            header.suspend_timeout_millis
            if self._config.long_polling_enable
            else self._config.short_polling_ms
        )
        # No await between the empty read above and registering the hold: a dispatch on this
        # event loop cannot slip in between.
        await self._hold.hold(
            header.topic,
            header.queue_id,
            header.queue_offset,
            timeout_ms,
            lambda event: _arrival_matches(tag_filter, event),
            connection,
        )
        if connection.closed:
            return None
        return self._response(request, self._evaluate(header, tag_filter), group, header)

    def _check(
        self, connection: Connection, header: PullMessageRequestHeader
    ) -> tuple[SubscriptionGroupConfig, SubscriptionFilter]:
        """The group's config and the filter, after every check (a Refusal otherwise)."""
        if not Perm.is_readable(self._config.broker_permission):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self._config.broker_name}] pulling message is forbidden",
            )
        try:
            validate_topic(header.topic)
            validate_group(header.consumer_group)
        except ProtocolError as exc:
            raise Refusal(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        group = self._groups.lookup(header.consumer_group)  # pulls create no groups
        if group is None:
            raise Refusal(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{header.consumer_group}] does not exist",
            )
        if not group.consume_enable:
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"subscription group [{header.consumer_group}] is not allowed to consume",
            )
        topic_config = self._topics.get(header.topic)
        if topic_config is None:
            raise Refusal(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{header.topic}] not exist, apply first please!",
            )
        if not Perm.is_readable(topic_config.perm):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"the topic[{header.topic}] pulling message is forbidden",
            )
        if not 0 <= header.queue_id < topic_config.read_queue_nums:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                f"topicConfig.readQueueNums:[{topic_config.read_queue_nums}] "
                f"consumer:[{connection.peer_text}]",
            )
        if header.sys_flag & PullSysFlag.SUBSCRIPTION:
            return group, self._parse(header.subscription, header.expression_type)
        subscription = self._clients.subscription(header.consumer_group, header.topic)
        if subscription is None:
            raise Refusal(
                ResponseCode.SUBSCRIPTION_NOT_EXIST,
                f"the consumer's subscription of {header.topic} in group "
                f"{header.consumer_group} not exist",
            )
        if subscription.sub_version < header.sub_version:
            raise Refusal(
                ResponseCode.SUBSCRIPTION_NOT_LATEST,
                f"the consumer's subscription not latest ({subscription.sub_version} < "
                f"{header.sub_version})",
            )
        return group, self._parse(subscription.sub_string, subscription.expression_type)

    def _parse(self, expression: str | None, expression_type: str | None) -> SubscriptionFilter:
        try:
            return build_filter(
                expression, expression_type, sql_enabled=self._config.enable_property_filter
            )
        except FilterRefused as exc:
            raise Refusal(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None

    def _evaluate(
        self, header: PullMessageRequestHeader, tag_filter: SubscriptionFilter
    ) -> _Evaluation:
        count = max(1, min(header.max_msg_nums, PULL_MESSAGE_COUNT_MAX))
        predicate = tag_filter.predicate
        result = self._store.get_messages(
            header.topic,
            header.queue_id,
            header.queue_offset,
            count,
            tag_codes=tag_filter.codes,
            message_filter=predicate.matches_record if predicate is not None else None,
            phys_limit=self._log_end(),
        )
        code = pull_response_code(result.status, header.queue_offset)
        if code == _MOVED and self._config.is_slave and result.status in _AHEAD_OF_SLAVE:
            # A slave may only lag its master: an offset it does not hold yet is no reason to
            # move the consumer (RocketMQ's nextOffsetCorrection, offsetCheckInSlave=false). It
            # keeps the offset and waits for it like one past the end (held by `handle`); the
            # answer suggests the master. Below the slave's min it moves, as a master would.
            code = _NOT_FOUND
            result = dataclasses.replace(result, next_begin_offset=header.queue_offset)
        return _Evaluation(code, result)

    def _log_end(self) -> int | None:
        """The read limit now (`visible_end`), None without one."""
        visible_end = self._visible_end
        return visible_end() if visible_end is not None else None

    def _suggest(self, result: GetResult, group: SubscriptionGroupConfig) -> int:
        """suggestWhichBrokerId (the module doc's table)."""
        lag_max = self._slave_read_lag
        if lag_max is None:
            return MASTER_BROKER_ID
        if result.records:
            behind = self._store.max_physical_offset - physical_offset_at(result.records[-1])
            if behind > lag_max:
                return group.which_broker_when_consume_slowly
        return group.broker_id

    def _response(
        self,
        request: RemotingCommand,
        evaluation: _Evaluation,
        group: SubscriptionGroupConfig,
        header: PullMessageRequestHeader,
    ) -> RemotingCommand:
        result = evaluation.result
        fields = PullMessageResponseHeader(
            suggest_which_broker_id=self._suggest(result, group),
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        ).to_fields()
        if evaluation.code == _FOUND:
            body = b"".join(result.records)
            stats = self._stats
            if stats is not None:
                name, topic = header.consumer_group, header.topic
                stats.got(name, topic, len(result.records), len(body))
                stats.pulled(name, topic, header.queue_id, result.next_begin_offset)
            if self._trace is not None:
                self._trace.delivered(header.consumer_group, header.topic, result.records)
            return request.response(_FOUND, fields, body)
        remark = {
            _NOT_FOUND: "no new message",
            _RETRY: "no matched message",
            _MOVED: "the offset moved",
        }[evaluation.code]
        return request.response(evaluation.code, fields, remark=f"{remark} ({result.status.value})")

    def _empty_fields(self, header: PullMessageRequestHeader) -> dict[str, str]:
        try:
            min_offset = self._store.min_offset(header.topic, header.queue_id)
            max_offset = queue_end(self._store, header.topic, header.queue_id, self._log_end())
        except OSError:  # a consume-queue file that cannot be read must not hide the refusal
            min_offset = max_offset = 0
        return PullMessageResponseHeader(
            next_begin_offset=header.queue_offset, min_offset=min_offset, max_offset=max_offset
        ).to_fields()


def _arrival_matches(tag_filter: SubscriptionFilter, event: DispatchEvent) -> bool:
    return tag_filter.matches_code(event.tags_code) and tag_filter.matches_properties(
        event.properties
    )
