"""InSync: the controller-mode acknowledgement of a master (RocketMQ 5's allAckInSyncStateSet).

The controller names a sync set: replica ids that each hold every acknowledged message, so any
of them can be elected without losing one (spec ha.md §2, allAckInSyncStateSet=true). The
master is one of them (`self_id`); the others are its slaves, known by their AUTH's replica id.

    acks: {replica id: best acked of its streaming links}        (HAMaster builds it per event)
                │
                ├─▶ floor   = min(acks[id] for the others and the joining)  ──▶ AckWaiters.release
                │             (one with no streaming link: -1, so nothing is released;
                │              nobody but the master: UNBOUNDED, every waiter released at once)
                ├─▶ confirm = min(known[id] for the others, acks of the joining, log end)
                │             (known: the last acked a member reported, kept while it is away)
                └─▶ caught_at[id]: the last moment the member had the whole log
                       lagging(max_ms): members whose caught_at is older than max_ms

Joining the set (the member CASes syncSet, HAMaster only proposes):

    streaming, outside the set, lag <= join_gap ──join()──▶ JOINING, floor = confirmed
                                                              │  counted by floor and confirm
                                                              │  like a member (stricter: safe)
           caught_up(): acked >= its floor ◀──────────────────┤
           change(ids with it): a member                      │
           prune(): no link, lag > 4 x join_gap, or JOINING ──┘ longer than join_time_ms:
                    dropped at once (it must not hold acks); it may join again once it
                    reports past what it had then (a stuck one would hold acks again)

Why JOINING: a replica may enter syncSet only when it holds every message ever acknowledged.
"acked >= confirm" is a target that moves: with the master alone in the set, confirm is the log
end and under steady load a slave's reports always trail it, so it would never rejoin. Once a
replica counts for acks, every later acknowledgement waits for it; what was acknowledged before
ends at or below the highest confirm offset told then (HAMaster tells it before it answers), so
that fixed `floor` is all it must reach. A joiner holds acks back at most join_time_ms (the
controller's haMaxTimeSlaveNotCatchup, below syncFlushTimeout): a stuck one never fails sends.

Why the two minimums differ: a send is acknowledged only on what the live links report (one
that is away is waited for until the set shrinks without it: no SLAVE_NOT_AVAILABLE shortcut),
while visibility counts what a member last reported even while it reconnects: that data is on
it, and hiding it again would only stall consumers. A joiner without a link counts for neither:
it is being dropped.

Catch-up is tracked per member without sampling: each append pass ends the "caught up" moment of
every member whose acked covered the log before it (so an idle slave that reports once per
heartbeat interval is never seen as lagging), each report starts one when the member has
everything, and a member that vanishes keeps the time it last had everything (at latest the
moment it vanished). A member that never streamed since it joined counts from `change` on.

Pure bookkeeping (no I/O, no asyncio): HAMaster calls it on the loop and applies the results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

# The floor when the set is the master alone: every end is covered.
UNBOUNDED: Final = 1 << 63
# The floor's value for a member without a streaming link: no end is covered by it.
ABSENT: Final = -1
# A joiner further behind than this many join gaps is dropped: it would hold acks too long.
# (It starts within one gap: the margin keeps a burst of appends from dropping it at once.)
JOIN_DROP_GAPS: Final = 4
# The longest a replica stays JOINING without being CASed in, until `lagging` says the
# controller's (haMaxTimeSlaveNotCatchup's default).
JOIN_TIME_MS_DEFAULT: Final = 3_000


@dataclass(slots=True)
class Joiner:
    """A replica counted for acks before it is in the set."""

    floor: int  # the highest confirm offset told when it began: every acknowledged end <= it
    since_ms: float  # monotonic


class InSync:
    """The sync set of a controller-mode master and what follows from it (module doc).

    Args:
        self_id: this master's replica id.
        log_end: the log end now.
        join_gap: the lag (log end - acked) at most at which a replica starts JOINING (the HA
            window: a slave streaming at full speed is within it).
    """

    __slots__ = (
        "_caught_at",
        "_known",
        "_left",
        "join_gap",
        "join_time_ms",
        "joining",
        "log_end",
        "others",
        "self_id",
    )

    def __init__(self, self_id: int, log_end: int, join_gap: int) -> None:
        self.self_id = self_id
        self.others: frozenset[int] = frozenset()
        # The log end as of the last append pass HAMaster saw (the catch-up reference).
        self.log_end = log_end
        self._known: dict[int, int] = {}  # member → the last acked it reported
        self._caught_at: dict[int, float] = {}  # member → last monotonic ms it had the log
        self.join_gap = join_gap
        self.join_time_ms: float = JOIN_TIME_MS_DEFAULT
        self.joining: dict[int, Joiner] = {}
        self._left: dict[int, int] = {}  # dropped joiner → its acked then (ABSENT: no link)

    def change(
        self, ids: frozenset[int], self_id: int, acks: Mapping[int, int], now_ms: float
    ) -> None:
        """Take a new sync set. A member new to it starts its catch-up clock now (a member
        with no link is lagging `max_ms` after it joined, not before). A joiner in it is a
        member now; one left out stays JOINING (the member may still be CASing it in)."""
        self.self_id = self_id
        others = frozenset(ids - {self_id})
        for member in others - self.others:
            self._caught_at[member] = now_ms
            if member in acks:
                self._known[member] = acks[member]
        for gone in self.others - others:
            self._caught_at.pop(gone, None)
            self._known.pop(gone, None)
        self.others = others
        for member in (*others, self_id):
            self.joining.pop(member, None)

    def floor(self, acks: Mapping[int, int]) -> int:
        """The highest end every other member's and every joiner's streaming link has
        acknowledged."""
        if not self.others and not self.joining:
            return UNBOUNDED
        return min(acks.get(replica, ABSENT) for replica in (*self.others, *self.joining))

    def confirm(self, acks: Mapping[int, int], log_end: int) -> int:
        """min(each other member's acked, live or last known; each joiner's live acked; the
        log end)."""
        known = self._known
        confirm = log_end
        for member in self.others:
            acked = acks.get(member)
            if acked is not None:
                known[member] = acked
            confirm = min(confirm, known.get(member, 0))
        for joiner in self.joining:
            confirm = min(confirm, acks.get(joiner, confirm))  # no link: being dropped
        return confirm

    def reported(self, replica_id: int, acked: int, now_ms: float) -> None:
        """A streaming link of `replica_id` reported `acked` (or started streaming at it)."""
        if replica_id in self.others:
            self._known[replica_id] = acked
            if acked >= self.log_end:
                self._caught_at[replica_id] = now_ms

    def appended(self, acks: Mapping[int, int], end: int, now_ms: float) -> None:
        """The log grew to `end`: members that had all of it before were caught up until now."""
        before = self.log_end
        for member in self.others:
            if acks.get(member, ABSENT) >= before:
                self._caught_at[member] = now_ms
        self.log_end = end

    def lost(self, replica_id: int, acked: int, now_ms: float) -> None:
        """A member's link is gone: its clock keeps the last moment it had the whole log."""
        self.reported(replica_id, acked, now_ms)

    def lagging(
        self, acks: Mapping[int, int], log_end: int, max_ms: float, now_ms: float
    ) -> frozenset[int]:
        """Other members that have not had the whole log at any moment of the last `max_ms`.
        `max_ms` (the controller's haMaxTimeSlaveNotCatchup) also bounds a joiner's time."""
        self.join_time_ms = max_ms
        late: list[int] = []
        for member in self.others:
            if acks.get(member, ABSENT) >= log_end:
                self._caught_at[member] = now_ms
            elif now_ms - self._caught_at.get(member, now_ms) > max_ms:
                late.append(member)
        return frozenset(late)

    # --- joining --------------------------------------------------------------------------------

    def join(self, acks: Mapping[int, int], log_end: int, confirmed: int, now_ms: float) -> None:
        """Streaming replicas outside the set within `join_gap` of `log_end` start JOINING.
        `confirmed`: the highest confirm offset told (ConfirmListeners.confirmed), which every
        acknowledged end is at or below. Call it before releasing waiters on `floor`. One
        dropped before joins again only once it has reported past what it had then, or holds
        the whole log (an idle group must regain its set after, say, an etcd outage)."""
        for replica, acked in acks.items():
            if replica in self.others or replica == self.self_id or replica in self.joining:
                continue
            moved_on = acked > self._left.get(replica, ABSENT - 1) or acked >= log_end
            if log_end - acked <= self.join_gap and moved_on:
                self.joining[replica] = Joiner(confirmed, now_ms)
                self._left.pop(replica, None)
                log.info(
                    "HA replica %d starts joining the sync set: acked %d, %d bytes behind; "
                    "caught up at %d",
                    replica,
                    acked,
                    log_end - acked,
                    confirmed,
                )

    def prune(self, acks: Mapping[int, int], log_end: int, now_ms: float) -> None:
        """Drop the joiners that must no longer hold acks back (module doc)."""
        for replica, joiner in list(self.joining.items()):
            acked = acks.get(replica)
            why = self._why_drop(joiner, acked, log_end, now_ms)
            if why is not None:
                del self.joining[replica]
                self._left[replica] = ABSENT if acked is None else acked
                log.info("HA replica %d dropped from joining the sync set: %s", replica, why)

    def _why_drop(
        self, joiner: Joiner, acked: int | None, log_end: int, now_ms: float
    ) -> str | None:
        if acked is None:
            return "disconnected"
        if log_end - acked > JOIN_DROP_GAPS * self.join_gap:
            return f"{log_end - acked} bytes behind (limit {JOIN_DROP_GAPS * self.join_gap})"
        if now_ms - joiner.since_ms >= self.join_time_ms:
            return f"not in the sync set after {now_ms - joiner.since_ms:.0f} ms"
        return None

    def join_due_ms(self, now_ms: float) -> float | None:
        """Milliseconds from `now_ms` until the oldest joiner's time is up (None: nobody is
        joining): `prune` must run then even if nothing else happens."""
        if not self.joining:
            return None
        oldest = min(joiner.since_ms for joiner in self.joining.values())
        return oldest + self.join_time_ms - now_ms

    def caught_up(self, acks: Mapping[int, int]) -> frozenset[int]:
        """Joiners that hold everything acknowledged before they joined (acked >= their
        floor); every acknowledgement since waited for them, so each holds every acknowledged
        message and may be CASed into syncSet. Call `prune` first."""
        return frozenset(
            replica
            for replica, joiner in self.joining.items()
            if acks.get(replica, ABSENT) >= joiner.floor
        )


class ConfirmListeners:
    """The confirm offset's listeners, told each advance once (never a step back: a member that
    rejoins lower would hide records consumers may already have read)."""

    __slots__ = ("_listeners", "confirmed")

    def __init__(self) -> None:
        self._listeners: list[Callable[[int], None]] = []
        self.confirmed = 0  # the highest confirm offset told

    def add(self, fn: Callable[[int], None]) -> None:
        """Also told the current confirm offset at once, if any (a listener added after the
        first advance must not wait for the next one)."""
        self._listeners.append(fn)
        if self.confirmed:
            fn(self.confirmed)

    def advance(self, confirm: int) -> None:
        if confirm <= self.confirmed:
            return
        self.confirmed = confirm
        for listener in self._listeners:
            try:
                listener(confirm)
            except Exception:  # a listener's bug must not stop acks or the others
                log.exception("confirm offset listener %r failed", listener)


def best_acks(links: Iterable[tuple[int, int]]) -> dict[int, int]:
    """(replica id, acked) of each streaming link → replica id → its best acked (a replica
    that reconnects has two links for a moment)."""
    acks: dict[int, int] = {}
    for replica, acked in links:
        if acks.get(replica, ABSENT) < acked:
            acks[replica] = acked
    return acks
