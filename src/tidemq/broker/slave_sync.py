"""SlaveSync: a slave's copy of its master's metadata, over ordinary remoting (RocketMQ's
SlaveSynchronize, every slaveSyncIntervalMs instead of a fixed 10 s).

    every interval, when the master's address is known (registration's answer):
        GET_ALL_TOPIC_CONFIG (21)              ─▶ TopicTable.replace_all (by data version)
        GET_ALL_CONSUMER_OFFSET (43)           ─▶ ConsumerOffsetTable.copy_from_master (merged
                                                  per queue id, commits made here kept)
        GET_ALL_DELAY_OFFSET (45)              ─▶ ScheduleService.replace_progress, and its
                                                  "tidemqTimerProgress" key (a TideMQ master's)
                                                  ─▶ TimerWheel.copy_progress (max per bucket)
        43 and 45 wait until this slave's log reaches their "tidemqLogOffset" (below)
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) ─▶ SubscriptionGroupTable.replace_all
    the four requests go out together; each has its own timeout (SLAVE_SYNC_TIMEOUT_MS)
    then, when 43 was copied: UPDATE_CONSUMER_OFFSET (15) to the master for each commit made on
    the slave that the master does not have (broker/offsets.py's rule), OFFSET_PUSHES_AT_ONCE
    at a time; one that fails goes again next round (one line per LogLimit window), one the
    master refuses (no such topic or queue there) is dropped

The transaction check-back's progress lives in the consumer offset table (the half and op
queues' offsets of CID_RMQ_SYS_TRANS), so it travels with 43. The timer wheel's watermarks
travel with 45 so that a slave promoted to master (issue 14) does not deliver again the timers
its old master delivered before the last copy; a slave applies them only once its log holds those
deliveries (broker/timer.py). A RocketMQ master's answer has no such key: the timers' watermarks
then stay as they were.

Progress never ahead of the log. The offsets of 43 and the delay levels' progress of 45 point
into the master's log: a delay level advances once its due message is re-stored, the check-back's
half offset once its halves' op messages or copies are stored, a consumer's once it pulled what
is there. A slave whose log does not hold those records yet, promoted with such a copy, would
never deliver the delayed messages, never check those halves back, and skip the messages its
new master stores at the queue offsets past its log (loss). So a TideMQ master's answers to 43
and 45 carry "tidemqLogOffset": its log end read BEFORE the table (every record the table
points at is below it), and the slave applies such a copy only once its own log reaches it:

    master: L = log end; table ─▶ {"offsetTable":{...},"tidemqLogOffset":L}
    slave:  L <= its log end ─▶ applied now (held older copies of that table are dropped)
            L >  its log end ─▶ held; applied at the start of a later round, or at stop (what
                                a promotion does first), once its log reaches L

Per table at most two copies are held, the oldest and the newest: the oldest is reached first,
so a slave that lags by more than an interval still moves on; the newest is the freshest once
it catches up; the newest reached one is applied and every older one dropped (each is a whole
table). A copy held is checked when it arrives (a bad body is refused then, as an applied one
is). Every held copy (43, 45 and the timer's) is dropped when the master changes, and on every
epoch change (`reset_held`, broker/failover.py; another log: its offsets would mean other
records, and an answer of a round begun before is dropped too), and held copies of 43 when
offsets are pushed (they were read before the push, and the
merge rule would take their older values for a reset). An answer without the key (a RocketMQ
master) is applied at once, as before; the timer's own key has its own hold (broker/timer.py).
A slave that keeps up applies a copy at once or at the next round; after a promotion, a copy it
had not applied yet means duplicates (an older progress), never loss. The slave's log end is
its store's max physical offset (the store its ScheduleService re-stores into). An applied
copy's L goes with it (`replace_progress`, `copy_from_master`): persisted as the log end the
progress covers, it is dropped at load when a truncation (issue 14) cut the log below it.

A failed copy (the master down, a timeout, an error answer, a body that does not parse) changes
nothing of that table: the slave keeps serving the last tables it copied, and says so in one
line per LogLimit window (a master that is down for an hour makes a few lines, not 3600). The
other tables of the round are still applied: each is a replacement on its own.

Staleness bound: a change on the master is on the slave at most one interval plus one round
trip (the request, the master's answer, the apply) after it is made, while the master answers
(for 43 and 45: and the slave's log keeps up, above):
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
from typing import Any, Final

import orjson

from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable, OffsetPush, decode_offsets
from tidemq.broker.persist import quote_int_keys
from tidemq.broker.schedule import ScheduleService, decode_progress
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

# 43's and 45's TideMQ key: the master's log end when it read the table (module doc).
LOG_OFFSET_KEY: Final = "tidemqLogOffset"

# Answers to UPDATE_CONSUMER_OFFSET that no retry changes (the master has no such topic or queue
# any more); others (SYSTEM_BUSY, a timeout) are retried next round.
_PUSH_REFUSALS: Final = frozenset({ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SYSTEM_ERROR})


class HeldCopies:
    """One table's copies that the slave's log has not reached yet (module doc), oldest first:
    at most the oldest and the newest."""

    def __init__(self) -> None:
        self._copies: list[tuple[int, bytes]] = []  # (master's log offset, body)

    def __len__(self) -> int:
        return len(self._copies)

    def hold(self, log_offset: int, body: bytes) -> None:
        self._copies.append((log_offset, body))
        del self._copies[1:-1]

    def take(self, reached: int) -> tuple[int, bytes] | None:
        """The newest copy (log offset, body) whose log offset is at most `reached`, dropped
        with every older one; None when none is reached."""
        due = [i for i, (log_offset, _) in enumerate(self._copies) if log_offset <= reached]
        if not due:
            return None
        copy = self._copies[due[-1]]
        del self._copies[: due[-1] + 1]
        return copy

    def clear(self) -> None:
        self._copies.clear()


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
        # 43 and 45: copies ahead of this slave's log, and how each is applied (module doc).
        self._held: dict[int, HeldCopies] = {
            RequestCode.GET_ALL_CONSUMER_OFFSET: HeldCopies(),
            RequestCode.GET_ALL_DELAY_OFFSET: HeldCopies(),
        }
        # Applied with the log end the copy covers (None: a RocketMQ master's, no key).
        self._apply_now: dict[int, Callable[[bytes, int | None], object]] = {
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._copy_offsets_now,
            RequestCode.GET_ALL_DELAY_OFFSET: schedule.replace_progress,
        }
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
        # Bumped by `reset_held`: an answer of a round begun before is of the old master's log.
        self._generation = 0
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
            self.reset_held()
            if master_addr is not None:
                self._periodic.trigger()

    def reset_held(self) -> None:
        """Drop every copy held for a log offset not reached yet (43, 45 and the timer's), and
        the answers of a round under way: the master or its epoch changed (failover.py calls
        it on every epoch change), and an offset of the old master's log means other records
        in the new one's. Merged once this log passed it, such a copy would point past records
        the new master never had (skipped delayed messages, timers, halves)."""
        self._generation += 1
        for held in self._held.values():
            held.clear()
        if self._timer is not None:
            self._timer.drop_held_copy()

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        """Stop copying; held copies the log has reached are applied first, so the tables a
        promotion starts from are the freshest the log covers."""
        await self._periodic.stop()
        self._pushes = []
        self._apply_reached()

    def held(self, code: int) -> int:
        """Copies of table `code` (43 or 45) held until this slave's log reaches them."""
        return len(self._held[code])

    def _log_end(self) -> int:
        return self._schedule.store.max_physical_offset

    def _apply_reached(self, *codes: int) -> None:
        """Apply the newest held copy of each table (`codes`, default both) that the log now
        reaches; a held copy was checked when it came, so this does not raise."""
        reached = self._log_end()
        for code in codes or tuple(self._held):
            copy = self._held[code].take(reached)
            if copy is not None:
                self._apply_now[code](copy[1], copy[0])

    async def sync_once(self) -> bool:
        """One copy round; True when every table was copied (see the module doc)."""
        addr = self._master_addr
        if addr is None:
            return False
        self.rounds += 1
        self._pushes = []
        self._apply_reached()
        generation = self._generation
        answers = await asyncio.gather(*(self._fetch(addr, code, generation) for code in _CODES))
        if self._pushes:
            await self._push_offsets(addr, self._pushes)
            # Read before the push: applied later, the merge would take their values for a reset.
            self._held[RequestCode.GET_ALL_CONSUMER_OFFSET].clear()
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

    async def _fetch(self, addr: str, code: int, generation: int) -> str | None:
        """Request one table from `addr` and apply it, unless `reset_held` ran meanwhile; what
        went wrong, or None."""
        request = RemotingCommand(code=code, language="JAVA")
        try:
            response = await self._client.invoke(addr, request, self._timeout_ms)
        except (QueueError, OSError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        if generation != self._generation:
            return "the master or its epoch changed during the round: answer dropped"
        if response.code != ResponseCode.SUCCESS:
            return f"answered {response.code}: {response.remark}"
        try:
            self._apply[code](response.body)
        except (ProtocolError, ValueError) as exc:
            return f"bad body: {exc}"
        return None

    def _copy_delays(self, body: bytes) -> None:
        """45: delay levels (now or held), then the timer watermarks (each a table on its own:
        a bad timer key leaves the levels copied)."""
        doc = _parse(body)
        self._copy_or_hold(RequestCode.GET_ALL_DELAY_OFFSET, doc, body, decode_progress)
        progress = doc.get(TIMER_PROGRESS_KEY)
        if self._timer is not None and progress is not None:
            self._timer.copy_progress(progress)

    def _copy_offsets(self, body: bytes) -> None:
        """43: now or held."""
        doc = _parse(body)
        self._copy_or_hold(RequestCode.GET_ALL_CONSUMER_OFFSET, doc, body, decode_offsets)

    def _copy_or_hold(
        self, code: int, doc: dict[str, Any], body: bytes, check: Callable[[bytes], object]
    ) -> None:
        """Apply `body` when the log reaches its key (or it has none), else hold it (module doc).

        Raises:
            ProtocolError: a bad body or key (nothing changes, nothing held).
        """
        log_offset = doc.get(LOG_OFFSET_KEY)
        if log_offset is not None and (type(log_offset) is not int or log_offset < 0):
            raise ProtocolError(f"{LOG_OFFSET_KEY} is not an offset: {log_offset!r}")
        held = self._held[code]
        if log_offset is None or log_offset <= self._log_end():
            # Raises on a bad body before changing anything.
            self._apply_now[code](body, log_offset)
            held.clear()  # older copies: this one supersedes them
            return
        check(body)
        held.hold(log_offset, body)
        self._apply_reached(code)  # the log may have reached an older one meanwhile

    def _copy_offsets_now(self, body: bytes, log_offset: int | None) -> None:
        self._pushes = self._offsets.copy_from_master(body, log_offset).pushes

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


def _parse(body: bytes) -> dict[str, Any]:
    """A table's JSON object (fastjson's unquoted int keys accepted).

    Raises:
        ProtocolError: not a JSON object.
    """
    try:
        doc = orjson.loads(quote_int_keys(body))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProtocolError(f"not a JSON object: {type(doc).__name__}")
    return doc
