"""Admin requests (remoting.md §4.12): topics (17, 21, 202, 215), broker config and runtime (26,
28), consumers (203, 208), and the tables a slave copies (slave_sync.py): all topic configs (21),
consumer offsets (43), delay offsets (45) and subscription groups (201).

The bodies of 43, 45 and 201 are RocketMQ's persisted files (consumerOffset.json,
delayOffset.json, subscriptionGroup.json with its dataVersion), with standard JSON's quoted keys
where fastjson writes `{0:12}` (fastjson reads both). TideMQ adds keys that fastjson and older
TideMQ slaves ignore (they read "offsetTable" only): 43 and 45 carry "tidemqLogOffset", this
broker's log end read before the table (a slave applies the copy once its log gets there,
broker/slave_sync.py), and 45 the timer wheel's watermarks under "tidemqTimerProgress"
(broker/timer.py). GET_BROKER_CONFIG never shows haSecret (config_keys.py redacts it).
Runtime info (28) carries the replication keys of ha_info.py.

Topic changes go through the TopicTable, whose change listener re-registers with the name
servers. A slave refuses the admin writes (17, 215) with SLAVE_NOT_AVAILABLE, as it refuses sends:
its tables are copies of its master's (slave_sync.py), replaced on the next copy round.
Bodies are what Java's fastjson writes for upstream's classes (rocketmq-exporter and the
dashboard read them): TopicStatsTable and ConsumeStats with MessageQueue object keys
(protocol/bodies_client.py), ConsumerConnection (203) from protocol/bodies_admin.py. consumeTps
(208) and runtime info's exporter keys (28: putTps, msgPutTotalTodayNow, ...) come from
BrokerStats (broker/stats.py, admin_ops.exporter_fields).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import date
from typing import Any

import orjson

from tidemq._version import __version__
from tidemq.broker.clients import ClientRegistry
from tidemq.broker.config import BrokerConfig
from tidemq.broker.config_file import render_config
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.handlers.admin_ops import (
    AdminOps,
    DayTotals,
    client_connection,
    exporter_fields,
)
from tidemq.broker.handlers.common import BrokerAddress, Refusal, guarded, slave_refusal_remark
from tidemq.broker.handlers.ha_info import HAFields
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.slave_sync import LOG_OFFSET_KEY
from tidemq.broker.stats import GROUP_GET_NUMS, BrokerStats
from tidemq.broker.timer import TIMER_PROGRESS_KEY
from tidemq.broker.topics import TOPIC_QUEUE_NUMS_MAX, TopicTable
from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.protocol.bodies import (
    ConsumeStats,
    KVTable,
    MessageQueue,
    OffsetWrapper,
    TopicConfig,
    TopicOffset,
    TopicStatsTable,
)
from tidemq.protocol.bodies_admin import ConsumerConnection
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from tidemq.protocol.headers_admin import TOPIC_FILTER_MULTI_TAG, TOPIC_FILTER_SINGLE_TAG
from tidemq.protocol.message import TBW102, Perm, is_system_topic, validate_group, validate_topic
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore


class AdminHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        address: BrokerAddress,
        clock: Clock,
        store: FileMessageStore,
        topics: TopicTable,
        offsets: ConsumerOffsetTable,
        clients: ClientRegistry,
        *,
        groups: SubscriptionGroupTable | None = None,
        delay_offsets: Callable[[], bytes] | None = None,
        timer_progress: Callable[[], dict[str, Any]] | None = None,
        ha_fields: HAFields | None = None,
        stats: BrokerStats | None = None,
    ) -> None:
        """`groups` and `delay_offsets` (the schedule's `to_json`) answer 201 and 45;
        `timer_progress` (the timer wheel's `progress_doc`) adds TideMQ's key to 45 for our
        slaves (broker/slave_sync.py); `ha_fields` adds the replication keys to runtime info
        (ha_info.py); `stats` consumeTps and the exporter's runtime keys. With `groups` and
        `stats`, the operations of admin_ops.py are served too."""
        self._config = config
        self._address = address
        self._clock = clock
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._clients = clients
        self._groups = groups
        self._delay_offsets = delay_offsets
        self._timer_progress = timer_progress
        self._ha_fields = ha_fields
        self._boot_ms = clock.now_ms()
        self._stats = stats
        self._day_totals = (
            DayTotals(stats, lambda: date.today().toordinal()) if stats is not None else None
        )

    def replace_config(self, config: BrokerConfig) -> None:
        """Settings changed at run time (UPDATE_BROKER_CONFIG, admin_ops.py)."""
        self._config = config

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.UPDATE_AND_CREATE_TOPIC, guarded(self.create_topic))
        table.register(RequestCode.GET_ALL_TOPIC_CONFIG, guarded(self.all_topic_config))
        table.register(RequestCode.GET_BROKER_CONFIG, guarded(self.broker_config))
        table.register(RequestCode.GET_BROKER_RUNTIME_INFO, guarded(self.runtime_info))
        table.register(RequestCode.GET_TOPIC_STATS_INFO, guarded(self.topic_stats))
        table.register(RequestCode.GET_CONSUME_STATS, guarded(self.consume_stats))
        table.register(RequestCode.GET_CONSUMER_CONNECTION_LIST, guarded(self.consumer_connections))
        table.register(RequestCode.DELETE_TOPIC_IN_BROKER, guarded(self.delete_topic))
        table.register(RequestCode.GET_ALL_CONSUMER_OFFSET, guarded(self.all_consumer_offsets))
        if self._delay_offsets is not None:
            table.register(RequestCode.GET_ALL_DELAY_OFFSET, guarded(self.all_delay_offsets))
        if self._groups is not None:
            table.register(
                RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, guarded(self.all_subscription_groups)
            )
        if self._groups is not None and self._stats is not None:
            AdminOps(
                self._config,
                self._store,
                self._topics,
                self._offsets,
                self._clients,
                self._groups,
                self._stats,
                now_ms=self._clock.now_ms,
                on_config=self.replace_config,
            ).register(table)

    # -- topics ------------------------------------------------------------------------------

    def _refuse_on_slave(self) -> None:
        """An admin write on a slave: its tables are its master's copies."""
        if self._config.is_slave:
            raise Refusal(
                ResponseCode.SLAVE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )

    async def create_topic(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        self._refuse_on_slave()
        header = CreateTopicRequestHeader.from_fields(request.ext_fields)
        try:
            validate_topic(header.topic)
        except ProtocolError as exc:
            raise Refusal(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        reserved = {TBW102, self._config.broker_cluster_name, self._config.broker_name}
        if is_system_topic(header.topic) or header.topic in reserved:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"the topic[{header.topic}] is conflict with system reserved words.",
            )
        for name, value in (
            ("readQueueNums", header.read_queue_nums),
            ("writeQueueNums", header.write_queue_nums),
        ):
            if not 0 <= value <= TOPIC_QUEUE_NUMS_MAX:
                raise Refusal(
                    ResponseCode.SYSTEM_ERROR, f"{name} {value} outside 0..{TOPIC_QUEUE_NUMS_MAX}"
                )
        if header.read_queue_nums == header.write_queue_nums == 0:
            # Nothing could be sent or consumed. (writeQueueNums 0 alone is a topic being
            # drained before deletion: its readers still read.)
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"topic {header.topic} needs at least one queue (readQueueNums and"
                " writeQueueNums are both 0)",
            )
        if header.topic_filter_type not in (TOPIC_FILTER_SINGLE_TAG, TOPIC_FILTER_MULTI_TAG):
            raise Refusal(
                ResponseCode.SYSTEM_ERROR, f"unknown topicFilterType {header.topic_filter_type}"
            )
        self._topics.put(
            TopicConfig(
                topic_name=header.topic,
                read_queue_nums=header.read_queue_nums,
                write_queue_nums=header.write_queue_nums,
                perm=header.perm & (Perm.READ | Perm.WRITE | Perm.INHERIT | Perm.PRIORITY),
                topic_filter_type=header.topic_filter_type,
                topic_sys_flag=header.topic_sys_flag,
                order=header.order,
            )
        )
        return request.response(ResponseCode.SUCCESS)

    async def delete_topic(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        self._refuse_on_slave()
        header = DeleteTopicRequestHeader.from_fields(request.ext_fields)
        if header.topic == TBW102 or is_system_topic(header.topic):
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"the topic[{header.topic}] is a system topic")
        self._topics.delete(header.topic)
        self._offsets.remove_topic(header.topic)
        self._store.delete_topic(header.topic)
        return request.response(ResponseCode.SUCCESS)

    async def all_topic_config(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self._topics.wrapper().to_json())

    async def topic_stats(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetTopicStatsInfoRequestHeader.from_fields(request.ext_fields)
        config = self._topics.get(header.topic)
        if config is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
        table: dict[MessageQueue, TopicOffset] = {}
        for queue_id in range(config.write_queue_nums):
            max_offset = self._store.max_offset(header.topic, queue_id)
            last = self._store.store_time_at(header.topic, queue_id, max_offset - 1)
            table[MessageQueue(header.topic, self._config.broker_name, queue_id)] = TopicOffset(
                min_offset=self._store.min_offset(header.topic, queue_id),
                max_offset=max_offset,
                last_update_timestamp=last or 0,
            )
        return request.response(
            ResponseCode.SUCCESS, body=TopicStatsTable(offset_table=table).to_json()
        )

    # -- consumers ---------------------------------------------------------------------------

    async def consume_stats(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetConsumeStatsRequestHeader.from_fields(request.ext_fields)
        group = header.consumer_group
        validate_group(group)  # the offset table's keys need legal names
        topics = [header.topic] if header.topic else sorted(self._offsets.topics_of_group(group))
        table: dict[MessageQueue, OffsetWrapper] = {}
        for topic in topics:
            config = self._topics.get(topic)
            if config is None:
                continue
            for queue_id in range(config.read_queue_nums):
                consumer = self._offsets.query(group, topic, queue_id)
                last = (
                    self._store.store_time_at(topic, queue_id, consumer - 1)
                    if consumer is not None and consumer > 0
                    else None
                )
                table[MessageQueue(topic, self._config.broker_name, queue_id)] = OffsetWrapper(
                    broker_offset=self._store.max_offset(topic, queue_id),
                    consumer_offset=consumer if consumer is not None else 0,
                    last_timestamp=last or 0,
                )
        tps = 0.0
        if self._stats is not None:
            tps = sum(self._stats.tps(GROUP_GET_NUMS, f"{topic}@{group}") for topic in topics)
        return request.response(
            ResponseCode.SUCCESS, body=ConsumeStats(offset_table=table, consume_tps=tps).to_json()
        )

    async def consumer_connections(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetConsumerConnectionListRequestHeader.from_fields(request.ext_fields)
        info = self._clients.consumer_group(header.consumer_group)
        if info is None or not info.channels:
            raise Refusal(
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group[{header.consumer_group}] not online",
            )
        body = ConsumerConnection(
            connection_set=[client_connection(chan) for chan in info.channels.values()],
            subscription_table=dict(info.subscriptions),
            consume_type=info.consume_type,
            message_model=info.message_model,
            consume_from_where=info.consume_from_where,
        )
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    async def all_consumer_offsets(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        # The log end first: every record an offset of the table points at is below it.
        extra = {LOG_OFFSET_KEY: self._store.max_physical_offset}
        return request.response(
            ResponseCode.SUCCESS, body=with_keys(self._offsets.to_json(), extra)
        )

    async def all_delay_offsets(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        assert self._delay_offsets is not None  # registered only with it
        # The log end first: every message re-stored by the progress is below it.
        extra: dict[str, Any] = {LOG_OFFSET_KEY: self._store.max_physical_offset}
        body = self._delay_offsets()
        if self._timer_progress is not None:
            extra[TIMER_PROGRESS_KEY] = self._timer_progress()
        return request.response(ResponseCode.SUCCESS, body=with_keys(body, extra))

    async def all_subscription_groups(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        assert self._groups is not None  # registered only with it
        return request.response(ResponseCode.SUCCESS, body=self._groups.to_json())

    # -- broker ------------------------------------------------------------------------------

    async def broker_config(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        text = render_config(self._config, comments=False)
        fields = {"version": self._topics.data_version.to_json().decode()}
        return request.response(ResponseCode.SUCCESS, fields, text.encode())

    async def runtime_info(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        now = self._clock.now_ms()
        table = {
            "brokerVersionDesc": f"TideMQ {__version__}",
            "brokerAddr": self._address.text,
            "bootTimestamp": str(self._boot_ms),
            "runtime": f"{(now - self._boot_ms) // 1000} s",
            "brokerRole": self._config.broker_role,
            "commitLogMaxOffset": str(self._store.max_physical_offset),
            "commitLogMinOffset": str(self._store.min_physical_offset),
            "commitLogFlushedOffset": str(self._store.flushed_physical_offset),
            "commitLogDiskRatio": f"{self._store.disk_usage_ratio_percent() / 100:.4f}",
            "topicCount": str(len(self._topics.names())),
            "consumerGroupCount": str(len(self._clients.consumer_groups())),
            "producerGroupCount": str(len(self._clients.producer_groups())),
            "pid": str(os.getpid()),
        }
        if self._stats is not None and self._day_totals is not None:
            table.update(exporter_fields(self._stats, self._store, self._day_totals))
        if self._ha_fields is not None:
            table.update(self._ha_fields())
        return request.response(ResponseCode.SUCCESS, body=KVTable(table=table).to_json())


def with_keys(body: bytes, extra: dict[str, Any]) -> bytes:
    """`body`, a JSON object as orjson writes it (compact), with `extra`'s keys after its own:
    RocketMQ's keys as they are, TideMQ's ignored by older parsers. Spliced rather than parsed
    again: 43's table can be large."""
    assert body.startswith(b"{"), body[:32]
    assert body.endswith(b"}"), body[-32:]
    tail = orjson.dumps(extra)
    if body == b"{}":
        return tail
    return body[:-1] + b"," + tail[1:]
