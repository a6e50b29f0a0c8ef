"""Client registration and orderly locks: codes 34, 35, 38 (§4.4 to §4.6) and 41, 42 (§4.10).

HEART_BEAT also makes sure each consumer group has its config (auto-created by default) and its
retry topic `%RETRY%<group>`; creating the topic bumps the topic table's version, whose change
listener re-registers the broker with every name server at once. A heartbeat with a SQL92
subscription that does not parse (or with enablePropertyFilter off) is refused whole with
SUBSCRIPTION_PARSE_FAILED, before anything is registered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from tidemq.broker.clients import ClientChannel, ClientRegistry, QueueLockTable
from tidemq.broker.filter import FilterRefused, build_filter
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.handlers.common import Refusal, guarded
from tidemq.broker.topics import TopicTable
from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.protocol.bodies import (
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    UnlockBatchRequestBody,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerListByGroupRequestHeader,
    UnregisterClientRequestHeader,
)
from tidemq.protocol.message import validate_group, validate_topic
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.signing import ACCESS_KEY

log = logging.getLogger(__name__)

# Connection attribute marking that the registry already listens for this connection's close.
_CLOSE_HOOKED: Final = "tidemq.broker.clients"


class ClientHandlers:
    def __init__(
        self,
        clock: Clock,
        clients: ClientRegistry,
        locks: QueueLockTable,
        groups: SubscriptionGroupTable,
        topics: TopicTable,
        *,
        property_filter_enabled: bool = False,
    ) -> None:
        self._property_filter_enabled = property_filter_enabled
        self._clock = clock
        self._clients = clients
        self._locks = locks
        self._groups = groups
        self._topics = topics

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.HEART_BEAT, guarded(self.heartbeat))
        table.register(RequestCode.UNREGISTER_CLIENT, guarded(self.unregister))
        table.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, guarded(self.consumer_list))
        table.register(RequestCode.LOCK_BATCH_MQ, guarded(self.lock_batch))
        table.register(RequestCode.UNLOCK_BATCH_MQ, guarded(self.unlock_batch))

    def _hook_close(self, connection: Connection) -> None:
        if connection.attributes.get(_CLOSE_HOOKED):
            return
        connection.attributes[_CLOSE_HOOKED] = True
        connection.add_close_listener(self._clients.connection_closed)

    async def heartbeat(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        data = HeartbeatData.from_json(request.body)
        self._check_filters(data)
        self._hook_close(connection)
        now = self._clock.monotonic_ms()

        def channel() -> ClientChannel:
            return ClientChannel(
                connection=connection,
                client_id=data.client_id,
                language=request.language,
                version=request.version,
                last_update_ms=now,
                access_key=request.ext_fields.get(ACCESS_KEY),
            )

        for consumer in data.consumer_data_set:
            try:
                validate_group(consumer.group_name)
            except ProtocolError as exc:
                log.warning("heartbeat from %s: skipping consumer: %s", connection.peer_text, exc)
                continue
            group = self._groups.find_or_create(consumer.group_name)
            if group is not None:
                self._topics.ensure_retry_topic(consumer.group_name, max(1, group.retry_queue_nums))
            self._clients.register_consumer(
                consumer.group_name,
                channel(),
                consume_type=consumer.consume_type.name,
                message_model=consumer.message_model.name,
                consume_from_where=consumer.consume_from_where.name,
                subscriptions=consumer.subscription_data_set,
                notify=group is None or group.notify_consumer_ids_changed_enable,
            )
        for producer in data.producer_data_set:
            self._clients.register_producer(producer.group_name, channel())
        return request.response(ResponseCode.SUCCESS)

    def _check_filters(self, data: HeartbeatData) -> None:
        for consumer in data.consumer_data_set:
            for sub in consumer.subscription_data_set:
                if sub.expression_type.strip().upper() == "TAG":
                    continue  # tag expressions are lenient at heartbeat, as in RocketMQ
                try:
                    build_filter(
                        sub.sub_string,
                        sub.expression_type,
                        sql_enabled=self._property_filter_enabled,
                    )
                except FilterRefused as exc:
                    raise Refusal(
                        ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                        f"group {consumer.group_name}, topic {sub.topic}: {exc}",
                    ) from None

    async def unregister(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        header = UnregisterClientRequestHeader.from_fields(request.ext_fields)
        if header.producer_group:
            self._clients.unregister_producer(header.producer_group, connection)
        if header.consumer_group:
            group = self._groups.get(header.consumer_group)
            self._clients.unregister_consumer(
                header.consumer_group,
                connection,
                notify=group is None or group.notify_consumer_ids_changed_enable,
            )
        return request.response(ResponseCode.SUCCESS)

    async def consumer_list(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        header = GetConsumerListByGroupRequestHeader.from_fields(request.ext_fields)
        ids = self._clients.consumer_ids(header.consumer_group)
        if not ids:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {header.consumer_group}"
            )
        return request.response(
            ResponseCode.SUCCESS, body=ConsumerListBody(consumer_id_list=ids).to_json()
        )

    async def lock_batch(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        body = LockBatchRequestBody.from_json(request.body)
        _validate_queues(body.consumer_group, body.mq_set)
        held = self._locks.lock_batch(body.consumer_group, body.mq_set, body.client_id, connection)
        return request.response(
            ResponseCode.SUCCESS,
            body=LockBatchResponseBody(lock_ok_mq_set=frozenset(held)).to_json(),
        )

    async def unlock_batch(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        body = UnlockBatchRequestBody.from_json(request.body)
        _validate_queues(body.consumer_group, body.mq_set)
        self._locks.unlock_batch(body.consumer_group, body.mq_set, body.client_id)
        return request.response(ResponseCode.SUCCESS)


def _validate_queues(group: str, queues: Iterable[MessageQueue]) -> None:
    """Raise ProtocolError (answered SYSTEM_ERROR) for an illegal group or topic name."""
    validate_group(group)
    for mq in queues:
        validate_topic(mq.topic)
