"""The client instance: what producers and consumers of one process share (RocketMQ's
MQClientInstance).

    Producer ─┐                       ┌─ name servers (routes; see below)
    Producer ─┼─ ClientInstance ──────┤
    Consumer ─┘  one RemotingClient   └─ brokers (sends, pulls, heartbeats, offsets)
                 one client id "<ip>@<pid>#<instance name>"
                 one route cache, refreshed every 30 s
                 one heartbeat every 30 s to every known broker, covering every group
                 one read router: which broker of a group serves a read (read_route.py)

Name servers are independent and each learns routes only from broker registrations, so one that
has just restarted may not know a topic the others know. The instance starts at a random name
server of the list (as the Java client does: clients spread over them) and stays with the one
that answered; a request goes to the next one when the current one fails, or, for a route, when
it answers TOPIC_NOT_EXIST (the caller's `ask_next`). Only when every name server says so is
the topic unknown; one that failed in the last NAMESRV_FAILURE_MEMORY_MS is not asked for such a
second opinion (a hung one would cost a timeout on every lookup of an unknown topic).

Heartbeats go to every master and, with a consumer, to every slave too (as the Java client
does): a slave serves a group's pulls and offsets only if it knows the group.

Brokers learn of a client only from its heartbeat, and a broker that restarted has forgotten it;
until it hears again it sends the group's transaction check-backs to nobody and leaves the client
out of consumer lists. So besides the 30 s round the instance heartbeats:
- at a producer's start (`announce`), after fetching the routes of the topics it declared;
- when a route names a broker it did not know;
- after a broker's connection closed: again with backoff (REHEARTBEAT_DELAY_MS_MIN doubling to
  REHEARTBEAT_DELAY_MS_MAX) until it answers, for at most one heartbeat interval (then the
  regular round covers a broker that is gone for good); once it answers, the routes are
  refreshed soon, and with back-off until they list it (client/rejoin.py); while it does not
  (or no master is listed), they are refreshed once a second (silent_refresh.py: failover).

Brokers know a client by its id (consumer lists, check-backs). Two consumers in one process that
must split a group's queues need two instances (different instance names): the default, since
every Producer and PushConsumer makes its own unless one is passed in. There are no globals.

Server-initiated requests: NOTIFY_CONSUMER_IDS_CHANGED (40), the named group's consumers
rebalance now; CHECK_TRANSACTION_STATE (39), handed to the producer of the message's PGROUP.

With `credentials` (an ACL account's keys), every request the instance sends, to name servers and
brokers alike, is signed as RocketMQ's AclClientRPCHook signs it (tidemq.security.signing); the
producers and consumers given the instance share them. A Producer or consumer that makes its own
instance passes its `credentials` on; one given an `instance` uses that instance's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable, Coroutine, Iterable, Sequence
from functools import partial
from typing import Final, Protocol

from tidemq.clock import Clock, SystemClock
from tidemq.errors import (
    BrokerError,
    ClientClosedError,
    ClientError,
    NoRouteError,
    error_for_code,
)
from tidemq.limits import CLIENT_HEARTBEAT_INTERVAL_MS
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import (
    ClusterInfo,
    ConsumerData,
    HeartbeatData,
    ProducerData,
    TopicRouteData,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    GetRouteInfoRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    UnregisterClientRequestHeader,
)
from tidemq.protocol.record import decode_record
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.signing import Credentials, sign

from .endpoints import local_ipv4, parse_namesrv_addr
from .message import MessageExt
from .read_route import ReadRouter
from .rejoin import RejoinRefresh
from .route_cache import ROUTE_REFRESH_INTERVAL_MS, RouteCache
from .running_info import answer_running_info as answer
from .running_info import apply_reset as reset
from .silent_refresh import SilentBrokerRefresh
from .tls import TlsOption, client_ssl

logger = logging.getLogger(__name__)

# Name-server and admin-style requests: as RocketMQ's default 3 s.
REQUEST_TIMEOUT_MS: Final = 3_000
# After a broker's connection closed, the first heartbeat to it waits this long (a restarted
# broker needs at least this to listen again), and later ones back off to the cap: the most a
# restarted broker waits to know this client once it accepts. A refused connect costs next to
# nothing, so one a second is cheap while the broker is down.
REHEARTBEAT_DELAY_MS_MIN: Final = 100
REHEARTBEAT_DELAY_MS_MAX: Final = 1_000
# A name server that failed (no answer) is not asked for a second opinion, after another one
# answered without what was asked (ask_next), for this long after its failure: a hung one would
# otherwise cost a request timeout on every lookup of a topic nobody knows (a consumer's retry
# topic every rebalance round; a new producer's first send, whose whole send timeout it used).
# As long as the route refresh period, so a hung one costs at most one timeout per period; a
# name server that restarted (answers, but lacks routes) is not affected by it.
NAMESRV_FAILURE_MEMORY_MS: Final = ROUTE_REFRESH_INTERVAL_MS

AskNext = Callable[[RemotingCommand], bool]


class ProducerMember(Protocol):
    """What the instance needs from a producer registered on it."""

    @property
    def group(self) -> str: ...

    async def on_check_transaction_state(
        self, broker_addr: str, header: CheckTransactionStateRequestHeader, message: MessageExt
    ) -> None: ...


class ConsumerMember(Protocol):
    """What the instance needs from a consumer registered on it."""

    @property
    def group(self) -> str: ...

    def consumer_data(self) -> ConsumerData: ...

    def topics(self) -> Iterable[str]: ...

    def trigger_rebalance(self) -> None: ...


class ClientInstance:
    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        clock: Clock | None = None,
        instance_name: str | None = None,
        client_ip: str | None = None,
        heartbeat_interval_ms: float = CLIENT_HEARTBEAT_INTERVAL_MS,
        route_refresh_interval_ms: float = ROUTE_REFRESH_INTERVAL_MS,
        request_timeout_ms: float = REQUEST_TIMEOUT_MS,
        rng: random.Random | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = False,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.namesrv_addrs = parse_namesrv_addr(namesrv_addr)
        self.client_ip = client_ip or local_ipv4()
        self.pid = os.getpid()
        # Unique per instance by default: two instances in one process are two group members.
        self.instance_name = instance_name or os.urandom(4).hex()
        self.client_id = f"{self.client_ip}@{self.pid}#{self.instance_name}"
        self.routes = RouteCache()
        self.request_timeout_ms = request_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._route_refresh_interval_ms = route_refresh_interval_ms
        # Where to start in the name server list: random, so clients spread over them.
        self._namesrv_index = (rng or random.Random()).randrange(len(self.namesrv_addrs))
        # Broker connections whose close starts a re-heartbeat, and those loops, by address.
        self._watched: dict[str, Connection] = {}
        self._reheartbeats: set[str] = set()
        # Name server address → monotonic ms of its last failure (NAMESRV_FAILURE_MEMORY_MS).
        self._namesrv_failed_at: dict[str, float] = {}
        self._producers: dict[str, ProducerMember] = {}
        self._consumers: dict[str, ConsumerMember] = {}
        self._extra_topics: set[str] = set()
        handlers = HandlerTable()
        handlers.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify_ids_changed)
        handlers.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction)
        # Admin requests about a consumer (client/running_info.py).
        handlers.register(RequestCode.GET_CONSUMER_RUNNING_INFO, partial(answer, self._consumers))
        handlers.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, partial(reset, self._consumers))
        # With credentials every request this instance sends is signed (ACL); None: unsigned.
        signer = None if credentials is None else partial(sign, credentials=credentials)
        self.remoting = RemotingClient(
            handlers,
            clock=self.clock,
            signer=signer,
            ssl=client_ssl(tls),  # client/tls.py
        )
        self.reads = ReadRouter(self.routes, self.clock, self.probe_address)
        self._rejoin = RejoinRefresh(self.refresh_routes, self._lists, self._spawn)
        self._silent = SilentBrokerRefresh(self.refresh_routes, self._spawn)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._users = 0

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the timers. Reference-counted: each start() needs one shutdown()."""
        if self._closed:
            raise ClientClosedError("client instance was shut down")
        self._users += 1
        if self._started:
            return
        self._started = True
        self._tasks = [
            asyncio.create_task(self._every(self._heartbeat_interval_ms, self.heartbeat)),
            asyncio.create_task(self._every(self._route_refresh_interval_ms, self.refresh_routes)),
        ]

    async def shutdown(self) -> None:
        self._users -= 1
        if self._users > 0 or self._closed:
            return
        self._closed = True
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reads.stop()
        await self.remoting.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def _every(self, interval_ms: float, action: _Action) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await action()
            except Exception:
                logger.exception("%s: periodic %s failed", self.client_id, action.__name__)

    # -- membership ------------------------------------------------------------------------

    def register_producer(self, producer: ProducerMember) -> None:
        if producer.group in self._producers:
            raise ValueError(f"producer group {producer.group!r} already registered")
        self._producers[producer.group] = producer

    def register_consumer(self, consumer: ConsumerMember) -> None:
        if consumer.group in self._consumers:
            raise ValueError(f"consumer group {consumer.group!r} already registered")
        self._consumers[consumer.group] = consumer

    async def unregister_producer(self, group: str) -> None:
        if self._producers.pop(group, None) is not None:
            await self._unregister_client(producer_group=group)

    async def unregister_consumer(self, group: str) -> None:
        if self._consumers.pop(group, None) is not None:
            await self._unregister_client(consumer_group=group)

    def watch_topic(self, topic: str) -> None:
        """Keep `topic`'s route refreshed (producers call this for every topic they send to)."""
        self._extra_topics.add(topic)

    async def _unregister_client(
        self, *, producer_group: str | None = None, consumer_group: str | None = None
    ) -> None:
        header = UnregisterClientRequestHeader(
            client_id=self.client_id, producer_group=producer_group, consumer_group=consumer_group
        )
        for addr in self.routes.all_addresses(slaves=True):
            cmd = RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields=header.to_fields())
            try:
                await self.remoting.invoke(addr, cmd, self.request_timeout_ms)
            except ClientError as exc:
                logger.warning("%s: unregister from %s failed: %s", self.client_id, addr, exc)

    # -- name servers and routes -----------------------------------------------------------

    async def invoke_namesrv(
        self, cmd: RemotingCommand, timeout_ms: float, *, ask_next: AskNext | None = None
    ) -> RemotingCommand:
        """Ask the current name server; on a transport failure, or an answer for which
        `ask_next(response)` is true (it lacks what the others may have), the next ones in turn.

        Returns the first other answer, else the last such answer.

        Raises:
            ClientError: no name server answered (the last failure).
        """
        count = len(self.namesrv_addrs)
        last_error: ClientError | None = None
        lacking: RemotingCommand | None = None
        for step in range(count):
            index = (self._namesrv_index + step) % count
            addr = self.namesrv_addrs[index]
            failed_at = self._namesrv_failed_at.get(addr)
            if (
                lacking is not None
                and failed_at is not None
                and self.clock.monotonic_ms() - failed_at < NAMESRV_FAILURE_MEMORY_MS
            ):
                continue  # a second opinion is not worth a likely timeout
            try:
                response = await self.remoting.invoke(addr, _copy(cmd), timeout_ms)
            except ClientClosedError:
                raise
            except ClientError as exc:
                logger.warning("%s: name server %s failed: %s", self.client_id, addr, exc)
                self._namesrv_failed_at[addr] = self.clock.monotonic_ms()
                last_error = exc
                continue
            self._namesrv_failed_at.pop(addr, None)
            if ask_next is not None and ask_next(response):
                lacking = lacking or response
                continue
            self._namesrv_index = index
            return response
        if lacking is not None:
            return lacking
        assert last_error is not None
        raise last_error

    async def fetch_route(self, topic: str) -> TopicRouteData:
        """Ask a name server for `topic`'s route and cache it.

        Raises:
            BrokerError: the name server's answer (TopicNotExistError for an unknown topic).
            ClientError: no name server answered.
        """
        header = GetRouteInfoRequestHeader(topic=topic)
        cmd = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields=header.to_fields()
        )
        response = await self.invoke_namesrv(cmd, self.request_timeout_ms, ask_next=_no_route)
        if response.code != ResponseCode.SUCCESS:
            raise error_for_code(response.code, response.remark)
        route = TopicRouteData.from_json(response.body)
        known, masters = set(self._heartbeat_addresses()), self.routes.master_addresses()
        self.routes.put(topic, route, self.clock.monotonic_ms())
        if self._consumers:
            self.reads.watch_lost_masters(masters)
        if self._started and not set(self._heartbeat_addresses()) <= known:
            # A new broker must hear from us before it answers consumer lists or check-backs.
            self._spawn(self.heartbeat())
        return route

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        if self._closed:
            # After shutdown nothing would cancel or await it (a route fetched, a probe answered
            # by a send or probe still in flight).
            coro.close()
            return
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The cached route of `topic`, fetched first if absent (or if `refresh`)."""
        cached = self.routes.get(topic)
        if cached is not None and not refresh:
            return cached
        return await self.fetch_route(topic)

    async def refresh_routes(self) -> None:
        topics = set(self._extra_topics) | set(self.routes.topics())
        for consumer in self._consumers.values():
            topics.update(consumer.topics())
        for topic in sorted(topics):
            try:
                await self.fetch_route(topic)
            except BrokerError as exc:
                if exc.response_code == ResponseCode.TOPIC_NOT_EXIST:
                    logger.debug("%s: topic %s has no route yet", self.client_id, topic)
                else:
                    logger.warning("%s: route of %s: %s", self.client_id, topic, exc)
            except ClientError as exc:
                logger.warning("%s: route of %s: %s", self.client_id, topic, exc)

    def master_address(self, broker_name: str) -> str:
        """The master address of `broker_name` from the routes seen so far.

        Raises:
            NoRouteError: no cached route names that broker.
        """
        addr = self.routes.master_address(broker_name)
        if addr is None:
            raise NoRouteError(f"no address known for broker {broker_name!r}")
        return addr

    # -- brokers ---------------------------------------------------------------------------

    async def invoke_broker(
        self, broker_name: str, cmd: RemotingCommand, timeout_ms: float | None = None
    ) -> RemotingCommand:
        """Request to the master of `broker_name` (writes, locks); the raw response (any code)."""
        addr = self.master_address(broker_name)
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        return await self.remoting.invoke(addr, cmd, timeout)

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            client_id=self.client_id,
            producer_data_set=[ProducerData(group_name=g) for g in sorted(self._producers)],
            consumer_data_set=[self._consumers[g].consumer_data() for g in sorted(self._consumers)],
        )

    def _heartbeat_addresses(self) -> list[str]:
        # Slaves only matter to consumers: they serve reads, never sends or check-backs.
        return self.routes.all_addresses(slaves=bool(self._consumers))

    async def heartbeat(self) -> None:
        """HEART_BEAT to every known master (and slave, with a consumer), one body covering
        every group of this instance."""
        if not self._producers and not self._consumers:
            return
        body = self.heartbeat_data().to_json()
        for addr in self._heartbeat_addresses():
            try:
                await self.heartbeat_to(addr, self.request_timeout_ms, body)
            except (ClientError, BrokerError) as exc:
                logger.warning("%s: heartbeat to %s failed: %s", self.client_id, addr, exc)

    async def heartbeat_to(self, addr: str, timeout_ms: float, body: bytes | None = None) -> None:
        """One HEART_BEAT to `addr`; once one succeeds, the close of that connection starts a
        re-heartbeat (module docstring).

        Raises:
            ClientError: no answer (transport).
            BrokerError: an answer other than SUCCESS.
        """
        if body is None:
            body = self.heartbeat_data().to_json()
        cmd = RemotingCommand(code=RequestCode.HEART_BEAT, body=body)
        response = await self.remoting.invoke(addr, cmd, timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for_code(response.code, response.remark)
        connection = self.remoting.connections.get(addr)
        if connection is not None and self._watched.get(addr) is not connection:
            self._watched[addr] = connection
            connection.add_close_listener(lambda closed: self._on_broker_closed(addr, closed))

    async def probe_broker(self, broker_name: str, timeout_ms: float) -> None:
        """A heartbeat to `broker_name`'s master: the producer's fault probe (fault_probe.py).

        Routes are refreshed until they list a broker answering again (client/rejoin.py),
        and soon when a master does not answer or none is listed (it may have moved).

        Raises:
            ClientError: no address known or no answer; BrokerError: an error answer.
        """
        try:
            addr = self.master_address(broker_name)
        except NoRouteError:
            self.suspect_routes(broker_name)
            raise
        await self.probe_address(addr, timeout_ms)

    def suspect_routes(self, what: str) -> None:
        """A silent master or none listed: refresh the routes soon (silent_refresh.py)."""
        self._silent.silent(what)

    async def probe_address(self, addr: str, timeout_ms: float) -> None:
        """A heartbeat to `addr`, then a route refresh shortly after (as `probe_broker`): the
        read router's probe (read_route.py).

        Raises:
            ClientError: no answer; BrokerError: an error answer.
        """
        try:
            await self.heartbeat_to(addr, timeout_ms)
        except ClientError:
            self.suspect_routes(addr)
            raise
        self._rejoin.answered(addr)

    def _lists(self, addr: str) -> bool:
        return addr in self.routes.all_addresses(slaves=True)

    def _on_broker_closed(self, addr: str, connection: Connection) -> None:
        if self._watched.get(addr) is connection:
            del self._watched[addr]
        if self._closed or addr in self._reheartbeats:
            return
        self._reheartbeats.add(addr)
        self._spawn(self._reheartbeat(addr))

    async def _reheartbeat(self, addr: str) -> None:
        """Heartbeat `addr` with backoff until it answers, for one heartbeat interval at most."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._heartbeat_interval_ms / 1000
        delay_ms: float = REHEARTBEAT_DELAY_MS_MIN
        try:
            while loop.time() < give_up_at:
                await asyncio.sleep(delay_ms / 1000)
                if not self._producers and not self._consumers:
                    return
                try:
                    await self.heartbeat_to(addr, self.request_timeout_ms)
                except (ClientError, BrokerError) as exc:
                    logger.debug("%s: heartbeat to %s again: %s", self.client_id, addr, exc)
                    if isinstance(exc, ClientError):  # gone: its group's master may move
                        self.suspect_routes(addr)
                    delay_ms = min(delay_ms * 2, REHEARTBEAT_DELAY_MS_MAX)
                    continue
                logger.info("%s: broker %s answers heartbeats again", self.client_id, addr)
                self._rejoin.answered(addr)
                return
        finally:
            self._reheartbeats.discard(addr)

    async def announce(self, topics: Iterable[str], *, every_master: bool = False) -> None:
        """Make this instance's groups known at once (a producer's start): fetch the routes of
        `topics` (kept refreshed from now on) and, if `every_master`, learn every master the
        name servers know, then heartbeat every known broker. Failures are logged: the timers
        retry them."""
        for topic in topics:
            self.watch_topic(topic)
            try:
                await self.route(topic)
            except (ClientError, BrokerError) as exc:
                logger.warning("%s: route of %s at start: %s", self.client_id, topic, exc)
        if every_master:
            try:
                await self._learn_masters()
            except (ClientError, BrokerError) as exc:
                logger.warning("%s: cluster info at start: %s", self.client_id, exc)
        await self.heartbeat()

    async def _learn_masters(self) -> None:
        """Add every broker the name servers know to the address table (heartbeats reach them)."""
        cmd = RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
        response = await self.invoke_namesrv(cmd, self.request_timeout_ms, ask_next=no_brokers)
        if response.code != ResponseCode.SUCCESS:
            raise error_for_code(response.code, response.remark)
        self.routes.put_brokers(ClusterInfo.from_json(response.body).broker_addr_table.values())

    # -- server-initiated requests ---------------------------------------------------------

    async def _on_notify_ids_changed(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        header = NotifyConsumerIdsChangedRequestHeader.from_fields(request.ext_fields)
        consumer = self._consumers.get(header.consumer_group)
        if consumer is not None:
            logger.info("%s: consumer ids of %s changed", self.client_id, header.consumer_group)
            consumer.trigger_rebalance()
        return None

    async def _on_check_transaction(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        header = CheckTransactionStateRequestHeader.from_fields(request.ext_fields)
        stored = decode_record(request.body)
        broker_addr = f"{connection.peer[0]}:{connection.peer[1]}"
        broker_name = self.routes.broker_name_of(broker_addr) or ""
        message = MessageExt.from_stored(stored, broker_name)
        group = message.properties.get(pm.PGROUP, "")
        producer = self._producers.get(group)
        if producer is None:
            logger.warning("%s: check-back for unknown producer group %r", self.client_id, group)
            return None
        await producer.on_check_transaction_state(broker_addr, header, message)
        return None


class _Action(Protocol):
    __name__: str

    async def __call__(self) -> None: ...


def no_brokers(response: RemotingCommand) -> bool:
    """A cluster-info answer naming no broker: that name server may have just restarted."""
    if response.code != ResponseCode.SUCCESS:
        return False
    return not ClusterInfo.from_json(response.body).broker_addr_table


def _no_route(response: RemotingCommand) -> bool:
    """A name server that knows no route may have restarted since the broker registered."""
    return response.code == ResponseCode.TOPIC_NOT_EXIST


def _copy(cmd: RemotingCommand) -> RemotingCommand:
    # A command is not reusable while in flight (request() assigns its opaque); retries copy it.
    return RemotingCommand(
        code=cmd.code,
        ext_fields=dict(cmd.ext_fields),
        body=cmd.body,
        remark=cmd.remark,
        language=cmd.language,
        version=cmd.version,
        serialize_type=cmd.serialize_type,
    )
