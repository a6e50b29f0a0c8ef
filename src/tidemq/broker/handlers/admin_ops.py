"""Admin operations the dashboard and exporter use (§4.12), with upstream's bodies (bodies_admin):

- GET_PRODUCER_CONNECTION_LIST (204): the group's producer connections (ProducerConnection);
- QUERY_TOPIC_CONSUME_BY_WHO (300): groups with offsets for the topic plus online consumers
  subscribed to it (GroupList);
- VIEW_BROKER_STATS_DATA (315): minute/hour/day figures of BrokerStats (broker/stats.py);
- GET_CONSUMER_RUNNING_INFO (307): relayed to the client's connection (found by clientId in the
  ClientRegistry), its answer returned as it is; an unknown client is SYSTEM_ERROR "The Consumer
  <group> <clientId> not online", as upstream;
- INVOKE_BROKER_TO_RESET_OFFSET (222): per-queue offsets by timestamp (or, 5.x, one queue to an
  offset), written to the offset table (so a group with no consumer online restarts there), and
  sent to every live consumer of the group with RESET_CONSUMER_CLIENT_OFFSET (220, oneway, as
  upstream). A group with no offset for the topic on this broker is refused, as upstream's
  "THe consumer group <G> not exist" (a misspelt name must not create offsets for a phantom
  group); upstream refuses as soon as one queue lacks an offset, TideMQ only when all do (a queue
  the group has not reached yet takes the target). The queues are the topic's write queues, as
  upstream. The 220 body has two dialects (protocol/bodies_admin.py): a client whose heartbeat
  said language CPP gets the C++ client's list form, every other client fastjson's map form;
- QUERY_CONSUME_TIME_SPAN (303): per queue, its stored time range and the group's place in it
  (QueryConsumeTimeSpanBody), for the dashboard's consumer pages;
- DELETE_SUBSCRIPTIONGROUP (207): the group's config, and with cleanOffset (upstream's header
  field; older TideMQ wrote removeOffset, also read) its offsets;
- UPDATE_BROKER_CONFIG (25): body = properties text; only `LIVE_CONFIG_KEYS` are changed.

A slave refuses the writes (207, 222, 25) as admin.py does: its tables are its master's copies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from collections.abc import Callable
from typing import Final

from tidemq.broker.clients import ClientChannel, ClientRegistry
from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.config_keys import KEYS
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.handlers.common import Refusal, guarded, slave_refusal_remark
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.properties import parse_properties
from tidemq.broker.stats import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    STATS_NAMES,
    BrokerStats,
    StatsWindow,
)
from tidemq.broker.topics import TopicTable
from tidemq.errors import ClientError
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.bodies_admin import (
    BrokerStatsData,
    BrokerStatsItem,
    ClientConnection,
    GroupList,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
)
from tidemq.protocol.codes import VERSION_CURRENT, RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_admin import (
    DeleteSubscriptionGroupRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetProducerConnectionListRequestHeader,
    QueryConsumeTimeSpanRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore

log = logging.getLogger(__name__)

# How long the broker waits for a consumer's running info before answering SYSTEM_ERROR: shorter
# than Admin's 5 s call timeout, so the caller gets the remark naming the consumer, not its own
# timeout.
RUNNING_INFO_TIMEOUT_MS: Final = 3_000
# The language a C++ client's heartbeat carries (remoting LanguageCode name).
_CPP: Final = "CPP"

# UPDATE_BROKER_CONFIG changes only these keys (broker.conf key → its ConfigKey): settings
# whose one user reads them again on every use, so the change takes effect at once and whole.
# diskMaxUsedSpaceRatio: the store's disk-full check (store.config, read per write and cleanup).
# Any other key is refused, named in the remark, and nothing is applied: most settings are
# captured by the services built at start (flush intervals, transaction checks, message size
# limits of the send and replication paths), so changing the table would not change the broker.
# Not written to broker.conf: the broker is not told which file it was started from; the remark
# of the answer says so.
_LIVE_NAMES: Final = ("diskMaxUsedSpaceRatio",)
LIVE_CONFIG_KEYS: Final = {key.name: key for key in KEYS if key.name in _LIVE_NAMES}
assert len(LIVE_CONFIG_KEYS) == len(_LIVE_NAMES), "a run-time key missing from config_keys.KEYS"
_NOT_PERSISTED: Final = "applied until restart (not written to broker.conf)"


class AdminOps:
    def __init__(
        self,
        config: BrokerConfig,
        store: FileMessageStore,
        topics: TopicTable,
        offsets: ConsumerOffsetTable,
        clients: ClientRegistry,
        groups: SubscriptionGroupTable,
        stats: BrokerStats,
        *,
        now_ms: Callable[[], int],
        on_config: Callable[[BrokerConfig], None] | None = None,
    ) -> None:
        """`on_config` is told the settings after a run-time change (GET_BROKER_CONFIG shows
        them)."""
        self._config = config
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._clients = clients
        self._groups = groups
        self._stats = stats
        self._clock_ms = now_ms
        self._on_config = on_config
        # The RESET_CONSUMER_CLIENT_OFFSET writes under way, held so they are not collected; each
        # ends with its connection at the latest (a write waiting to drain fails on close).
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.GET_PRODUCER_CONNECTION_LIST, guarded(self.producers))
        table.register(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, guarded(self.consumed_by))
        table.register(RequestCode.VIEW_BROKER_STATS_DATA, guarded(self.view_stats))
        table.register(RequestCode.GET_CONSUMER_RUNNING_INFO, guarded(self.running_info))
        table.register(RequestCode.QUERY_CONSUME_TIME_SPAN, guarded(self.time_span))
        table.register(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, guarded(self.reset_offset))
        table.register(RequestCode.DELETE_SUBSCRIPTIONGROUP, guarded(self.delete_group))
        table.register(RequestCode.UPDATE_BROKER_CONFIG, guarded(self.update_config))

    def _refuse_on_slave(self) -> None:
        if self._config.is_slave:
            raise Refusal(
                ResponseCode.SLAVE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )

    # -- reads -------------------------------------------------------------------------------

    async def producers(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = GetProducerConnectionListRequestHeader.from_fields(request.ext_fields)
        channels = self._clients.producer_channels(header.producer_group)
        if not channels:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"the producer group[{header.producer_group}] not exist",
            )
        body = ProducerConnection([client_connection(chan) for chan in channels])
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    async def consumed_by(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = QueryTopicConsumeByWhoRequestHeader.from_fields(request.ext_fields)
        groups = self._offsets.groups_of_topic(header.topic)
        groups.update(self._clients.groups_subscribing(header.topic))
        return request.response(ResponseCode.SUCCESS, body=GroupList(sorted(groups)).to_json())

    async def view_stats(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = ViewBrokerStatsDataRequestHeader.from_fields(request.ext_fields)
        name, key = header.stats_name, header.stats_key
        if name not in STATS_NAMES or not self._stats.has(name, key):
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        windows = self._stats.window(name, key)
        body = BrokerStatsData(
            stats_minute=_item(windows.minute),
            stats_hour=_item(windows.hour),
            stats_day=_item(windows.day),
        )
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    async def running_info(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetConsumerRunningInfoRequestHeader.from_fields(request.ext_fields)
        channel = self._consumer_channel(header.consumer_group, header.client_id)
        if channel is None:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer <{header.consumer_group}> <{header.client_id}> not online",
            )
        relay = RemotingCommand(
            code=RequestCode.GET_CONSUMER_RUNNING_INFO,
            ext_fields=header.to_fields(),
            language="JAVA",
        )
        try:
            answer = await channel.connection.request(relay, RUNNING_INFO_TIMEOUT_MS)
        except (ClientError, OSError) as exc:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{header.consumer_group}> <{header.client_id}> failed: {exc}",
            ) from None
        return request.response(answer.code, body=answer.body, remark=answer.remark)

    async def time_span(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = QueryConsumeTimeSpanRequestHeader.from_fields(request.ext_fields)
        config = self._topics.get(header.topic)
        if config is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
        now = self._clock_ms()
        spans = [
            self._queue_span(header, queue_id, now) for queue_id in range(config.write_queue_nums)
        ]
        body = QueryConsumeTimeSpanBody(spans)
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    def _queue_span(
        self, header: QueryConsumeTimeSpanRequestHeader, queue_id: int, now_ms: int
    ) -> QueueTimeSpan:
        """As upstream: the queue's first and last store times, the store time of the last
        message the group consumed (its first message's when none), and how long the next one
        to consume has waited."""
        store, topic = self._store, header.topic
        high = store.max_offset(topic, queue_id)
        first = store.earliest_store_time(topic, queue_id)
        last = store.store_time_at(topic, queue_id, high - 1) or 0
        consumed = self._offsets.query(header.group, topic, queue_id)
        consumed_at = first
        if consumed is not None and consumed > 0:
            consumed_at = store.store_time_at(topic, queue_id, consumed - 1) or first
        delay = 0
        if consumed is not None and consumed < high:
            waiting_since = store.store_time_at(topic, queue_id, consumed)
            delay = now_ms - waiting_since if waiting_since is not None else 0
        return QueueTimeSpan(
            MessageQueue(topic, self._config.broker_name, queue_id),
            min_timestamp=first,
            max_timestamp=last,
            consume_timestamp=consumed_at,
            delay_time=max(delay, 0),
        )

    def _consumer_channel(self, group: str, client_id: str) -> ClientChannel | None:
        info = self._clients.consumer_group(group)
        if info is None:
            return None
        for channel in info.channels.values():
            if channel.client_id == client_id:
                return channel
        return None

    # -- writes ------------------------------------------------------------------------------

    async def reset_offset(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        self._refuse_on_slave()
        header = ResetOffsetRequestHeader.from_fields(request.ext_fields)
        config = self._topics.get(header.topic)
        if config is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
        if header.queue_id >= 0:
            if header.queue_id >= config.write_queue_nums:
                raise Refusal(
                    ResponseCode.SYSTEM_ERROR,
                    f"queueId {header.queue_id} outside 0..{config.write_queue_nums - 1}",
                )
            queue_ids = [header.queue_id]
        else:
            queue_ids = list(range(config.write_queue_nums))
        all_queues = range(config.write_queue_nums)
        if all(self._offsets.query(header.group, header.topic, q) is None for q in all_queues):
            raise Refusal(
                ResponseCode.SYSTEM_ERROR, f"THe consumer group <{header.group}> not exist"
            )
        table: dict[MessageQueue, int] = {}
        for queue_id in queue_ids:
            target = self._target_offset(header, queue_id)
            self._offsets.commit(header.group, header.topic, queue_id, target)
            table[MessageQueue(header.topic, self._config.broker_name, queue_id)] = target
        body = ResetOffsetBody(table)
        self._tell_consumers(header, body)
        log.info("offsets of %s on %s reset: %s", header.group, header.topic, table)
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    def _target_offset(self, header: ResetOffsetRequestHeader, queue_id: int) -> int:
        """Upstream's rule: the offset at the timestamp (-1: the end), kept only if forced or
        behind the group's committed offset; an explicit offset is clamped to the queue."""
        low = self._store.min_offset(header.topic, queue_id)
        high = self._store.max_offset(header.topic, queue_id)
        if header.offset is not None:
            return min(max(header.offset, low), high)
        if header.timestamp < 0:
            at_time = high
        else:
            at_time = self._store.offset_by_time(header.topic, queue_id, header.timestamp)
        committed = self._offsets.query(header.group, header.topic, queue_id)
        if header.is_force or committed is None or at_time < committed:
            return at_time
        return committed

    def _tell_consumers(self, header: ResetOffsetRequestHeader, body: ResetOffsetBody) -> None:
        info = self._clients.consumer_group(header.group)
        if info is None:
            return
        fields = ResetOffsetRequestHeader(
            topic=header.topic,
            group=header.group,
            timestamp=header.timestamp,
            is_force=header.is_force,
        ).to_fields()
        dialects: dict[bool, bytes] = {}  # list form? → body, each written once
        for channel in list(info.channels.values()):
            list_form = channel.language == _CPP
            if list_form not in dialects:
                dialects[list_form] = body.to_json(list_form=list_form)
            cmd = RemotingCommand(
                code=RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                ext_fields=dict(fields),
                body=dialects[list_form],
                language="JAVA",
            )
            task = asyncio.get_running_loop().create_task(_oneway(channel, cmd))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def delete_group(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        self._refuse_on_slave()
        header = DeleteSubscriptionGroupRequestHeader.from_fields(request.ext_fields)
        self._groups.delete(header.group_name)
        if header.clean_offset:
            self._offsets.remove_group(header.group_name)
        return request.response(ResponseCode.SUCCESS)

    async def update_config(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        self._refuse_on_slave()
        text = (request.body or b"").decode("utf-8", "replace")
        changes = dict(parse_properties(text))
        refused = sorted(key for key in changes if key not in LIVE_CONFIG_KEYS)
        if refused:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"not changeable at run time: {', '.join(refused)} (run-time keys:"
                f" {', '.join(sorted(LIVE_CONFIG_KEYS))}); change broker.conf and restart",
            )
        values = {}
        for key, value in changes.items():
            spec = LIVE_CONFIG_KEYS[key]
            try:
                values[spec.field] = spec.parse(value)
            except ValueError as exc:
                raise Refusal(ResponseCode.SYSTEM_ERROR, f"{key}={value!r}: {exc}") from None
        try:
            config = dataclasses.replace(self._config, **values)
        except ConfigError as exc:
            raise Refusal(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        self._store.config = dataclasses.replace(
            self._store.config,
            disk_max_used_space_ratio_percent=config.disk_max_used_space_ratio_percent,
        )
        self._config = config
        if self._on_config is not None:
            self._on_config(config)
        log.info("broker config changed at run time: %s", changes)
        return request.response(ResponseCode.SUCCESS, remark=_NOT_PERSISTED)


class DayTotals:
    """msgPut/GetTotal{TodayNow,TodayMorning,YesterdayMorning} of runtime info (the exporter
    reads them): counts since boot, and their values when the day (local time) last turned.

    The turn is noticed at the first read of a new day, so a "morning" value is the count at
    that read, not at midnight; a broker booted today reports 0 for its morning, which is exact
    (counters start at boot, as upstream's)."""

    def __init__(self, stats: BrokerStats, today: Callable[[], int]) -> None:
        self._stats = stats
        self._today = today
        self._day = today()
        self._today_morning = (0, 0)
        self._yesterday_morning = (0, 0)

    def fields(self) -> dict[str, str]:
        now = (self._stats.broker_put_nums, self._stats.broker_get_nums)
        day = self._today()
        if day != self._day:
            self._yesterday_morning = self._today_morning if day == self._day + 1 else now
            self._today_morning = now
            self._day = day
        return {
            "msgPutTotalTodayNow": str(now[0]),
            "msgGetTotalTodayNow": str(now[1]),
            "msgPutTotalTodayMorning": str(self._today_morning[0]),
            "msgGetTotalTodayMorning": str(self._today_morning[1]),
            "msgPutTotalYesterdayMorning": str(self._yesterday_morning[0]),
            "msgGetTotalYesterdayMorning": str(self._yesterday_morning[1]),
        }


def rates_text(stats: BrokerStats, name: str, key: str) -> str:
    """Upstream's "putTps"-style value: rates over 10 s, 1 min and 10 min, space separated. The
    10 s rate is the last sampling interval's, the minute's from the minute window, the 10 min
    one from the hour window's 10-minute samples."""
    windows = stats.window(name, key)
    ten_s = stats.last_interval_tps(name, key)
    return f"{ten_s:.2f} {windows.minute.tps:.2f} {windows.hour.tps:.2f}"


# Runtime-info keys rocketmq-exporter parses (BrokerRuntimeStats: it fails on a missing one)
# that measure Java thread pools, page-cache locks, the transient store pool or latency
# histograms: TideMQ has none of these (one event loop, no pools), so they read 0 ("null" for
# the distribution, which the exporter skips).
_ABSENT_IN_TIDEMQ: Final = {
    "sendThreadPoolQueueSize": "0",
    "sendThreadPoolQueueCapacity": "0",
    "sendThreadPoolQueueHeadWaitTimeMills": "0",
    "pullThreadPoolQueueSize": "0",
    "pullThreadPoolQueueCapacity": "0",
    "pullThreadPoolQueueHeadWaitTimeMills": "0",
    "queryThreadPoolQueueSize": "0",
    "queryThreadPoolQueueCapacity": "0",
    "queryThreadPoolQueueHeadWaitTimeMills": "0",
    "pageCacheLockTimeMills": "0",
    "remainTransientStoreBufferNumbs": "0",
    "dispatchMaxBuffer": "0",
    "dispatchBehindBytes": "0",
    "getMessageEntireTimeMax": "0",
    "putMessageEntireTimeMax": "0",
    "startAcceptSendRequestTimeStamp": "0",
    "earliestMessageTimeStamp": "0",
    "putMessageDistributeTime": "null",
    "getMissTps": "0.00 0.00 0.00",
}


def exporter_fields(
    stats: BrokerStats, store: FileMessageStore, totals: DayTotals
) -> dict[str, str]:
    """The runtime-info keys rocketmq-exporter reads, from BrokerStats and the store."""
    cluster = stats.cluster
    put_rates = rates_text(stats, BROKER_PUT_NUMS, cluster)
    get_rates = rates_text(stats, BROKER_GET_NUMS, cluster)
    usage = shutil.disk_usage(store.config.root_dir)
    puts = stats.broker_put_nums
    unflushed = max(store.max_physical_offset - store.flushed_physical_offset, 0)
    fields = dict(_ABSENT_IN_TIDEMQ)
    fields.update(totals.fields())
    fields.update(
        {
            "putTps": put_rates,
            "getTransferedTps": get_rates,
            "getFoundTps": get_rates,
            "getTotalTps": get_rates,
            "putMessageTimesTotal": str(puts),
            "putMessageSizeTotal": str(stats.size_sum),
            "putMessageAverageSize": f"{stats.size_sum / puts if puts else 0.0:.2f}",
            "remainHowManyDataToFlush": f"{unflushed} B",
            "commitLogDirCapacity": (
                f"Total : {usage.total / _GIB:.2f} GiB, Free : {usage.free / _GIB:.2f} GiB."
            ),
            "consumeQueueDiskRatio": f"{store.disk_usage_ratio_percent() / 100:.4f}",
            "brokerVersion": str(VERSION_CURRENT),
        }
    )
    return fields


_GIB: Final = 1024**3


def client_connection(channel: ClientChannel) -> ClientConnection:
    """One connection of a ConsumerConnection or ProducerConnection body."""
    return ClientConnection(
        client_id=channel.client_id,
        client_addr=channel.connection.peer_text,
        language=channel.language,
        version=channel.version,
    )


def _item(window: StatsWindow) -> BrokerStatsItem:
    return BrokerStatsItem(sum=window.sum, tps=window.tps, avgpt=window.avgpt)


async def _oneway(channel: ClientChannel, cmd: RemotingCommand) -> None:
    try:
        await channel.connection.oneway(cmd)
    except Exception as exc:
        log.info("could not tell %s of an offset reset: %s", channel.client_id, exc)
