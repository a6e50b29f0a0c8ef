"""The pull consumer: the caller chooses queues and offsets; nothing runs in the background
except the instance's heartbeat and route refresh.

Used by tools and by the Spark source (through blocking.py), which track offsets themselves and
may store them in the broker with `update_consumer_offset`. `pull` never waits for messages (the
broker answers at once, sysFlag SUBSCRIPTION); `pull_block_if_not_found` lets the broker hold the
request (long polling, sysFlag SUSPEND|SUBSCRIPTION) until a message arrives or `suspend_ms`
passes.

Pulls, offset commits and queries go to the master of the queue's broker group, or to a slave
while the master is gone from the route or does not answer, or to the broker id the last pull
of that queue suggested (client/read_route.py). An offset commit goes to the master whenever
the route lists it, and to a slave only if that request fails; an offset only a slave took is
sent to the master again every second until the master has it (client/slave_offsets.py: a
slave's copy is replaced by the master's older one once the master is back):
`update_consumer_offset` returns False for it and `offsets_on_slave` lists it meanwhile.

A stored record that cannot be decoded (e.g. flagged COMPRESSED but not zlib data) is not in
`PullResult.messages`: it is listed in `PullResult.undecodable`, counted in `undecodable_count`
and logged (rate-limited), and `next_begin_offset` lies past it, so a caller that moves on to
`next_begin_offset` (as it should in every case) and stores that offset commits past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import ClientClosedError, ClientError
from tidemq.limits import PULL_MESSAGE_COUNT_MAX, PULL_SUSPEND_MS_DEFAULT
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import ConsumerData, MessageQueue
from tidemq.protocol.bodies_admin import PROP_CONSUME_TYPE, ConsumerRunningInfo
from tidemq.protocol.headers import PullSysFlag
from tidemq.security.signing import Credentials

from . import api, running_info
from .instance import ClientInstance
from .message import MessageModel, PullResult
from .offset_store import OffsetTable
from .pull_answer import UndecodableLog
from .read_route import PullSuggestions
from .route_cache import subscribe_queues
from .selector import MessageSelector, Selectable
from .slave_offsets import SlaveOffsets
from .tls import TlsOption

# As RocketMQ's consumerTimeoutMillisWhenSuspend (blocking pulls) and a plain pull's timeout.
PULL_TIMEOUT_MS_DEFAULT: Final = 10_000
# Client-side margin over the broker's hold, so the hold's own answer arrives before our timeout.
SUSPEND_MARGIN_MS: Final = 5_000


class PullConsumer:
    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        pull_timeout_ms: int = PULL_TIMEOUT_MS_DEFAULT,
        clock: Clock | None = None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = False,
    ) -> None:
        pm.validate_group(group)
        self._group = group
        self._instance = instance or ClientInstance(
            namesrv_addr,
            clock=clock,
            instance_name=instance_name,
            credentials=credentials,
            tls=tls,
        )
        self.pull_timeout_ms = pull_timeout_ms
        self._undecodable = UndecodableLog(group, self._instance.clock)
        self._pull_from = PullSuggestions()
        self._commits = SlaveOffsets(self._instance, group)
        self._topics: set[str] = set()
        self._started = False
        self._closed = False

    @property
    def group(self) -> str:
        return self._group

    @property
    def instance(self) -> ClientInstance:
        return self._instance

    @property
    def undecodable_count(self) -> int:
        """Records skipped by this consumer's pulls because they could not be decoded."""
        return self._undecodable.count

    @property
    def offsets_on_slave(self) -> dict[MessageQueue, int]:
        """Offsets committed that only a slave holds (its master did not answer or is not in
        the route): each is sent to the master until it takes it (module docstring)."""
        return self._commits.pending()

    async def start(self) -> None:
        if self._started:
            return
        self._instance.register_consumer(self)
        await self._instance.start()
        self._started = True

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self._commits.close()
            await self._instance.unregister_consumer(self._group)
            await self._instance.shutdown()

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"pull consumer {self._group} is shut down")
        if not self._started:
            raise ClientError(f"pull consumer {self._group} is not started")

    # What the instance asks (heartbeat: a CONSUME_ACTIVELY member without subscriptions).
    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            group_name=self._group,
            consume_type=pm.ConsumeType.CONSUME_ACTIVELY,
            message_model=MessageModel.CLUSTERING,
            consume_from_where=pm.ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            subscription_data_set=[],
            unit_mode=False,
        )

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def trigger_rebalance(self) -> None:
        """Pull consumers do not rebalance; the caller picks the queues."""

    # -- queries ---------------------------------------------------------------------------

    def running_info(self) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO's answer: the caller holds the queues and offsets, so only
        the group and the consume type (client/running_info.py)."""
        settings = {PROP_CONSUME_TYPE: "CONSUME_ACTIVELY", "consumerGroup": self._group}
        data = self.consumer_data().subscription_data_set
        return running_info.build(settings, data, {}, OffsetTable())

    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of `topic`, sorted (fresh from the name server)."""
        self._check_open()
        self._topics.add(topic)
        route = await self._instance.route(topic, refresh=True)
        return subscribe_queues(topic, route)

    async def _ensure_route(self, mq: MessageQueue) -> None:
        if not self._instance.routes.addresses(mq.broker_name):
            self._topics.add(mq.topic)
            await self._instance.fetch_route(mq.topic)

    async def pull(
        self, mq: MessageQueue, expression: Selectable, offset: int, max_nums: int
    ) -> PullResult:
        """Up to `max_nums` messages of `mq` from `offset` whose tag matches `expression`, or
        that a `MessageSelector` (e.g. `by_sql("a > 5")`) selects."""
        return await self._pull(mq, expression, offset, max_nums, block=False)

    async def pull_block_if_not_found(
        self,
        mq: MessageQueue,
        expression: Selectable,
        offset: int,
        max_nums: int,
        *,
        suspend_ms: int = PULL_SUSPEND_MS_DEFAULT,
    ) -> PullResult:
        """As `pull`, but the broker holds the request up to `suspend_ms` while nothing is new."""
        return await self._pull(mq, expression, offset, max_nums, block=True, suspend_ms=suspend_ms)

    async def _pull(
        self,
        mq: MessageQueue,
        expression: Selectable,
        offset: int,
        max_nums: int,
        *,
        block: bool,
        suspend_ms: int = 0,
    ) -> PullResult:
        self._check_open()
        if offset < 0 or not 0 < max_nums <= PULL_MESSAGE_COUNT_MAX:
            raise ValueError(f"offset must be >= 0 and max_nums in 1..{PULL_MESSAGE_COUNT_MAX}")
        selector = MessageSelector.of(expression)
        await self._ensure_route(mq)
        sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if block else 0)
        result = await api.pull(
            self._instance,
            mq,
            group=self._group,
            expression=selector.expression,
            expression_type=selector.expression_type,
            offset=offset,
            max_nums=max_nums,
            sys_flag=int(sys_flag),
            suspend_ms=suspend_ms if block else 0,
            timeout_ms=suspend_ms + SUSPEND_MARGIN_MS if block else self.pull_timeout_ms,
            broker_id=self._pull_from.get(mq),
        )
        self._pull_from.update(mq, result.suggest_which_broker_id)
        self._undecodable.record(result.undecodable)
        return result

    async def update_consumer_offset(self, mq: MessageQueue, offset: int) -> bool:
        """Store `offset` (the next to consume) for this group in the queue's broker: True
        when its master took it, False when only a slave did (`offsets_on_slave`; it is sent
        to the master until it takes it)."""
        self._check_open()
        await self._ensure_route(mq)
        return await self._commits.commit(mq, offset)

    async def fetch_consumer_offset(self, mq: MessageQueue) -> int:
        """The group's stored offset for `mq`, or -1 if none."""
        self._check_open()
        await self._ensure_route(mq)
        return await api.query_consumer_offset(self._instance, self._group, mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        self._check_open()
        await self._ensure_route(mq)
        return await api.min_offset(self._instance, mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        self._check_open()
        await self._ensure_route(mq)
        return await api.max_offset(self._instance, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        self._check_open()
        await self._ensure_route(mq)
        return await api.search_offset(self._instance, mq, timestamp_ms)

    async def earliest_store_time(self, mq: MessageQueue) -> int:
        self._check_open()
        await self._ensure_route(mq)
        return await api.earliest_store_time(self._instance, mq)
