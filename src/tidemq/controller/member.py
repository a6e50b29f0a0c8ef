"""GroupMember: one broker's part in its group's failover, decided against etcd.

Every broker of a group runs one. Each decision is taken in one task (`_loop`), on a watch notice,
a lease event or a 200 ms tick, from the last state read (a watch keeps it fresh; a full re-read
comes after every re-watch and every second):

    lease invalid ─────────────────────────────> master: step_down; others: wait for a new lease
    no state, no history here nor in any alive
    peer (after one rank delay) ─ CAS create ──> MASTER of epoch 1 (else hold, log loudly)
    state malformed, or missing (refused) ─────> hold: act on nothing until a valid one is back
    state.master == me, acting ─────────────────> chores: shrink laggards / expand caught-up (CAS)
    state.master == me, not acting (restart) ──> won it before a crash, epoch unrecorded
                                                  (rules.resumes): finish; else elect myself
                                                  for epoch + 1 (CAS)
    acting master, state names another ────────> step_down (deposed), then follow
    master alive ───────────────────────────────> SLAVE: become_slave(state) once per epoch
    master gone (no master / its alive key gone):
        me in syncSet, alive, last_epoch() == epoch ─ wait rank x 500 ms, re-read, stop
                                                      replicating, note standing, CAS elect
        otherwise ─────────────── wait (no unclean election)

Why this is safe (ARCHITECTURE.md has the whole argument): a master acknowledges only what every
syncSet member holds; a candidate is in syncSet and stops replicating before its CAS, so after
the CAS the old master can acknowledge nothing more, and what it did acknowledge the candidate
holds. Two CASes from the same read cannot both win. A master whose lease lapses stops
acknowledging (LeaseKeeper.valid) before its alive key can expire and a successor be elected.

Errors from the Replica's callbacks are logged and the decision is retried on the next tick: the
loop outlives any one failure, as a controller must.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import Final

from tidemq.clock import Clock
from tidemq.controller.etcd import EtcdSession, Notice
from tidemq.controller.lease import LeaseKeeper
from tidemq.controller.replica import Replica
from tidemq.controller.rules import create_refusal, data_refusal, resumes, stand_refusal
from tidemq.controller.state import (
    NO_MASTER,
    Addrs,
    AliveRecord,
    ControllerError,
    EtcdUnavailable,
    GroupState,
    alive_id,
    alive_key,
    alive_prefix,
    group_prefix,
    state_key,
)

__all__ = ["GroupMember", "Replica", "Role"]

log = logging.getLogger(__name__)

RANK_DELAY_MS: Final = 500
CHORE_INTERVAL_S: Final = 0.2
REFRESH_INTERVAL_S: Final = 1.0
# After an unexpected failure of the watch task, before it watches again.
WATCH_RESTART_S: Final = 0.5
# GroupMember._hold while etcd has no state key.
MISSING: Final = "missing"


class Role(enum.Enum):
    STARTING = "starting"  # no decision taken yet
    MASTER = "master"  # acting master of state.epoch
    SLAVE = "slave"  # following the master of an epoch
    FENCED = "fenced"  # stepped down or stopped replicating, following nobody yet
    STOPPED = "stopped"


class GroupMember:
    """The state machine of one replica of a broker group (see the module docstring)."""

    def __init__(
        self,
        session: EtcdSession,
        lease: LeaseKeeper,
        replica: Replica,
        cluster: str,
        name: str,
        prefix: str,
        clock: Clock,
        lagging_ms: int,
        *,
        rank_delay_ms: int = RANK_DELAY_MS,
        chore_interval_s: float = CHORE_INTERVAL_S,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        self.session = session
        self.lease = lease
        self.replica = replica
        self.id = replica.broker_id
        self.clock = clock
        self.lagging_ms = lagging_ms
        self.rank_delay_ms = rank_delay_ms
        self.chore_interval_s = chore_interval_s
        self.refresh_interval_s = refresh_interval_s
        self.group = f"{cluster}/{name}"
        self._prefix = group_prefix(prefix, cluster, name)
        self._state_key = state_key(prefix, cluster, name)
        self._alive_prefix = alive_prefix(prefix, cluster, name)
        self._alive_key = alive_key(prefix, cluster, name, self.id)
        self.role = Role.STARTING
        self.state: GroupState | None = None
        self._state_rev = 0
        # Replica id -> its record (None: present but unreadable; it is alive all the same).
        self.alive: dict[int, AliveRecord | None] = {}
        self._following_epoch: int | None = None
        self._won: GroupState | None = None  # CASed as master, become_master not done yet
        self._local_sync: frozenset[int] | None = None
        self._alive_lease: int | None = None  # the lease our alive key was put on
        self._gone_since_ms: float | None = None
        self._missing_since_ms: float | None = None  # when we first saw the state key missing
        # Why self.state may not be acted on (MISSING, or a malformed value's error), or None.
        self._hold: str | None = None
        self._said: dict[str, str] = {}  # topic -> the last message _loud logged for it
        # A CAS whose answer was lost (it may have been applied): (its base revision, its value).
        self._pending: tuple[int, GroupState] | None = None
        self._fence_reason: str | None = None  # set when the lease is lost while master
        self._decide_losses = 0  # lease.losses when the current decision began
        self._last_error = ""
        self._need_read = True
        self._next_refresh_ms = 0.0
        self._next_chore_ms = 0.0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        lease.on_lost = self._on_lease_lost
        lease.on_new_lease = self._on_new_lease

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the lease, the watch and the decision loop, and return at once: every decision
        is taken in the background (the Replica's callbacks report them), so a broker can start
        while etcd does not answer yet."""
        assert not self._tasks, "started twice"
        self._log("starting")
        if self.lease.lease_id is None:
            self.lease.start()
        self._tasks = [
            asyncio.create_task(self._watch(), name=f"member-watch {self.group}/{self.id}"),
            asyncio.create_task(self._loop(), name=f"member {self.group}/{self.id}"),
        ]

    async def stop(self, *, clean: bool = True) -> None:
        """Stop deciding. clean=True deletes our alive key and revokes the lease, so a successor
        is elected at once if we were master (the state itself is left alone: the next master
        CASes it). clean=False leaves both to expire, as a crash would."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if clean:
            with contextlib.suppress(EtcdUnavailable):
                await self.session.delete(self._alive_key)
        await self.lease.stop(revoke=clean)
        self.role = Role.STOPPED
        self._log(f"stopped ({'clean' if clean else 'lease left to expire'})")

    def may_acknowledge(self) -> bool:
        """True while this member is the acting master on a valid lease (the fence)."""
        return self.role is Role.MASTER and self.lease.valid()

    # -- events ----------------------------------------------------------------------------

    def _on_lease_lost(self) -> None:
        """Out of MASTER at once: a new lease may be granted before the loop runs, and
        may_acknowledge must not be True on it meanwhile. The loop then calls step_down."""
        self._alive_lease = None
        if self.role is Role.MASTER:
            self.role = Role.FENCED
            self._fence_reason = "master lease lost"
        self._wake.set()

    def _on_new_lease(self, lease_id: int) -> None:
        self._alive_lease = None
        self._need_read = True
        self._wake.set()

    async def _watch(self) -> None:
        while True:
            try:
                async for notice in self.session.watch_prefix(self._prefix):
                    self._apply(notice)
                    self._wake.set()
            except Exception:
                log.exception(
                    "group %s replica %d: watch failed; watching again", self.group, self.id
                )
                await asyncio.sleep(WATCH_RESTART_S)

    def _apply(self, notice: Notice) -> None:
        if notice.kind == "resync":
            self._need_read = True
        elif notice.key == self._state_key:
            if notice.kind == "delete":
                self._state_missing()
                self._need_read = True
            elif notice.mod_revision >= self._state_rev:
                self._take_state(notice.value, notice.mod_revision)
        else:
            replica_id = alive_id(notice.key, self._alive_prefix)
            if replica_id is None:
                return
            if notice.kind == "delete":
                self.alive.pop(replica_id, None)
                if replica_id == self.id:
                    self._alive_lease = None  # re-put it while our lease holds
            else:
                self.alive[replica_id] = _alive_record(notice.value)

    # -- the decision loop -----------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the event is set, and stop() would wait for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.chore_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._step()
                self._last_error = ""
            except EtcdUnavailable as e:
                self._log(f"etcd unavailable, deciding again soon: {e}")
            except ControllerError as e:
                # Retried every tick; logged again only when it changes (a replica that must
                # be wiped would otherwise fill the log).
                if str(e) != self._last_error:
                    self._last_error = str(e)
                    log.error("group %s replica %d: %s", self.group, self.id, e)
            except Exception:
                log.exception(
                    "group %s replica %d: a decision failed; retrying", self.group, self.id
                )

    async def _step(self) -> None:
        if self._fence_reason is not None or (self.role is Role.MASTER and not self.lease.valid()):
            # First and without etcd: a lost lease usually means etcd is out of reach.
            await self._step_down(self._fence_reason or "master lease lost")
            return
        now = self.clock.monotonic_ms()
        refresh = now >= self._next_refresh_ms
        if refresh:
            self._next_refresh_ms = now + self.refresh_interval_s * 1000
            self._need_read = True
        if self._need_read:
            await self._read()
        ours = self.alive.get(self.id)
        stale = ours is None or ours.last_epoch != self.replica.last_epoch()
        if self.lease.valid() and (refresh or stale or self._alive_lease != self.lease.lease_id):
            await self._put_alive()
        await self._decide()

    async def _read(self) -> None:
        """State and alive records from etcd (the watch may have missed changes)."""
        self._need_read = False
        try:
            got = await self.session.get(self._state_key)
            alive = await self.session.get_prefix(self._alive_prefix)
        except EtcdUnavailable:
            self._need_read = True
            raise
        if got is None:
            self._state_missing()
        elif got.mod_revision >= self._state_rev:
            # An older value (the watch or our own CAS's read showed a newer one) is ignored.
            self._take_state(got.value, got.mod_revision)
        self.alive = {}
        for key, versioned in alive.items():
            replica_id = alive_id(key, self._alive_prefix)
            if replica_id is not None:
                self.alive[replica_id] = _alive_record(versioned.value)

    def _take_state(self, raw: bytes, rev: int) -> None:
        """A state value read or watched at `rev`; a malformed one is held, not acted on."""
        try:
            state = GroupState.from_json(raw)
        except ControllerError as e:
            self._hold, self._state_rev = str(e), rev
            self._loud("state", f"{e} (revision {rev}): not acting on it until it is fixed")
            return
        self.state, self._state_rev, self._hold = state, rev, None
        self._missing_since_ms = None
        self._said.pop("state", None)
        self._said.pop("missing", None)

    def _state_missing(self) -> None:
        """No state key. The last state is kept (a master keeps serving while its lease holds)
        but not acted on; only a replica without epoch history may create one (_create)."""
        if self._hold != MISSING and self.state is not None:
            log.warning(
                "group %s replica %d: the state key is gone (last: epoch %d); holding",
                self.group,
                self.id,
                self.state.epoch,
            )
        self._hold = MISSING
        if self._missing_since_ms is None:
            self._missing_since_ms = self.clock.monotonic_ms()

    async def _put_alive(self) -> None:
        lease_id = self.lease.lease_id
        if lease_id is None:
            return
        addrs = self._addrs()
        last = self.replica.last_epoch()
        record = AliveRecord(addrs.addr, addrs.ha_addr, self.replica.max_offset(), last)
        await self.session.put(self._alive_key, record.to_json(), lease=lease_id)
        if self._alive_lease != lease_id:
            self._log(f"alive on lease {lease_id:x}")
        self._alive_lease = lease_id
        self.alive[self.id] = record

    async def _decide(self) -> None:
        if self._fence_reason is not None or (self.role is Role.MASTER and not self.lease.valid()):
            await self._step_down(self._fence_reason or "master lease lost")
            return
        if not self.lease.valid() or self._alive_lease is None:
            return  # without our alive key we may neither lead nor stand
        self._decide_losses = self.lease.losses
        # The watch task moves self.state on at any await: decide on one snapshot, and CAS
        # against the revision it was read at.
        state, rev = self.state, self._state_rev
        if self._hold == MISSING:
            await self._create()
            return
        if state is None or self._hold is not None:
            return  # malformed: logged by _take_state; a fixed value comes by watch or read
        if self.role is Role.MASTER and state.master != self.id:
            await self._step_down(f"deposed: epoch {state.epoch} names master {state.master}")
            self._wake.set()  # follow on the next step, from a fresh snapshot
            return
        if state.master == self.id:
            if self.role is Role.MASTER:
                await self._chores(state, rev)
            else:
                await self._reclaim(state, rev)
            return
        if state.master != NO_MASTER and state.master in self.alive:
            self._gone_since_ms = None
            if self._following_epoch != state.epoch:
                await self._follow(state)
            return
        await self._candidacy(state)

    # -- transitions -----------------------------------------------------------------------

    async def _create(self) -> None:
        """Epoch 1, only by a replica that never took part in an epoch (a new group, or a 4.x
        store being converted) while no alive peer may hold history (rules.create_refusal):
        otherwise the state was lost, and a fresh epoch 1 would orphan acknowledged messages.
        Not before one rank delay from seeing the state missing, and from a fresh read: peers
        starting with us must be seen alive first."""
        since = self._missing_since_ms
        if since is None or self.clock.monotonic_ms() < since + self.rank_delay_ms:
            return
        refusal = create_refusal(self.alive, self.id, self.replica.last_epoch())
        if refusal is None:
            await self._read()
            if self._hold != MISSING:
                return  # the state is back (or malformed): decide again
            refusal = create_refusal(self.alive, self.id, self.replica.last_epoch())
        if refusal is not None or self.role is Role.MASTER:
            why = refusal or "this replica is an acting master"
            self._loud("missing", f"the group's state is missing from etcd: {why}; not creating it")
            return
        first = GroupState.first(self.id, self._addrs(), self.replica.max_offset())
        self.replica.note_standing(first.epoch)  # before the CAS: see rules.resumes
        if not await self._try_cas(0, first, won=True):
            self._log("another member created the group state first")
            await self._read()
            return
        self._log(f"created the group state: master of epoch 1 at offset {first.epochs[0][1]}")
        self._won = first
        await self._read()
        await self._become_master(first)

    async def _reclaim(self, state: GroupState, rev: int) -> None:
        """The state names us master but we are not acting as one (a restart, or fenced after a
        lost lease): finish a won election, or elect ourselves for a new epoch."""
        if self._won is not None and self._won.epoch == state.epoch:
            await self._become_master(state)
            return
        if resumes(state, self.id, self.replica.last_epoch(), self.replica.standing()):
            # Won before a crash (or a lost answer), the epoch not yet recorded: finish it.
            offset = await self.replica.stop_replicating()
            if not self._lacks_data(state, offset):
                self._log(f"finishing the election for epoch {state.epoch} won before a restart")
                self._won = state
                await self._become_master(state)
            return
        self._log(f"epoch {state.epoch} names me master but I am not acting: electing myself")
        await self._elect(state, rev)

    async def _candidacy(self, state: GroupState) -> None:
        if self.id not in state.sync_set:
            if self._gone_since_ms is None:
                self._gone_since_ms = self.clock.monotonic_ms()
                self._log(
                    f"epoch {state.epoch}: master {state.master} gone; not in syncSet "
                    f"{sorted(state.sync_set)}, so not a candidate"
                )
            return
        if not self._may_stand(state):
            return
        candidates = sorted(i for i in state.sync_set if i in self.alive)
        if self.id not in candidates:
            return
        rank = candidates.index(self.id)
        now = self.clock.monotonic_ms()
        if self._gone_since_ms is None:
            self._gone_since_ms = now
            self._log(
                f"epoch {state.epoch}: master {state.master} gone; candidate of rank {rank} "
                f"among {candidates}"
            )
        if now < self._gone_since_ms + rank * self.rank_delay_ms:
            return
        await self._read()
        fresh, rev = self.state, self._state_rev
        if (
            self._hold is not None
            or fresh != state
            or (fresh.master != NO_MASTER and fresh.master in self.alive)
        ):
            return  # the master came back or the state moved: decide again
        await self._elect(fresh, rev)

    async def _elect(self, state: GroupState, rev: int) -> None:
        """Stop replicating, then CAS ourselves in as master of epoch + 1."""
        if not self._may_stand(state) or self._lacks_data(state, self.replica.max_offset()):
            return
        offset = await self.replica.stop_replicating()
        if self.role is Role.SLAVE:
            self.role = Role.FENCED
        self._following_epoch = None
        if self._lacks_data(state, offset):
            return
        new = state.elect(self.id, self._addrs(), offset)
        self.replica.note_standing(new.epoch)  # before the CAS: see rules.resumes
        if not await self._try_cas(rev, new, won=True):
            self._log(f"lost the election for epoch {new.epoch}")
            await self._read()
            return
        self._log(
            f"elected master of epoch {new.epoch} at offset {offset} "
            f"(was epoch {state.epoch}, master {state.master})"
        )
        self._won = new
        self._gone_since_ms = None
        await self._read()
        await self._become_master(new)

    def _may_stand(self, state: GroupState) -> bool:
        refusal = stand_refusal(state, self.replica.last_epoch())
        if refusal is not None:
            self._loud("stand", refusal)
        return refusal is None

    def _lacks_data(self, state: GroupState, offset: int) -> bool:
        refusal = data_refusal(state, offset)
        if refusal is not None:
            self._loud("data", refusal)
        return refusal is not None

    async def _become_master(self, state: GroupState) -> None:
        await self.replica.become_master(state)
        if self.lease.losses != self._decide_losses:
            # The lease (and our alive key) went while we took over: a successor may already
            # stand, so never act on a newer lease; step down, then finish on a later decision.
            self._fence_reason = "master lease lost"
            return
        self.replica.set_sync_set(state.sync_set)
        self._local_sync = state.sync_set
        self.role = Role.MASTER
        self._won = None
        self._following_epoch = None
        self._log(f"acting master of epoch {state.epoch}, syncSet {sorted(state.sync_set)}")

    async def _follow(self, state: GroupState) -> None:
        self._log(
            f"following master {state.master} of epoch {state.epoch} at {state.master_ha_addr}"
        )
        await self.replica.become_slave(state)
        self.role = Role.SLAVE
        self._following_epoch = state.epoch

    async def _step_down(self, reason: str) -> None:
        self._log(f"stepping down: {reason}")
        self.role = Role.FENCED
        self._following_epoch = None
        self._local_sync = None
        self._fence_reason = reason  # until the replica has done it (retried on a failure)
        await self.replica.step_down(reason)
        self._fence_reason = None

    async def _chores(self, state: GroupState, rev: int) -> None:
        """Master: shrink syncSet by the laggards, or expand it by the caught-up; each a CAS."""
        now = self.clock.monotonic_ms()
        if now < self._next_chore_ms:
            return
        self._next_chore_ms = now + self.chore_interval_s * 1000
        pending = self._pending
        if pending is not None and (rev > pending[0] or pending[1].epoch != state.epoch):
            self._pending = pending = None  # settled: the state moved past its base revision
        # The committed set (read or watched) is what acks wait for; while a lost CAS may
        # still apply, also the set it named (never lower than the last attempt).
        self._require(state.sync_set | (pending[1].sync_set if pending else frozenset()))
        if pending is not None:
            # Its outcome is unknown while the state is still at its base: repeat it, and
            # either outcome settles it (it wins, or the state moved and the read shows how).
            await self._cas(state, rev, pending[1], "repeat a CAS whose answer was lost")
            return
        laggards = self.replica.lagging(self.lagging_ms) & (state.sync_set - {self.id})
        if laggards:
            new = state.shrink(laggards)
            # Only once etcd has the smaller set may acks stop waiting for the laggards.
            if await self._cas(state, rev, new, f"shrink syncSet by {sorted(laggards)}"):
                self._require(new.sync_set)
            return
        caught_up = self.replica.caught_up() - state.sync_set
        if caught_up:
            new = state.expand(caught_up)
            # Required locally before etcd names them: a stricter ack rule is always safe.
            self._require(new.sync_set)
            if not await self._cas(state, rev, new, f"expand syncSet by {sorted(caught_up)}"):
                # Lost to a newer state: drop them again, but only by that newer state (never
                # by the snapshot the CAS was based on, which an earlier CAS may have passed).
                fresh = self.state
                if self._state_rev > rev and fresh is not None and fresh.master == self.id:
                    self._require(fresh.sync_set)

    def _require(self, ids: frozenset[int]) -> None:
        """The set the replica's acks wait for, set only when it changes."""
        if self._local_sync != ids:
            self.replica.set_sync_set(ids)
            self._local_sync = ids

    async def _cas(self, state: GroupState, rev: int, new: GroupState, what: str) -> bool:
        """One CAS from `state` (read at `rev`); on a loss, re-read so the next decision sees
        why."""
        if await self._try_cas(rev, new):
            self._log(f"epoch {state.epoch}: {what} -> {sorted(new.sync_set)}")
            await self._read()
            return True
        self._log(f"epoch {state.epoch}: {what} lost its CAS; re-reading")
        await self._read()
        return False

    async def _try_cas(self, rev: int, new: GroupState, *, won: bool = False) -> bool:
        """CAS the state from `rev` to `new`. When the answer is lost (EtcdUnavailable) the CAS
        may have been applied all the same: remember it (_pending; `won`: an election, which
        _reclaim finishes if a read shows it applied) and re-read first."""
        try:
            answer = await self.session.cas(self._state_key, new.to_json(), rev)
        except EtcdUnavailable:
            self._need_read = True
            self._pending = (rev, new)
            if won:
                self._won = new
            raise
        if self._pending is not None and self._pending[0] == rev:
            self._pending = None  # answered from the same base: the lost one can no longer apply
        return answer

    # -- helpers ---------------------------------------------------------------------------

    def _addrs(self) -> Addrs:
        return Addrs(self.replica.address(), self.replica.ha_address())

    def _log(self, message: str) -> None:
        log.info("group %s replica %d (%s): %s", self.group, self.id, self.role.value, message)

    def _loud(self, topic: str, message: str) -> None:
        """An error the operator must act on, logged once per distinct message of a topic (it
        holds on every tick until fixed)."""
        if self._said.get(topic) != message:
            self._said[topic] = message
            log.error("group %s replica %d: %s", self.group, self.id, message)


def _alive_record(raw: bytes) -> AliveRecord | None:
    try:
        return AliveRecord.from_json(raw)
    except ControllerError as e:
        log.warning("unreadable alive record: %s", e)
        return None
