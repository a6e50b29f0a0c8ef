"""A scripted name server and brokers on real loopback sockets (no TideMQ broker needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemq.protocol import message as pm
from tidemq.protocol.bodies import (
    BrokerData,
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    QueueData,
    TopicRouteData,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.record import encode_record
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer
from tidemq.testing.wait import eventually

# Awaits a condition on state other tasks change (the client exposes no event for it).
until = eventually


Reply = Callable[[RemotingCommand], RemotingCommand | None]


@dataclass
class FakeBroker:
    name: str
    server: RemotingServer | None = None
    requests: list[RemotingCommand] = field(default_factory=list)
    # Per request code: a function answering it (default: SUCCESS with no fields).
    replies: dict[int, Reply] = field(default_factory=dict)
    send_count: int = 0
    # Request codes whose requests are recorded and answered only once `release` is set (a
    # stalled broker; FakeCluster.stop sets it, so no handler outlives the test).
    stalled: set[int] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # 0: the master of its group (brokers with one name), 1, 2, ...: its slaves.
    broker_id: int = 0
    # The port it listened on first: a restart (FakeCluster.restart) listens there again.
    port: int = 0
    # Request codes whose next request is recorded and then not answered: its connection is
    # closed instead (one transport error; the broker itself stays up).
    drop_next: set[int] = field(default_factory=set)

    @property
    def addr(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def of_code(self, code: int) -> list[RemotingCommand]:
        return [r for r in self.requests if r.code == code]

    async def handle(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        self.requests.append(request)
        if request.code in self.drop_next:
            self.drop_next.discard(request.code)
            connection.abort()
            return request.response(ResponseCode.SYSTEM_ERROR, remark="never delivered")
        if request.code in self.stalled:
            await self.release.wait()
        reply = self.replies.get(request.code)
        if reply is not None:
            answer = reply(request)
            if answer is not None:
                return answer
        if request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            self.send_count += 1
            queue_id = request.ext_fields.get("e", "0")
            return request.response(
                ResponseCode.SUCCESS,
                {
                    "msgId": f"OFFSET{self.name}{self.send_count}",
                    "queueId": queue_id,
                    "queueOffset": str(self.send_count - 1),
                },
            )
        return request.response(ResponseCode.SUCCESS)


def stored_record(
    topic: str,
    queue_id: int,
    queue_offset: int,
    body: bytes,
    *,
    props: dict[str, str] | None = None,
    sys_flag: int = 0,
) -> bytes:
    """A stored record as QueueBroker serves it (fixed hosts and times; the physical offset is
    1000 per queue id plus the queue offset)."""
    return encode_record(
        topic=topic,
        queue_id=queue_id,
        body=body,
        flag=0,
        properties=pm.encode_properties(props or {}),
        sys_flag=sys_flag,
        born_timestamp=1,
        born_host=("127.0.0.1", 5000),
        store_timestamp=2,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        prepared_transaction_offset=0,
        queue_offset=queue_offset,
        physical_offset=1000 * queue_id + queue_offset,
    )


def answer(code: int, remark: str = "scripted") -> Reply:
    return lambda request: request.response(code, remark=remark)


@dataclass
class FakeCluster:
    brokers: list[FakeBroker]
    namesrv: RemotingServer | None = None
    routes: dict[str, TopicRouteData] = field(default_factory=dict)
    route_requests: list[str] = field(default_factory=list)

    @property
    def namesrv_addr(self) -> str:
        assert self.namesrv is not None
        return f"127.0.0.1:{self.namesrv.port}"

    def add_topic(
        self, topic: str, queues: int = 4, perm: int = 6, brokers: list[FakeBroker] | None = None
    ) -> None:
        chosen = brokers if brokers is not None else self.brokers
        names = list(dict.fromkeys(b.name for b in chosen))  # one entry per group
        self.routes[topic] = TopicRouteData(
            queue_datas=[QueueData(name, queues, queues, perm) for name in names],
            broker_datas=[
                BrokerData("C", name, {b.broker_id: b.addr for b in chosen if b.name == name})
                for name in names
            ],
        )

    async def _route(self, connection: Connection, request: RemotingCommand) -> RemotingCommand:
        topic = request.ext_fields["topic"]
        self.route_requests.append(topic)
        route = self.routes.get(topic)
        if route is None:
            remark = f"No topic route info in name server for the topic: {topic}"
            return request.response(ResponseCode.TOPIC_NOT_EXIST, remark=remark)
        return request.response(ResponseCode.SUCCESS, body=route.to_json())

    async def start(self) -> None:
        for broker in self.brokers:
            await self.restart(broker)
        table = HandlerTable()
        table.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route)
        self.namesrv = RemotingServer(table, "127.0.0.1", 0, name="namesrv")
        await self.namesrv.start()
        self.add_topic("TBW102", queues=8, perm=7)

    async def restart(self, broker: FakeBroker) -> None:
        """Listen for `broker` (again, on its first port if it had one)."""
        table = HandlerTable()
        for code in RequestCode:
            if code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
                table.register(code, broker.handle)
        broker.server = RemotingServer(table, "127.0.0.1", broker.port, name=broker.name)
        await broker.server.start()
        broker.port = broker.server.port

    async def kill(self, broker: FakeBroker) -> None:
        """Stop listening for `broker` and close its connections (a crashed broker)."""
        assert broker.server is not None
        await broker.server.stop()

    async def stop(self) -> None:
        for broker in self.brokers:
            broker.release.set()
        for server in [self.namesrv, *(b.server for b in self.brokers)]:
            if server is not None:
                await server.stop()


class QueueBroker(FakeBroker):
    """A FakeBroker that also stores messages per queue and serves the consumer protocol."""

    def __init__(self, name: str, broker_id: int = 0) -> None:
        super().__init__(name, broker_id=broker_id)
        # What PULL_MESSAGE answers carry as suggestWhichBrokerId.
        self.suggest_broker_id = 0
        self.queues: dict[tuple[str, int], list[bytes]] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.client_ids: set[str] = set()
        self.fail_send_back = False
        self.replies.update(
            {
                RequestCode.PULL_MESSAGE: self._pull,
                RequestCode.QUERY_CONSUMER_OFFSET: self._query_offset,
                RequestCode.UPDATE_CONSUMER_OFFSET: self._update_offset,
                RequestCode.GET_MAX_OFFSET: self._max_offset,
                RequestCode.HEART_BEAT: self._heartbeat,
                RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
                RequestCode.LOCK_BATCH_MQ: self._lock,
                RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
            }
        )

    def put(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str] | None = None,
    ) -> None:
        stored = self.queues.setdefault((topic, queue_id), [])
        stored.append(stored_record(topic, queue_id, len(stored), body, props=props))

    def _pull(self, request: RemotingCommand) -> RemotingCommand:
        topic, qid = request.ext_fields["topic"], int(request.ext_fields["queueId"])
        offset = int(request.ext_fields["queueOffset"])
        count = int(request.ext_fields["maxMsgNums"])
        stored = self.queues.get((topic, qid), [])
        found = stored[offset : offset + count]
        fields = {
            "suggestWhichBrokerId": str(self.suggest_broker_id),
            "minOffset": "0",
            "maxOffset": str(len(stored)),
            "nextBeginOffset": str(offset + len(found)),
        }
        if found:
            return request.response(ResponseCode.SUCCESS, fields, body=b"".join(found))
        return request.response(ResponseCode.PULL_NOT_FOUND, fields)

    def _key(self, request: RemotingCommand) -> tuple[str, str, int]:
        f = request.ext_fields
        return f["consumerGroup"], f["topic"], int(f["queueId"])

    def _query_offset(self, request: RemotingCommand) -> RemotingCommand:
        offset = self.offsets.get(self._key(request))
        if offset is None:
            return request.response(ResponseCode.QUERY_NOT_FOUND, remark="not found")
        return request.response(ResponseCode.SUCCESS, {"offset": str(offset)})

    def _update_offset(self, request: RemotingCommand) -> RemotingCommand:
        self.offsets[self._key(request)] = int(request.ext_fields["commitOffset"])
        return request.response(ResponseCode.SUCCESS)

    def _max_offset(self, request: RemotingCommand) -> RemotingCommand:
        stored = self.queues.get((request.ext_fields["topic"], int(request.ext_fields["queueId"])))
        return request.response(ResponseCode.SUCCESS, {"offset": str(len(stored or []))})

    def _heartbeat(self, request: RemotingCommand) -> RemotingCommand:
        beat = HeartbeatData.from_json(request.body)
        if beat.consumer_data_set:
            self.client_ids.add(beat.client_id)
        return request.response(ResponseCode.SUCCESS)

    def _consumer_list(self, request: RemotingCommand) -> RemotingCommand:
        body = ConsumerListBody(consumer_id_list=sorted(self.client_ids))
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    def _lock(self, request: RemotingCommand) -> RemotingCommand:
        asked = LockBatchRequestBody.from_json(request.body)
        body = LockBatchResponseBody(lock_ok_mq_set=asked.mq_set)
        return request.response(ResponseCode.SUCCESS, body=body.to_json())

    def _send_back(self, request: RemotingCommand) -> RemotingCommand:
        if self.fail_send_back:
            return request.response(ResponseCode.SYSTEM_ERROR, remark="scripted")
        return request.response(ResponseCode.SUCCESS)
