"""Admin requests about groups, connections, broker settings and statistics: the half of `Admin`
(client/admin.py) the dashboard and the console need beyond topics and messages.

Which brokers are asked, as upstream's MQAdminExt:

- a consumer group's data (connections, running info) lives on the brokers its consumers
  heartbeat to: those of the group's retry topic, else every master (`_group_brokers`);
- a topic's (who consumes it, offset resets, queries by time) on the brokers of its route;
- group configs (delete, list) on every master of a cluster.

Offset resets go to the masters of the topic (INVOKE_BROKER_TO_RESET_OFFSET): each broker writes
the offsets and tells the group's live consumers (RESET_CONSUMER_CLIENT_OFFSET), so a reset works
with or without consumers online. `resend_message` stores a copy of one message into the group's
retry topic with upstream's retry properties (RETRY_TOPIC = the original topic, ORIGIN_MESSAGE_ID),
which only that group's consumers read (they subscribe to %RETRY%group on their own) — also for a
message of the group's DLQ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tidemq.errors import (
    BrokerError,
    ClientError,
    NoRouteError,
    ProtocolError,
    error_for_code,
)
from tidemq.protocol import message as pm
from tidemq.protocol._json import load_object
from tidemq.protocol.bodies import ClusterInfo, MessageQueue, TopicRouteData
from tidemq.protocol.bodies_admin import (
    BrokerStatsData,
    ConsumerConnection,
    ConsumerRunningInfo,
    GroupList,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_admin import (
    DeleteSubscriptionGroupRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetProducerConnectionListRequestHeader,
    QueryConsumeTimeSpanRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from tidemq.protocol.headers_query import OffsetResponseHeader, SearchOffsetRequestHeader
from tidemq.protocol.headers_send import (
    PullMessageRequestHeader,
    PullSysFlag,
    SendMessageRequestHeader,
)
from tidemq.protocol.record import decode_records

from .instance import ClientInstance
from .message import MessageExt

# The producer group resent messages are stored under (upstream's tools use TOOLS_CONSUMER and
# CLIENT_INNER_PRODUCER for the same purpose).
RESEND_PRODUCER_GROUP: Final = "CLIENT_INNER_PRODUCER"
# The group of the pulls `query_messages_by_time` reads with (they commit no offset).
QUERY_CONSUMER_GROUP: Final = "TOOLS_CONSUMER"
# Pull answers that only mean "no message there (any more)": a range read ends at them.
_NOTHING_MORE: Final = frozenset(
    {
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)


def parse_properties_text(text: str) -> dict[str, str]:
    """GET_BROKER_CONFIG's body: `key=value` lines (comments and blanks skipped)."""
    table: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        if sep:
            table[key.strip()] = value.strip()
    return table


def checked(response: RemotingCommand) -> RemotingCommand:
    """`response` if it is a success, else its code's error raised (Admin's answers too)."""
    if response.code != ResponseCode.SUCCESS:
        raise error_for_code(response.code, response.remark)
    return response


class GroupAdmin:
    """Mixed into `Admin`, which provides the instance, the timeout and the lookups below."""

    _instance: ClientInstance
    timeout_ms: float

    async def _broker(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        raise NotImplementedError  # Admin's

    async def master_addresses(self, cluster: str | None = None) -> list[str]:
        raise NotImplementedError  # Admin's

    async def cluster_info(self) -> ClusterInfo:
        raise NotImplementedError  # Admin's

    def _read_addresses(self, route: TopicRouteData) -> dict[str, str]:
        raise NotImplementedError  # Admin's

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        raise NotImplementedError  # Admin's

    async def query_message_by_key(
        self, topic: str, key: str, *, unique_key: bool = False
    ) -> list[MessageExt]:
        raise NotImplementedError  # Admin's

    # -- plumbing ----------------------------------------------------------------------------

    async def _ask(self, addr: str, code: int, fields: Mapping[str, str]) -> RemotingCommand:
        return await self._broker(addr, RemotingCommand(code=code, ext_fields=dict(fields)))

    async def _route_or_none(self, topic: str) -> TopicRouteData | None:
        """`topic`'s route, or None when the name server knows no such topic."""
        try:
            return await self._instance.fetch_route(topic)
        except BrokerError as exc:
            if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            return None

    async def _group_brokers(self, group: str) -> list[str]:
        """Where the group's consumers heartbeat: its retry topic's brokers, else every master."""
        route = await self._route_or_none(pm.retry_topic(group))
        if route is not None:
            addrs = sorted(set(self._read_addresses(route).values()))
            if addrs:
                return addrs
        return await self.master_addresses()

    async def _topic_masters(self, topic: str) -> dict[str, str]:
        """broker name → master address, for the brokers of `topic`'s route."""
        route = await self._instance.fetch_route(topic)
        names = sorted({broker.broker_name for broker in route.broker_datas})
        return {name: self._instance.master_address(name) for name in names}

    # -- broker settings and statistics ------------------------------------------------------

    async def broker_config(self, addr: str) -> dict[str, str]:
        """The broker's settings (GET_BROKER_CONFIG), key → value; secrets redacted."""
        response = checked(await self._ask(addr, RequestCode.GET_BROKER_CONFIG, {}))
        return parse_properties_text(response.body.decode("utf-8", "replace"))

    async def update_broker_config(self, addr: str, changes: Mapping[str, str]) -> None:
        """UPDATE_BROKER_CONFIG: the broker applies only settings it can change while running
        and refuses the whole change otherwise (its remark names the keys).

        Raises:
            BrokerError: refused.
        """
        body = "".join(f"{key}={value}\n" for key, value in changes.items()).encode()
        cmd = RemotingCommand(code=RequestCode.UPDATE_BROKER_CONFIG, body=body)
        checked(await self._broker(addr, cmd))

    async def broker_stats(self, addr: str, stats_name: str, stats_key: str) -> BrokerStatsData:
        """VIEW_BROKER_STATS_DATA: minute/hour/day figures of one statistic (TOPIC_PUT_NUMS by
        topic, GROUP_GET_NUMS by "topic@group", BROKER_PUT_NUMS by cluster, ...).

        Raises:
            SystemErrorError: the broker has no such figures."""
        header = ViewBrokerStatsDataRequestHeader(stats_name=stats_name, stats_key=stats_key)
        response = await self._ask(addr, RequestCode.VIEW_BROKER_STATS_DATA, header.to_fields())
        return BrokerStatsData.from_json(checked(response).body)

    # -- connections -------------------------------------------------------------------------

    async def producer_connections(
        self, group: str, topic: str | None = None
    ) -> ProducerConnection:
        """The producers of `group` connected to the brokers of `topic` (every master when
        None), merged.

        Raises:
            BrokerError: no broker knows the group (the last refusal)."""
        if topic is not None:
            addrs = sorted(set((await self._topic_masters(topic)).values()))
        else:
            addrs = await self.master_addresses()
        header = GetProducerConnectionListRequestHeader(producer_group=group)
        seen: set[tuple[str, str]] = set()
        connections = []
        error: BrokerError | None = None
        for addr in addrs:
            response = await self._ask(
                addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, header.to_fields()
            )
            if response.code != ResponseCode.SUCCESS:
                error = error_for_code(response.code, response.remark)
                continue
            for conn in ProducerConnection.from_json(response.body).connection_set:
                if (conn.client_id, conn.client_addr) not in seen:
                    seen.add((conn.client_id, conn.client_addr))
                    connections.append(conn)
        if not connections and error is not None:
            raise error
        return ProducerConnection(connections)

    async def consumer_connections(self, group: str) -> ConsumerConnection:
        """The group's consumers (GET_CONSUMER_CONNECTION_LIST), merged over its brokers.

        Raises:
            ConsumerNotOnlineError: no broker has a consumer of the group."""
        header = GetConsumerConnectionListRequestHeader(consumer_group=group)
        merged: ConsumerConnection | None = None
        seen: set[tuple[str, str]] = set()
        error: BrokerError | None = None
        for addr in await self._group_brokers(group):
            response = await self._ask(
                addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, header.to_fields()
            )
            if response.code != ResponseCode.SUCCESS:
                error = error_for_code(response.code, response.remark)
                continue
            part = ConsumerConnection.from_json(response.body)
            if merged is None:
                merged = ConsumerConnection(
                    [],
                    dict(part.subscription_table),
                    part.consume_type,
                    part.message_model,
                    part.consume_from_where,
                )
            merged.subscription_table.update(part.subscription_table)
            for conn in part.connection_set:
                if (conn.client_id, conn.client_addr) not in seen:
                    seen.add((conn.client_id, conn.client_addr))
                    merged.connection_set.append(conn)
        if merged is None:
            raise error or error_for_code(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        return merged

    async def consumer_running_info(self, group: str, client_id: str) -> ConsumerRunningInfo:
        """What one consumer reports about itself (GET_CONSUMER_RUNNING_INFO, relayed by a
        broker it is connected to).

        Raises:
            SystemErrorError: the consumer is not online on any broker of the group."""
        header = GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client_id)
        error: BrokerError | None = None
        for addr in await self._group_brokers(group):
            response = await self._ask(
                addr, RequestCode.GET_CONSUMER_RUNNING_INFO, header.to_fields()
            )
            if response.code == ResponseCode.SUCCESS:
                return ConsumerRunningInfo.from_json(response.body)
            error = error_for_code(response.code, response.remark)
        raise error or ClientError(f"no broker for consumer group {group}")

    async def topic_consumers(self, topic: str) -> list[str]:
        """Groups consuming `topic` (QUERY_TOPIC_CONSUME_BY_WHO over its brokers): groups with
        offsets for it and online consumers subscribed to it."""
        route = await self._instance.fetch_route(topic)
        header = QueryTopicConsumeByWhoRequestHeader(topic=topic)
        groups: set[str] = set()
        for addr in sorted(set(self._read_addresses(route).values())):
            response = await self._ask(
                addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, header.to_fields()
            )
            groups.update(GroupList.from_json(checked(response).body).group_list)
        return sorted(groups)

    async def consume_time_span(self, group: str, topic: str) -> list[QueueTimeSpan]:
        """Per queue of `topic`: its first and last store times and the group's place between
        them (QUERY_CONSUME_TIME_SPAN over the topic's brokers)."""
        route = await self._instance.fetch_route(topic)
        header = QueryConsumeTimeSpanRequestHeader(topic=topic, group=group)
        spans: list[QueueTimeSpan] = []
        for addr in sorted(set(self._read_addresses(route).values())):
            response = await self._ask(
                addr, RequestCode.QUERY_CONSUME_TIME_SPAN, header.to_fields()
            )
            spans.extend(
                QueryConsumeTimeSpanBody.from_json(checked(response).body).consume_time_span_set
            )
        return sorted(spans, key=lambda span: span.message_queue)

    # -- groups ------------------------------------------------------------------------------

    async def groups(self) -> list[str]:
        """Every subscription group of every master (GET_ALL_SUBSCRIPTIONGROUP_CONFIG). Online
        consumer groups are among them: a heartbeat creates its group's config (when
        autoCreateSubscriptionGroup is off, a group must exist to consume at all)."""
        names: set[str] = set()
        for addr in await self.master_addresses():
            response = await self._ask(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
            doc = load_object(checked(response).body, "SubscriptionGroupWrapper")
            table = doc.get("subscriptionGroupTable") or {}
            if isinstance(table, dict):
                names.update(str(name) for name in table)
        return sorted(names)

    async def delete_group(
        self, group: str, cluster: str | None = None, *, remove_offset: bool = False
    ) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP on every master of `cluster` (all when None); with
        `remove_offset` (the header's cleanOffset; off by default, as upstream's
        deleteSubscriptionGroup) the group's offsets go too. Returns the addresses asked."""
        header = DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=remove_offset)
        addrs = await self.master_addresses(cluster)
        for addr in addrs:
            checked(await self._ask(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, header.to_fields()))
        return addrs

    # -- offsets -----------------------------------------------------------------------------

    async def reset_offset_by_timestamp(
        self, group: str, topic: str, timestamp_ms: int, force: bool = True
    ) -> dict[MessageQueue, int]:
        """Move `group` on every queue of `topic` to the first message stored at or after
        `timestamp_ms` (-1: the end); not `force`: only queues it would move back. Returns the
        new offsets."""
        header = ResetOffsetRequestHeader(
            topic=topic, group=group, timestamp=timestamp_ms, is_force=force
        )
        table: dict[MessageQueue, int] = {}
        for addr in sorted(set((await self._topic_masters(topic)).values())):
            response = await self._ask(
                addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header.to_fields()
            )
            table.update(ResetOffsetBody.from_json(checked(response).body).offset_table)
        return dict(sorted(table.items()))

    async def reset_offset_to(
        self, group: str, topic: str, offsets: Mapping[MessageQueue, int]
    ) -> dict[MessageQueue, int]:
        """Set `group`'s offset of each given queue (clamped by the broker to the queue's
        range); live consumers continue from it. Returns what the brokers set."""
        masters = await self._topic_masters(topic)
        table: dict[MessageQueue, int] = {}
        for queue, offset in sorted(offsets.items()):
            if queue.topic != topic or queue.broker_name not in masters:
                raise ClientError(f"{queue} is not a queue of {topic}")
            header = ResetOffsetRequestHeader(
                topic=topic, group=group, timestamp=0, queue_id=queue.queue_id, offset=offset
            )
            response = await self._ask(
                masters[queue.broker_name],
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                header.to_fields(),
            )
            table.update(ResetOffsetBody.from_json(checked(response).body).offset_table)
        return table

    # -- messages ----------------------------------------------------------------------------

    async def resend_message(
        self, msg_id: str, group: str, *, topic: str | None = None
    ) -> MessageExt:
        """Deliver one stored message again to `group` only: a copy goes to %RETRY%group on the
        broker that holds it. `msg_id` is an offsetMsgId, or (with `topic`) the message's unique
        key; a %DLQ%group message is found with topic=%DLQ%group. Returns the message resent."""
        message = await self._find_message(msg_id, topic)
        origin_topic = message.properties.get(pm.RETRY_TOPIC) or message.topic
        props = dict(message.properties)
        props[pm.RETRY_TOPIC] = origin_topic
        props.setdefault(pm.ORIGIN_MESSAGE_ID, message.msg_id)
        for delay in (pm.DELAY, pm.TIMER_DELAY_SEC, pm.TIMER_DELAY_MS):
            props.pop(delay, None)  # delivered now, not after the original's delay
        header = SendMessageRequestHeader(
            producer_group=RESEND_PRODUCER_GROUP,
            topic=pm.retry_topic(group),
            queue_id=0,
            born_timestamp=message.born_timestamp,
            flag=message.flag,
            properties=pm.encode_properties(props),
            reconsume_times=0,
        )
        cmd = RemotingCommand(
            code=RequestCode.SEND_MESSAGE, ext_fields=header.to_fields(), body=message.body
        )
        checked(await self._broker(await self._master_of(message.broker_name), cmd))
        return message

    async def _master_of(self, broker_name: str) -> str:
        """The master address of `broker_name`: cached routes first, else the cluster info (a
        fresh Admin has fetched no route of the message's topic)."""
        try:
            return self._instance.master_address(broker_name)
        except NoRouteError:
            pass
        broker = (await self.cluster_info()).broker_addr_table.get(broker_name)
        if broker is None or broker.master_addr is None:
            raise NoRouteError(f"no master known for broker {broker_name!r}")
        return broker.master_addr

    async def query_messages_by_time(
        self, topic: str, begin_ms: int, end_ms: int, max_count: int = 64
    ) -> list[MessageExt]:
        """Messages of `topic` stored between `begin_ms` and `end_ms` (inclusive), at most
        `max_count`, oldest first: per queue, the offsets at both times
        (SEARCH_OFFSET_BY_TIMESTAMP), then the messages between them, read with a pull that
        commits nothing (group TOOLS_CONSUMER)."""
        route = await self._instance.fetch_route(topic)
        found: list[MessageExt] = []
        for broker in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = self._read_addresses(route)[broker.broker_name]
            queue_nums = max(
                (
                    q.read_queue_nums
                    for q in route.queue_datas
                    if q.broker_name == broker.broker_name
                ),
                default=0,
            )
            for queue_id in range(queue_nums):
                mq = MessageQueue(topic, broker.broker_name, queue_id)
                found.extend(await self._messages_between(addr, mq, begin_ms, end_ms, max_count))
        found = [m for m in found if begin_ms <= m.store_timestamp <= end_ms]
        found.sort(key=lambda m: (m.store_timestamp, m.broker_name, m.queue_id, m.queue_offset))
        return found[:max_count]

    async def _search(self, addr: str, mq: MessageQueue, timestamp_ms: int) -> int:
        header = SearchOffsetRequestHeader(
            topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms
        )
        response = await self._ask(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header.to_fields())
        return OffsetResponseHeader.from_fields(checked(response).ext_fields).offset

    async def _messages_between(
        self, addr: str, mq: MessageQueue, begin_ms: int, end_ms: int, max_count: int
    ) -> list[MessageExt]:
        offset = await self._search(addr, mq, begin_ms)
        end = await self._search(addr, mq, end_ms) + 1
        messages: list[MessageExt] = []
        while offset < end and len(messages) < max_count:
            header = PullMessageRequestHeader(
                consumer_group=QUERY_CONSUMER_GROUP,
                topic=mq.topic,
                queue_id=mq.queue_id,
                queue_offset=offset,
                max_msg_nums=min(32, end - offset, max_count - len(messages)),
                sys_flag=int(PullSysFlag.SUBSCRIPTION),
                suspend_timeout_millis=0,
                subscription="*",
            )
            response = await self._ask(addr, RequestCode.PULL_MESSAGE, header.to_fields())
            if response.code in _NOTHING_MORE:
                break
            # Any other refusal (no permission, unknown group) is the caller's to see, not an
            # empty result.
            if not checked(response).body:
                break
            batch = [
                MessageExt.from_stored(r, mq.broker_name) for r in decode_records(response.body)
            ]
            if not batch:
                break
            messages.extend(m for m in batch if m.queue_offset < end)
            offset = batch[-1].queue_offset + 1
        return messages

    async def _find_message(self, msg_id: str, topic: str | None) -> MessageExt:
        if topic is not None:
            found = await self.query_message_by_key(topic, msg_id, unique_key=True)
            if found:
                return found[-1]
        try:
            return await self.view_message(msg_id)
        except ProtocolError:
            raise ClientError(f"message {msg_id!r} not found") from None
