"""Request handlers of the name server (remoting.md §3): one HandlerTable over a RouteTable and a
KVStore.

    103 REGISTER_BROKER          104 UNREGISTER_BROKER        105 GET_ROUTEINFO_BY_TOPIC
    106 GET_BROKER_CLUSTER_INFO  206 GET_ALL_TOPIC_LIST       224 GET_TOPICS_BY_CLUSTER
    100 PUT_KV_CONFIG            101 GET_KV_CONFIG            102 DELETE_KV_CONFIG
    219 GET_KVLIST_BY_NAMESPACE  216 DELETE_TOPIC_IN_NAMESRV  205/327 WIPE/ADD_WRITE_PERM_OF_BROKER
    322 QUERY_DATA_VERSION

Handlers are plain coroutines over the route table; none awaits anything, so each request is
answered in the task the transport started for it. A malformed header or body raises
ProtocolError, which the transport answers SYSTEM_ERROR with its text and logs as one line,
rate-limited per connection (remoting/connection.py): a peer's mistake costs no traceback.
"""

from __future__ import annotations

import zlib
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.namesrv.kv import KVStore
from tidemq.namesrv.route_table import RouteTable
from tidemq.protocol.bodies import DataVersion, KVTable, RegisterBrokerBody
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    AddWritePermOfBrokerRequestHeader,
    AddWritePermOfBrokerResponseHeader,
    DeleteKVConfigRequestHeader,
    DeleteTopicRequestHeader,
    GetKVConfigRequestHeader,
    GetKVConfigResponseHeader,
    GetKVListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    PutKVConfigRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)
from tidemq.remoting import Connection, HandlerTable

# The KV namespace whose table REGISTER_BROKER answers with (MixAll/NamesrvUtil in RocketMQ).
ORDER_TOPIC_CONFIG_NAMESPACE: Final = "ORDER_TOPIC_CONFIG"


def body_crc32(body: bytes) -> int:
    """The registration body checksum as RocketMQ computes it: CRC32 & 0x7FFFFFFF."""
    return zlib.crc32(body) & 0x7FFFFFFF


class NamesrvHandlers:
    """The name server's request handlers, bound to the state they read and change."""

    def __init__(self, routes: RouteTable, kv: KVStore, clock: Clock) -> None:
        self._routes = routes
        self._kv = kv
        self._clock = clock

    def table(self) -> HandlerTable:
        table = HandlerTable()
        table.register(RequestCode.REGISTER_BROKER, self.register_broker)
        table.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        table.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route)
        table.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.get_cluster_info)
        table.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.get_all_topics)
        table.register(RequestCode.GET_TOPICS_BY_CLUSTER, self.get_topics_by_cluster)
        table.register(RequestCode.PUT_KV_CONFIG, self.put_kv)
        table.register(RequestCode.GET_KV_CONFIG, self.get_kv)
        table.register(RequestCode.DELETE_KV_CONFIG, self.delete_kv)
        table.register(RequestCode.GET_KVLIST_BY_NAMESPACE, self.get_kv_list)
        table.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)
        table.register(RequestCode.WIPE_WRITE_PERM_OF_BROKER, self.wipe_write_perm)
        table.register(RequestCode.ADD_WRITE_PERM_OF_BROKER, self.add_write_perm)
        table.register(RequestCode.QUERY_DATA_VERSION, self.query_data_version)
        return table

    # -- brokers ---------------------------------------------------------------------------

    async def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_fields(cmd.ext_fields)
        if header.body_crc32 != 0 and body_crc32(cmd.body) != header.body_crc32:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        wrapper = None
        if cmd.body:
            body = RegisterBrokerBody.decode(cmd.body, compressed=header.compressed)
            wrapper = body.topic_config_wrapper
        result = self._routes.register_broker(
            header.cluster_name,
            header.broker_name,
            header.broker_addr,
            header.broker_id,
            header.ha_server_addr,
            wrapper,
            self._clock.now_ms(),
            conn,
        )
        order_topics = self._kv.namespace(ORDER_TOPIC_CONFIG_NAMESPACE)
        fields = RegisterBrokerResponseHeader(
            ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
        ).to_fields()
        body_out = KVTable(table=order_topics).to_json() if order_topics else b""
        return cmd.response(ResponseCode.SUCCESS, fields, body_out)

    async def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = UnregisterBrokerRequestHeader.from_fields(cmd.ext_fields)
        self._routes.unregister_broker(
            header.cluster_name, header.broker_name, header.broker_addr, header.broker_id
        )
        return cmd.response(ResponseCode.SUCCESS)

    async def query_data_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = QueryDataVersionRequestHeader.from_fields(cmd.ext_fields)
        if not cmd.body:
            raise ProtocolError("QUERY_DATA_VERSION without a DataVersion body")
        changed, stored = self._routes.query_data_version(
            header.broker_addr, DataVersion.from_json(cmd.body), self._clock.now_ms()
        )
        fields = QueryDataVersionResponseHeader(changed=changed).to_fields()
        return cmd.response(ResponseCode.SUCCESS, fields, stored.to_json() if stored else b"")

    async def wipe_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = WipeWritePermOfBrokerRequestHeader.from_fields(cmd.ext_fields)
        count = self._routes.wipe_write_perm(header.broker_name)
        fields = WipeWritePermOfBrokerResponseHeader(wipe_topic_count=count).to_fields()
        return cmd.response(ResponseCode.SUCCESS, fields)

    async def add_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = AddWritePermOfBrokerRequestHeader.from_fields(cmd.ext_fields)
        count = self._routes.add_write_perm(header.broker_name)
        fields = AddWritePermOfBrokerResponseHeader(add_topic_count=count).to_fields()
        return cmd.response(ResponseCode.SUCCESS, fields)

    # -- routes and topics -----------------------------------------------------------------

    async def get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_fields(cmd.ext_fields)
        route = self._routes.route(header.topic)
        if route is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {header.topic}",
            )
        return cmd.response(ResponseCode.SUCCESS, body=route.to_json())

    async def get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=self._routes.cluster_info().to_json())

    async def get_all_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=self._routes.topic_list().to_json())

    async def get_topics_by_cluster(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        header = GetTopicsByClusterRequestHeader.from_fields(cmd.ext_fields)
        topics = self._routes.topics_by_cluster(header.cluster)
        return cmd.response(ResponseCode.SUCCESS, body=topics.to_json())

    async def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = DeleteTopicRequestHeader.from_fields(cmd.ext_fields)
        self._routes.delete_topic(header.topic, header.cluster_name)
        return cmd.response(ResponseCode.SUCCESS)

    # -- key-value configuration -----------------------------------------------------------

    async def put_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = PutKVConfigRequestHeader.from_fields(cmd.ext_fields)
        self._kv.put(header.namespace, header.key, header.value)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = GetKVConfigRequestHeader.from_fields(cmd.ext_fields)
        value = self._kv.get(header.namespace, header.key)
        if value is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace} Key: {header.key}",
            )
        return cmd.response(
            ResponseCode.SUCCESS, GetKVConfigResponseHeader(value=value).to_fields()
        )

    async def delete_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = DeleteKVConfigRequestHeader.from_fields(cmd.ext_fields)
        self._kv.delete(header.namespace, header.key)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        header = GetKVListByNamespaceRequestHeader.from_fields(cmd.ext_fields)
        entries = self._kv.namespace(header.namespace)
        if entries is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace}",
            )
        return cmd.response(ResponseCode.SUCCESS, body=KVTable(table=entries).to_json())
