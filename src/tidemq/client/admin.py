"""Client-side administration: what the `tidemq` CLI (and later the dashboard) asks a cluster.

Every call goes through the same ClientInstance as producers and consumers, to the name servers
(cluster info, topic list, routes) or to each broker group concerned, and merges the brokers'
answers. Changes (topic creation and deletion) go to masters; reads (statistics, message lookup)
to one broker per group, the master unless the read router says otherwise (read_route.py): a
group whose master is down still answers from its slave, as upstream's admin asks
`BrokerData.selectBrokerAddr()` (the master, else a slave).

- `create_topic` sends UPDATE_AND_CREATE_TOPIC to every master of a cluster (or one broker);
- `topic_stats` / `consume_stats` merge per-queue tables across the topic's brokers; consume stats
  cover the brokers of the topic (if given) and of the group's retry topic, as RocketMQ does;
- `query_message_by_key` asks every broker of the topic (QUERY_MESSAGE); `view_message` decodes
  the offsetMsgId into the store host and commit-log offset and asks that broker (VIEW_MESSAGE).

A name server that has just restarted knows no broker until they register again (about a second,
broker/registration.py): routes, cluster info and the topic list therefore go on to the next name
server when one has no route, no broker or no topic (ClientInstance.invoke_namesrv).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import ClientError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import (
    ClusterInfo,
    ConsumeStats,
    KVTable,
    MessageQueue,
    OffsetWrapper,
    TopicList,
    TopicOffset,
    TopicRouteData,
    TopicStatsTable,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueryMessageRequestHeader,
    ViewMessageRequestHeader,
)
from tidemq.protocol.record import decode_record, decode_records
from tidemq.security.signing import Credentials

from .admin_groups import GroupAdmin, checked
from .instance import AskNext, ClientInstance, no_brokers
from .message import MessageExt
from .tls import TlsOption

# QUERY_MESSAGE answers at most this many messages per broker (the broker caps unique-key
# queries at 32 as well).
QUERY_MAX_NUM_DEFAULT: Final = 32
# Queries scan the index up to this time when no end is given: far in the future.
_END_OF_TIME_MS: Final = 2**62


def _no_topics(response: RemotingCommand) -> bool:
    """A topic list that is empty: that name server may have just restarted."""
    return (
        response.code == ResponseCode.SUCCESS and not TopicList.from_json(response.body).topic_list
    )


class Admin(GroupAdmin):
    """Cluster administration; groups, connections, settings and offset resets are in
    GroupAdmin (client/admin_groups.py)."""

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        clock: Clock | None = None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = False,
        timeout_ms: float = 5_000,
    ) -> None:
        self._instance = instance or ClientInstance(
            namesrv_addr,
            clock=clock,
            instance_name=instance_name,
            credentials=credentials,
            tls=tls,
        )
        self.timeout_ms = timeout_ms

    @property
    def instance(self) -> ClientInstance:
        return self._instance

    async def start(self) -> None:
        await self._instance.start()

    async def shutdown(self) -> None:
        await self._instance.shutdown()

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    async def _namesrv(
        self, code: int, fields: dict[str, str] | None = None, ask_next: AskNext | None = None
    ) -> RemotingCommand:
        cmd = RemotingCommand(code=code, ext_fields=fields or {})
        response = await self._instance.invoke_namesrv(cmd, self.timeout_ms, ask_next=ask_next)
        return checked(response)

    async def _broker(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        return await self._instance.remoting.invoke(addr, cmd, self.timeout_ms)

    def _read_addresses(self, route: TopicRouteData) -> dict[str, str]:
        """broker name → the address a read of that group goes to, for the groups of `route`
        (which must be in the instance's cache: fetch_route puts it there)."""
        names = sorted({broker.broker_name for broker in route.broker_datas})
        return {name: self._instance.reads.target(name).addr for name in names}

    # -- name server -----------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        return ClusterInfo.from_json(
            (await self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO, ask_next=no_brokers)).body
        )

    async def topic_list(self) -> list[str]:
        response = await self._namesrv(
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, ask_next=_no_topics
        )
        return sorted(TopicList.from_json(response.body).topic_list)

    async def topic_route(self, topic: str) -> TopicRouteData:
        return await self._instance.fetch_route(topic)

    async def master_addresses(self, cluster: str | None = None) -> list[str]:
        """Master addresses of `cluster` (every cluster when None), sorted."""
        info = await self.cluster_info()
        names = (
            info.cluster_addr_table.get(cluster, [])
            if cluster is not None
            else list(info.broker_addr_table)
        )
        addrs = [
            info.broker_addr_table[name].broker_addrs.get(pm.MASTER_BROKER_ID)
            for name in names
            if name in info.broker_addr_table
        ]
        return sorted(a for a in addrs if a)

    # -- topics ----------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        order: bool = False,
    ) -> list[str]:
        """Create or update `topic` on one broker, or every master of `cluster` (or of every
        cluster); returns the broker addresses it was created on.

        Raises:
            ClientError: no broker to create it on.
            BrokerError: a broker refused.
        """
        pm.validate_topic(topic)
        addrs = [broker_addr] if broker_addr else await self.master_addresses(cluster)
        if not addrs:
            raise ClientError(f"no master broker found for cluster {cluster!r}")
        header = CreateTopicRequestHeader(
            topic=topic,
            read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums,
            perm=perm,
            order=order,
        )
        for addr in addrs:
            cmd = RemotingCommand(
                code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=header.to_fields()
            )
            checked(await self._broker(addr, cmd))
        return addrs

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> None:
        """Delete `topic` from the masters of `cluster` (all clusters when None), then from the
        name servers' route table."""
        header = DeleteTopicRequestHeader(topic=topic)
        for addr in await self.master_addresses(cluster):
            cmd = RemotingCommand(
                code=RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields=header.to_fields()
            )
            checked(await self._broker(addr, cmd))
        namesrv_header = DeleteTopicRequestHeader(topic=topic, cluster_name=cluster)
        await self._namesrv(RequestCode.DELETE_TOPIC_IN_NAMESRV, namesrv_header.to_fields())
        self._instance.routes.forget(topic)

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO of the broker at `addr`: its key → value table (role,
        offsets, replication and, in controller mode, epoch and in-sync set)."""
        response = checked(
            await self._broker(addr, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO))
        )
        return KVTable.from_json(response.body).table

    async def topic_stats(self, topic: str) -> TopicStatsTable:
        """Min/max offset and last update time of every queue of `topic`, all brokers merged."""
        route = await self._instance.fetch_route(topic)
        table: dict[MessageQueue, TopicOffset] = {}
        header = GetTopicStatsInfoRequestHeader(topic=topic)
        for addr in self._read_addresses(route).values():
            cmd = RemotingCommand(
                code=RequestCode.GET_TOPIC_STATS_INFO, ext_fields=header.to_fields()
            )
            response = checked(await self._broker(addr, cmd))
            table.update(TopicStatsTable.from_json(response.body).offset_table)
        return TopicStatsTable(offset_table=dict(sorted(table.items())))

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """Broker offset vs. the group's committed offset per queue (the group's lag)."""
        addrs: set[str] = set()
        for name in [pm.retry_topic(group)] + ([topic] if topic else []):
            route = await self._route_or_none(name)
            if route is not None:
                addrs.update(self._read_addresses(route).values())
        table: dict[MessageQueue, OffsetWrapper] = {}
        tps = 0.0
        header = GetConsumeStatsRequestHeader(consumer_group=group, topic=topic)
        for addr in sorted(addrs):
            cmd = RemotingCommand(code=RequestCode.GET_CONSUME_STATS, ext_fields=header.to_fields())
            response = checked(await self._broker(addr, cmd))
            stats = ConsumeStats.from_json(response.body)
            table.update(stats.offset_table)
            tps += stats.consume_tps
        return ConsumeStats(offset_table=dict(sorted(table.items())), consume_tps=tps)

    # -- messages --------------------------------------------------------------------------

    async def query_message_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = QUERY_MAX_NUM_DEFAULT,
        begin_ms: int = 0,
        end_ms: int = _END_OF_TIME_MS,
        unique_key: bool = False,
    ) -> list[MessageExt]:
        """Messages of `topic` with `key` among their KEYS (or whose UNIQ_KEY is `key` when
        `unique_key`), from every broker of the topic, ordered by store time."""
        route = await self._instance.fetch_route(topic)
        header = QueryMessageRequestHeader(
            topic=topic,
            key=key,
            max_num=max_num,
            begin_timestamp=begin_ms,
            end_timestamp=end_ms,
            unique_key_query=unique_key,
        )
        found: list[MessageExt] = []
        for name, addr in self._read_addresses(route).items():
            cmd = RemotingCommand(code=RequestCode.QUERY_MESSAGE, ext_fields=header.to_fields())
            response = await self._broker(addr, cmd)
            if response.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            checked(response)
            for stored in decode_records(response.body):
                message = MessageExt.from_stored(stored, name)
                if unique_key or key in message.keys or message.msg_id == key:
                    found.append(message)
        return sorted(found, key=lambda m: (m.store_timestamp, m.broker_name, m.queue_offset))

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message an offsetMsgId names (store host + commit-log offset)."""
        host, port, physical_offset = pm.decode_offset_msg_id(offset_msg_id)
        addr = f"{host}:{port}"
        cmd = RemotingCommand(
            code=RequestCode.VIEW_MESSAGE_BY_ID,
            ext_fields=ViewMessageRequestHeader(offset=physical_offset).to_fields(),
        )
        response = checked(await self._broker(addr, cmd))
        broker_name = self._instance.routes.broker_name_of(addr) or await self._broker_name_at(addr)
        return MessageExt.from_stored(decode_record(response.body), broker_name)

    async def _broker_name_at(self, addr: str) -> str:
        """The name of the broker at `addr` when no cached route names it (a fresh Admin): from
        the cluster info; "" for an address no broker registered."""
        for broker in (await self.cluster_info()).broker_addr_table.values():
            if addr in broker.broker_addrs.values():
                return broker.broker_name
        return ""
