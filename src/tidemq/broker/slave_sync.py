"""SlaveSync: a slave's copy of its master's metadata, over ordinary remoting (RocketMQ's
SlaveSynchronize, every slaveSyncIntervalMs instead of a fixed 10 s).

    every interval, when the master's address is known (registration's answer):
        GET_ALL_TOPIC_CONFIG (21)              ─▶ TopicTable.replace_all (by data version)
        GET_ALL_CONSUMER_OFFSET (43)           ─▶ ConsumerOffsetTable.copy_from_master (merged
                                                  per queue id, commits made here kept)
        GET_ALL_DELAY_OFFSET (45)              ─▶ ScheduleService.replace_progress, and its
                                                  "tidemqTimerProgress" key (a TideMQ master's)
                                                  ─▶ TimerWheel.copy_progress (max per bucket)
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) ─▶ SubscriptionGroupTable.replace_all
    the four requests go out together; each has its own timeout (SLAVE_SYNC_TIMEOUT_MS)
    then, when 43 was copied: UPDATE_CONSUMER_OFFSET (15) to the master for each commit made on
    the slave that the master does not have (broker/offsets.py's rule), OFFSET_PUSHES_AT_ONCE
    at a time; one that fails goes again next round (one line per LogLimit window), one the
    master refuses (no such topic or queue there) is dropped

The transaction check-back's progress lives in the consumer offset table (its op queue's
offset), so it travels with 43. The timer wheel's watermarks travel with 45 so that a slave
promoted to master (issue 14) does not deliver again the timers its old master delivered before
the last copy; a slave applies them only once its log holds those deliveries (broker/timer.py).
A RocketMQ master's answer has no such key: the timers' watermarks then stay as they were.

A failed copy (the master down, a timeout, an error answer, a body that does not parse) changes
nothing of that table: the slave keeps serving the last tables it copied, and says so in one
line per LogLimit window (a master that is down for an hour makes a few lines, not 3600). The
other tables of the round are still applied: each is a replacement on its own.

Staleness bound: a change on the master is on the slave at most one interval plus one round
trip (the request, the master's answer, the apply) after it is made, while the master answers:
the round that started just before the change misses it, the next one starts one interval after
that round ended. tests/broker/test_slave_sync.py measures it: at an interval of 100 ms on
loopback the observed lag of five changes was 69-119 ms (the round itself, four requests sent
together, takes a few ms; the test's polling adds up to 10 ms).

Consumer offsets, both ways. A consumer commits what it consumed every
persistConsumerOffsetInterval (5 s by default) to the broker it reads from. So when the master
is lost, a slave's offset is at most that commit interval plus one sync interval (1 s by
default) behind what was consumed; and once the master is back, a commit made on the slave
reaches it at most one interval plus a round trip after the master answers again (the push
above), never replaced by the master's older value. Only a consumer that takes over a queue
reads the broker's offset: a consumer that keeps its queues keeps its own in-memory offsets.
So duplicates from this staleness appear only when queues change owner (a rebalance: consumers
joining or leaving, or a restart), and are at most what was consumed in that window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import orjson

from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable, OffsetPush
from tidemq.broker.persist import quote_int_keys
from tidemq.broker.schedule import ScheduleService
from tidemq.broker.service import PeriodicService
from tidemq.broker.timer import TIMER_PROGRESS_KEY, TimerWheel
from tidemq.broker.topics import TopicTable
from tidemq.clock import Clock
from tidemq.errors import ProtocolError, QueueError
from tidemq.protocol.bodies import TopicConfigSerializeWrapper
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_query import UpdateConsumerOffsetRequestHeader
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.log_limit import LogLimit

log = logging.getLogger(__name__)

# One request of a copy round waits this long for the master's answer: beyond it the master is
# as good as down, and the round's other tables are still applied.
SLAVE_SYNC_TIMEOUT_MS: Final = 3_000
# Commits pushed to the master at once (UPDATE_CONSUMER_OFFSET): a slave that served many groups
# through an outage may have thousands; they go in slices, not as one burst.
OFFSET_PUSHES_AT_ONCE: Final = 32

_CODES: Final = (
    RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_ALL_CONSUMER_OFFSET,
    RequestCode.GET_ALL_DELAY_OFFSET,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
)

# Answers to UPDATE_CONSUMER_OFFSET that no retry changes (the master has no such topic or queue
# any more); others (SYSTEM_BUSY, a timeout) are retried next round.
_PUSH_REFUSALS: Final = frozenset({ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SYSTEM_ERROR})


class SlaveSync:
    """Copies topics, consumer offsets, delay and timer progress and subscription groups from
    the master."""

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
        timer: TimerWheel | None = None,
    ) -> None:
        self._client = client
        self._clock = clock
        self._timeout_ms = timeout_ms
        self._offsets = offsets
        self._schedule = schedule
        self._timer = timer
        self._pushes: list[OffsetPush] = []  # due after this round's copy of 43
        self._apply: dict[int, Callable[[bytes], object]] = {
            RequestCode.GET_ALL_TOPIC_CONFIG: lambda body: topics.replace_all(
                TopicConfigSerializeWrapper.from_json(body)
            ),
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._copy_offsets,
            RequestCode.GET_ALL_DELAY_OFFSET: self._copy_delays,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: groups.replace_all,
        }
        assert set(self._apply) == set(_CODES)
        self._periodic = PeriodicService("slave-sync", interval_ms, self.sync_once)
        self._failures = LogLimit(log, clock)
        self._push_failures = LogLimit(log, clock, lines_max=1)
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
        self._pushes = []
        answers = await asyncio.gather(*(self._fetch(addr, code) for code in _CODES))
        if self._pushes:
            await self._push_offsets(addr, self._pushes)
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

    def _copy_delays(self, body: bytes) -> None:
        """45: delay levels, then the timer watermarks (each a table on its own: a bad timer key
        leaves the levels copied)."""
        self._schedule.replace_progress(body)  # raises on a bad body before changing anything
        if self._timer is None:
            return
        doc = orjson.loads(quote_int_keys(body))  # parsed once already: valid JSON
        progress = doc.get(TIMER_PROGRESS_KEY) if isinstance(doc, dict) else None
        if progress is not None:
            self._timer.copy_progress(progress)

    def _copy_offsets(self, body: bytes) -> None:
        self._pushes = self._offsets.copy_from_master(body).pushes

    async def _push_offsets(self, addr: str, pushes: list[OffsetPush]) -> None:
        """Send the slave's pending commits to the master (module doc)."""
        failed: list[str] = []
        for start in range(0, len(pushes), OFFSET_PUSHES_AT_ONCE):
            chunk = pushes[start : start + OFFSET_PUSHES_AT_ONCE]
            answers = await asyncio.gather(*(self._push(addr, push) for push in chunk))
            failed.extend(problem for problem in answers if problem is not None)
        if failed:
            self._push_failures.warning(
                "pushing %d of %d consumer offsets committed on this slave to master %s failed "
                "(first: %s); they go again next round",
                len(failed),
                len(pushes),
                addr,
                failed[0],
            )

    async def _push(self, addr: str, push: OffsetPush) -> str | None:
        """One UPDATE_CONSUMER_OFFSET to the master; what went wrong (to retry), or None."""
        header = UpdateConsumerOffsetRequestHeader(
            consumer_group=push.group,
            topic=push.topic,
            queue_id=push.queue_id,
            commit_offset=push.offset,
        )
        request = RemotingCommand(
            code=RequestCode.UPDATE_CONSUMER_OFFSET, language="JAVA", ext_fields=header.to_fields()
        )
        try:
            response = await self._client.invoke(addr, request, self._timeout_ms)
        except (QueueError, OSError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        if response.code == ResponseCode.SUCCESS:
            self._offsets.pushed(push)
        elif response.code in _PUSH_REFUSALS:
            self._offsets.push_refused(push)
            self._push_failures.warning(
                "master %s refused the offset %d of %s@%s queue %d committed on this slave "
                "(%s: %s); dropped",
                addr,
                push.offset,
                push.topic,
                push.group,
                push.queue_id,
                response.code,
                response.remark,
            )
        else:
            return f"answered {response.code}: {response.remark}"
        return None
