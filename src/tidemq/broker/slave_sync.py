"""SlaveSync: a slave's copy of its master's metadata, over ordinary remoting (RocketMQ's
SlaveSynchronize, every slaveSyncIntervalMs instead of a fixed 10 s).

    every interval, when the master's address is known (registration's answer):
        GET_ALL_TOPIC_CONFIG (21)              ─▶ TopicTable.replace_all (by data version)
        GET_ALL_CONSUMER_OFFSET (43)           ─▶ ConsumerOffsetTable.copy_from_master (per
                                                  topic@group; pairs only the slave has stay)
        GET_ALL_DELAY_OFFSET (45)              ─▶ ScheduleService.replace_progress
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) ─▶ SubscriptionGroupTable.replace_all
    the four requests go out together; each has its own timeout (SLAVE_SYNC_TIMEOUT_MS)

The transaction check-back's progress lives in the consumer offset table (its op queue's
offset), so it travels with 43.

A failed copy (the master down, a timeout, an error answer, a body that does not parse) changes
nothing of that table: the slave keeps serving the last tables it copied, and says so in one
line per LogLimit window (a master that is down for an hour makes a few lines, not 3600). The
other tables of the round are still applied: each is a replacement on its own.

Staleness bound: a change on the master is on the slave at most one interval plus one round
trip (the request, the master's answer, the apply) after it is made, while the master answers:
the round that started just before the change misses it, the next one starts one interval after
that round ended. tests/broker/test_slave_sync.py measures it: at an interval of 100 ms on
loopback the observed lag of five changes was 69-119 ms (the round itself, four requests sent
together, takes a few ms; the test's polling adds up to 10 ms). With the default 1 s interval,
consumer offsets on a slave are at most about 1 s old when clients switch to it, which bounds
the duplicates a consumer sees after the master is lost: what it consumed in that window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import ScheduleService
from tidemq.broker.service import PeriodicService
from tidemq.broker.topics import TopicTable
from tidemq.clock import Clock
from tidemq.errors import ProtocolError, QueueError
from tidemq.protocol.bodies import TopicConfigSerializeWrapper
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.log_limit import LogLimit

log = logging.getLogger(__name__)

# One request of a copy round waits this long for the master's answer: beyond it the master is
# as good as down, and the round's other tables are still applied.
SLAVE_SYNC_TIMEOUT_MS: Final = 3_000

_CODES: Final = (
    RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_ALL_CONSUMER_OFFSET,
    RequestCode.GET_ALL_DELAY_OFFSET,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
)


class SlaveSync:
    """Copies topics, consumer offsets, delay progress and subscription groups from the master."""

    def __init__(
        self,
        client: RemotingClient,
        topics: TopicTable,
        groups: SubscriptionGroupTable,
        offsets: ConsumerOffsetTable,
        schedule: ScheduleService,
        clock: Clock,
        *,
        interval_ms: int,
        timeout_ms: int = SLAVE_SYNC_TIMEOUT_MS,
    ) -> None:
        self._client = client
        self._clock = clock
        self._timeout_ms = timeout_ms
        self._apply: dict[int, Callable[[bytes], object]] = {
            RequestCode.GET_ALL_TOPIC_CONFIG: lambda body: topics.replace_all(
                TopicConfigSerializeWrapper.from_json(body)
            ),
            RequestCode.GET_ALL_CONSUMER_OFFSET: offsets.copy_from_master,
            RequestCode.GET_ALL_DELAY_OFFSET: schedule.replace_progress,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: groups.replace_all,
        }
        assert set(self._apply) == set(_CODES)
        self._periodic = PeriodicService("slave-sync", interval_ms, self.sync_once)
        self._failures = LogLimit(log, clock)
        self._master_addr: str | None = None
        self.rounds = 0
        # Wall time (ms) of the last round that applied every table; 0 before the first.
        self.last_synced_ms = 0

    @property
    def master_addr(self) -> str | None:
        return self._master_addr

    def set_master(self, master_addr: str | None) -> None:
        """The master's client address (registration's masterAddr); None: unknown."""
        if master_addr != self._master_addr:
            log.info("slave copies metadata from master %s", master_addr or "(none known)")
            self._master_addr = master_addr
            if master_addr is not None:
                self._periodic.trigger()

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def sync_once(self) -> bool:
        """One copy round; True when every table was copied (see the module doc)."""
        addr = self._master_addr
        if addr is None:
            return False
        self.rounds += 1
        answers = await asyncio.gather(*(self._fetch(addr, code) for code in _CODES))
        failed = [
            f"{RequestCode(code).name}: {problem}"
            for code, problem in zip(_CODES, answers, strict=True)
            if problem is not None
        ]
        if failed:
            age = (
                f"{(self._clock.now_ms() - self.last_synced_ms) / 1000:.1f} s old"
                if self.last_synced_ms
                else "never copied"
            )
            self._failures.warning(
                "copying metadata from master %s failed (%s); serving the last tables (%s)",
                addr,
                "; ".join(failed),
                age,
            )
            return False
        self.last_synced_ms = self._clock.now_ms()
        return True

    async def _fetch(self, addr: str, code: int) -> str | None:
        """Request one table from `addr` and apply it; what went wrong, or None."""
        request = RemotingCommand(code=code, language="JAVA")
        try:
            response = await self._client.invoke(addr, request, self._timeout_ms)
        except (QueueError, OSError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        if response.code != ResponseCode.SUCCESS:
            return f"answered {response.code}: {response.remark}"
        try:
            self._apply[code](response.body)
        except (ProtocolError, ValueError) as exc:
            return f"bad body: {exc}"
        return None
