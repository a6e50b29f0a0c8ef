"""Who is connected: producer and consumer groups from HEART_BEAT, and orderly-consumption locks.

A registration maps a group to the connections (channels) of its clients, with each client's id
and, for consumers, the group's subscriptions. It lives as long as heartbeats keep coming: a
registration silent for channelExpiredTimeout (120 s) is dropped by `expire()`, and closing the
connection drops every registration made over it at once (remoting.md §4.4).

When a consumer group's membership or subscriptions change, every connection of the group gets a
oneway NOTIFY_CONSUMER_IDS_CHANGED (40, flag 2) so C++ and Java clients rebalance immediately
(§4.6); ali-ons ignores it and rebalances on its own 10 s timer.

Queue locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, §4.10) are kept per (group, queue): a lock belongs to
one client id and expires 60 s after its last renewal, so a crashed orderly consumer cannot hold
a queue for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from tidemq.clock import Clock
from tidemq.limits import CLIENT_EXPIRY_MS, QUEUE_LOCK_EXPIRY_MS
from tidemq.protocol.bodies import MessageQueue, SubscriptionData
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import NotifyConsumerIdsChangedRequestHeader
from tidemq.remoting.connection import Connection

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ClientChannel:
    """One client process as seen over one connection."""

    connection: Connection
    client_id: str
    language: str
    version: int
    last_update_ms: float
    # The AccessKey its heartbeat was signed with (under ACL: authenticated by the hook).
    access_key: str | None = None


@dataclass(slots=True)
class ConsumerGroupInfo:
    group_name: str
    consume_type: str
    message_model: str
    consume_from_where: str
    channels: dict[Connection, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values()})


ConsumerIdsListener = Callable[[str, list[Connection]], None]


class ClientRegistry:
    """Producer and consumer registrations. Single-threaded (the event loop)."""

    def __init__(
        self,
        clock: Clock,
        *,
        expiry_ms: float = CLIENT_EXPIRY_MS,
        on_consumer_ids_changed: ConsumerIdsListener | None = None,
    ) -> None:
        self._clock = clock
        self._expiry_ms = expiry_ms
        self._on_ids_changed = on_consumer_ids_changed
        self._consumers: dict[str, ConsumerGroupInfo] = {}
        self._producers: dict[str, dict[Connection, ClientChannel]] = {}

    # -- consumers -----------------------------------------------------------------------------

    def register_consumer(
        self,
        group: str,
        channel: ClientChannel,
        *,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: Sequence[SubscriptionData],
        notify: bool = True,
    ) -> bool:
        """Record a consumer heartbeat. Returns True when ids or subscriptions changed."""
        info = self._consumers.get(group)
        if info is None:
            info = ConsumerGroupInfo(group, consume_type, message_model, consume_from_where)
            self._consumers[group] = info
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        previous = info.channels.get(channel.connection)
        ids_changed = previous is None or previous.client_id != channel.client_id
        info.channels[channel.connection] = channel
        subs_changed = self._update_subscriptions(info, subscriptions)
        changed = ids_changed or subs_changed
        if changed:
            log.info(
                "consumer group %s: %s (%s)",
                group,
                f"client {channel.client_id} joined" if ids_changed else "subscriptions changed",
                channel.connection.peer_text,
            )
            if notify:
                self._notify(group)
        return changed

    @staticmethod
    def _update_subscriptions(
        info: ConsumerGroupInfo, subscriptions: Sequence[SubscriptionData]
    ) -> bool:
        # The newest heartbeat states the whole subscription set (as RocketMQ): topics missing
        # from it are dropped. A changed expression is a change; a newer subVersion alone is not.
        new = {s.topic: s for s in subscriptions}
        changed = set(new) != set(info.subscriptions) or any(
            info.subscriptions[t].sub_string != s.sub_string for t, s in new.items()
        )
        for topic, sub in new.items():
            old = info.subscriptions.get(topic)
            if (
                old is None
                or sub.sub_version >= old.sub_version
                or sub.sub_string != old.sub_string
            ):
                info.subscriptions[topic] = sub
        for topic in set(info.subscriptions) - set(new):
            del info.subscriptions[topic]
        return changed

    def unregister_consumer(
        self, group: str, connection: Connection, *, notify: bool = True
    ) -> None:
        info = self._consumers.get(group)
        if info is None or info.channels.pop(connection, None) is None:
            return
        log.info("consumer group %s: %s left", group, connection.peer_text)
        if not info.channels:
            del self._consumers[group]
        elif notify:
            self._notify(group)

    def consumer_group(self, group: str) -> ConsumerGroupInfo | None:
        return self._consumers.get(group)

    def consumer_groups(self) -> list[str]:
        return sorted(self._consumers)

    def consumer_ids(self, group: str) -> list[str]:
        info = self._consumers.get(group)
        return info.client_ids() if info is not None else []

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self._consumers.get(group)
        return info.subscriptions.get(topic) if info is not None else None

    def groups_subscribing(self, topic: str) -> list[str]:
        return sorted(g for g, info in self._consumers.items() if topic in info.subscriptions)

    # -- producers -----------------------------------------------------------------------------

    def register_producer(self, group: str, channel: ClientChannel) -> None:
        channels = self._producers.setdefault(group, {})
        if channel.connection not in channels:
            log.info("producer group %s: client %s joined", group, channel.client_id)
        channels[channel.connection] = channel

    def unregister_producer(self, group: str, connection: Connection) -> None:
        channels = self._producers.get(group)
        if channels is None or channels.pop(connection, None) is None:
            return
        log.info("producer group %s: %s left", group, connection.peer_text)
        if not channels:
            del self._producers[group]

    def producer_channels(self, group: str) -> list[ClientChannel]:
        """Live producer channels of a group (transaction check-back picks one)."""
        return list(self._producers.get(group, {}).values())

    def producer_groups(self) -> list[str]:
        return sorted(self._producers)

    # -- lifecycle ---------------------------------------------------------------------------

    def connection_closed(self, connection: Connection) -> None:
        """Drop every registration made over `connection` (its close listener)."""
        for group in [g for g, chans in self._producers.items() if connection in chans]:
            self.unregister_producer(group, connection)
        for group in [g for g, info in self._consumers.items() if connection in info.channels]:
            self.unregister_consumer(group, connection)

    def expire(self) -> int:
        """Drop registrations without a heartbeat for expiry_ms. Returns how many were dropped."""
        deadline = self._clock.monotonic_ms() - self._expiry_ms
        dropped = 0
        for group, channels in list(self._producers.items()):
            for conn, chan in list(channels.items()):
                if chan.last_update_ms < deadline:
                    log.warning("producer %s of %s expired (no heartbeat)", chan.client_id, group)
                    self.unregister_producer(group, conn)
                    dropped += 1
        for group, info in list(self._consumers.items()):
            for conn, chan in list(info.channels.items()):
                if chan.last_update_ms < deadline:
                    log.warning("consumer %s of %s expired (no heartbeat)", chan.client_id, group)
                    self.unregister_consumer(group, conn)
                    dropped += 1
        return dropped

    def _notify(self, group: str) -> None:
        info = self._consumers.get(group)
        if self._on_ids_changed is None or info is None:
            return
        self._on_ids_changed(group, list(info.channels))


class ConsumerIdsNotifier:
    """Sends NOTIFY_CONSUMER_IDS_CHANGED (oneway) to the connections of a group, in the background.

    A notification is best effort: a failed write is logged, since the client rebalances on its
    own timer anyway.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, group: str, connections: list[Connection]) -> None:
        for connection in connections:
            task = asyncio.get_running_loop().create_task(self._send(group, connection))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _send(group: str, connection: Connection) -> None:
        header = NotifyConsumerIdsChangedRequestHeader(consumer_group=group)
        cmd = RemotingCommand(
            code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
            ext_fields=header.to_fields(),
            language="JAVA",
        )
        try:
            await connection.oneway(cmd)
        except Exception as exc:
            log.info("could not notify %s of group %s change: %s", connection.peer_text, group, exc)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


# Queue locks held at once. An orderly consumer holds one per queue assigned to it, so this is
# (queues x groups using orderly consumption); 100,000 covers large clusters while bounding what
# clients inventing groups or queues can make the broker hold (a lock is ~200 bytes).
QUEUE_LOCKS_MAX: Final = 100_000


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_update_ms: float
    connection: Connection | None = None


class QueueLockTable:
    """Per (group, queue) locks for orderly consumers; a lock expires `expiry_ms` after renewal.

    Bounded by `locks_max`; expired locks are swept by the client-expiry service, and a lock goes
    with the connection it was last renewed on (the client re-locks on its new connection).
    """

    def __init__(
        self,
        clock: Clock,
        expiry_ms: float = QUEUE_LOCK_EXPIRY_MS,
        *,
        locks_max: int = QUEUE_LOCKS_MAX,
    ) -> None:
        self._clock = clock
        self._expiry_ms = expiry_ms
        self._locks_max = locks_max
        self._locks: dict[str, dict[MessageQueue, _Lock]] = {}
        self._count = 0
        self._watched: set[Connection] = set()
        self.refused = 0

    @property
    def count(self) -> int:
        return self._count

    def _live(self, lock: _Lock | None, now: float) -> bool:
        return lock is not None and now - lock.last_update_ms <= self._expiry_ms

    def lock_batch(
        self,
        group: str,
        queues: Iterable[MessageQueue],
        client_id: str,
        connection: Connection | None = None,
    ) -> set[MessageQueue]:
        """Lock or renew each queue for `client_id`; returns those it now holds."""
        now = self._clock.monotonic_ms()
        table = self._locks.setdefault(group, {})
        held: set[MessageQueue] = set()
        for mq in queues:
            lock = table.get(mq)
            if lock is not None and self._live(lock, now) and lock.client_id != client_id:
                continue
            if lock is None:
                if self._count >= self._locks_max and self.sweep() == 0:
                    self.refused += 1
                    if self.refused % 1000 == 1:
                        log.warning("queue lock table full (%d locks)", self._count)
                    continue
                self._count += 1
            if lock is None or lock.client_id != client_id:
                log.info("group %s: %s locked by %s", group, mq, client_id)
            table[mq] = _Lock(client_id, now, connection)
            held.add(mq)
        if not table:
            del self._locks[group]
        if connection is not None and held and connection not in self._watched:
            self._watched.add(connection)
            connection.add_close_listener(self._on_close)
        return held

    def sweep(self) -> int:
        """Drop expired locks; returns how many (the client-expiry service calls this)."""
        now = self._clock.monotonic_ms()
        return self._drop(lambda lock: not self._live(lock, now))

    def _on_close(self, connection: Connection) -> None:
        self._watched.discard(connection)
        dropped = self._drop(lambda lock: lock.connection is connection)
        if dropped:
            log.info("dropped %d queue locks of closed %s", dropped, connection.peer_text)

    def _drop(self, doomed: Callable[[_Lock], bool]) -> int:
        dropped = 0
        for group, table in list(self._locks.items()):
            for mq in [mq for mq, lock in table.items() if doomed(lock)]:
                del table[mq]
                dropped += 1
            if not table:
                del self._locks[group]
        self._count -= dropped
        return dropped

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> None:
        table = self._locks.get(group)
        if table is None:
            return
        for mq in queues:
            lock = table.get(mq)
            if lock is not None and lock.client_id == client_id:
                del table[mq]
                self._count -= 1
                log.info("group %s: %s unlocked by %s", group, mq, client_id)
        if not table:
            del self._locks[group]

    def holder(self, group: str, mq: MessageQueue) -> str | None:
        lock = self._locks.get(group, {}).get(mq)
        now = self._clock.monotonic_ms()
        return lock.client_id if lock is not None and self._live(lock, now) else None
