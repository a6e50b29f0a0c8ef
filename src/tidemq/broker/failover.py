"""ControlledBroker: a broker under controller mode (issue 14), in the role etcd says.

    GroupMember (controller/member.py) ── decides ──▶ ControlledBroker (this module, its Replica)
      etcd: state key (epoch, master, syncSet,                │ one BrokerApp at a time, on the
            epoch history), alive keys on leases              │ same ports and store:
                                                              ▼
        STANDBY ─── become_slave ──▶ SLAVE (pinned to the master the state names)
          │  ▲                         │  a new master: re-pointed, or stopped, truncated to the
          │  └──── step_down ──────┐   │  first later epoch's start, restarted (truncate.py)
          └─ become_master ──▶ MASTER ◀┘  stop_replicating, CAS won: restarted as master
                                  acks: every syncSet member has it (HAMaster's group rule)
                                  and the lease still holds (fence); pulls see up to the
                                  confirm offset

A start recovers the store in a STANDBY app: a slave that follows no one, serves no reads and
takes no writes, so the member can publish the log end before it knows its role. Every role
change that is not a mere change of master address stops the running BrokerApp and starts a new
one: a promoted broker starts as a fresh master on the replicated log, so the transaction ledger,
the Spark sink's batches, check-back, delay levels and timers come from its store exactly as
after a restart (app.py). The master registers as brokerId 0, the others as their replica id,
so name servers publish the new master as soon as it registers.

The epoch file (store/epochs.py, `{storePathRootDir}/epochs`) records the last epoch whose data
this log holds: a new master appends (epoch, its log end); a slave appends the epoch it follows
once its log is cut back to agree with that epoch's history (controller/state.py
truncation_point), so a deposed master's unacknowledged tail never survives its return.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Final

from tidemq.broker.app import BrokerApp, store_config
from tidemq.broker.config import BrokerConfig
from tidemq.broker.ha import HAMaster
from tidemq.broker.replication import ControlledRole
from tidemq.clock import Clock
from tidemq.controller.etcd import EtcdSession
from tidemq.controller.lease import LeaseKeeper
from tidemq.controller.member import GroupMember
from tidemq.controller.state import GroupState, truncation_point
from tidemq.protocol.message import MASTER_BROKER_ID
from tidemq.store.epochs import EpochFile, write_atomic
from tidemq.store.message_store import DiskUsageProbe
from tidemq.store.truncate import truncate_store

log = logging.getLogger(__name__)

EPOCH_FILE: Final = "epochs"


class ControlledBroker:
    """One replica of a controller-mode group: its GroupMember and the BrokerApp it steers."""

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        *,
        disk_usage_probe: DiskUsageProbe | None = None,
    ) -> None:
        assert config.enable_controller_mode
        self.config = config
        self.clock = clock
        self._probe = disk_usage_probe
        self.replica_id = config.broker_id
        self.app: BrokerApp | None = None
        self.role = "STOPPED"
        self.epochs = EpochFile(Path(config.store_path_root_dir) / EPOCH_FILE)
        self._session = EtcdSession(config.controller_etcd_endpoints)
        self._lease = LeaseKeeper(self._session, config.controller_lease_ttl_seconds, clock)
        self.member = GroupMember(
            self._session,
            self._lease,
            self,
            cluster=config.broker_cluster_name,
            name=config.broker_name,
            prefix=config.controller_etcd_prefix,
            clock=clock,
            lagging_ms=config.ha_max_time_slave_not_catchup_ms,
        )
        # Role changes one at a time: the member's calls may overlap a stop.
        self._switching = asyncio.Lock()
        self._stopping = False  # once set, the member's calls change nothing
        self._replicating = False
        self._last_max = 0
        self._state: GroupState | None = None  # the last state a role change came from
        self._sync_set: frozenset[int] = frozenset()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover the store as a STANDBY, then join the group (the member decides the role)."""
        await self._run_app("STANDBY", None)
        self.member.start()  # joins in the background: etcd may not answer yet

    async def stop(self) -> None:
        """Stop serving first (a master answers what it took, unregisters), then leave the
        group: the lease's revocation lets a successor be elected at once."""
        async with self._switching:
            self._stopping = True
            await self._stop_app()
            self.role = "STOPPED"
        await self.member.stop()
        await self._session.close()

    # -- the Replica protocol (controller/member.py) ----------------------------------------

    @property
    def broker_id(self) -> int:
        return self.replica_id

    def address(self) -> str:
        return f"{self.config.broker_ip}:{self.config.listen_port}"

    def ha_address(self) -> str:
        return f"{self.config.broker_ip}:{self.config.ha_port}"

    def max_offset(self) -> int:
        app = self.app
        if app is not None:
            self._last_max = app.store.max_physical_offset
        return self._last_max

    def last_epoch(self) -> int:
        """The last epoch whose data this log holds (0: none yet; store/epochs.py)."""
        return self.epochs.last_epoch

    def note_standing(self, epoch: int) -> None:
        """Before a CAS for `epoch`: `{storePathRootDir}/standing`, replaced atomically (tmp,
        fsync, rename, dir fsync). Never cleared: the member consults it only while etcd names
        this replica master of that very epoch and the epoch file lacks it (rules.resumes), and
        the next candidacy replaces it; a wiped store has none."""
        path = Path(self.config.store_path_root_dir) / "standing"
        write_atomic(path, f"{epoch}\n".encode())

    def standing(self) -> int:
        """The epoch of the last note_standing (0: none, or unreadable: never a reason to
        stand)."""
        path = Path(self.config.store_path_root_dir) / "standing"
        try:
            return max(0, int(path.read_text()))
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("replica %d: malformed %s; standing for no epoch", self.replica_id, path)
            return 0

    async def stop_replicating(self) -> int:
        """Before a candidacy: no more log and no more metadata from the old master, so the log
        end is final and no offset copied later can point past it."""
        async with self._switching:
            app = self.app
            if app is not None:
                # The log first: a copy held until the log reached it is applied by the sync's
                # stop, which must see the final log end.
                if app.replication.slave is not None:
                    await app.replication.slave.stop()
                if app.replication.sync is not None:
                    await app.replication.sync.stop()
                self._replicating = False
            return self.max_offset()

    async def become_master(self, state: GroupState) -> None:
        """The CAS made this replica master of `state.epoch`: restart as its master."""
        async with self._switching:
            if self._stopping:
                return
            start = state.epochs[-1][1]
            end = self.max_offset()
            if end != start:
                log.warning("promoted at log end %d, but the epoch starts at %d", end, start)
            await self._stop_app()
            if self.epochs.last_epoch < state.epoch:
                self.epochs.append(state.epoch, start)
            self._state = state
            await self._run_app("MASTER", None)
            self.set_sync_set(state.sync_set)
            log.info(
                "replica %d is master of %s epoch %d from offset %d (syncSet %s)",
                self.replica_id,
                self.config.broker_name,
                state.epoch,
                start,
                sorted(state.sync_set),
            )

    async def become_slave(self, state: GroupState) -> None:
        """Follow the master `state` names; cut this log back first if it went past the
        point where that master's history parts from it."""
        async with self._switching:
            if self._stopping:
                return
            master = (state.master_addr, state.master_ha_addr)
            self._state, self._sync_set = state, state.sync_set
            end = self.max_offset()
            point = truncation_point(self.epochs.last_epoch or None, state.epochs, end)
            app = self.app
            if point is None and self.role == "SLAVE" and self._replicating and app is not None:
                self._note_epoch(state)
                if app.replication.sync is not None:
                    app.replication.sync.reset_held()
                app.replication.pin_master(*master)
            else:
                await self._stop_app()
                if point is not None:
                    log.warning(
                        "replica %d cuts its log from %d back to %d (epoch %d's history)",
                        self.replica_id,
                        end,
                        point,
                        state.epoch,
                    )
                    await asyncio.to_thread(
                        truncate_store,
                        Path(self.config.store_path_root_dir),
                        store_config(self.config),
                        point,
                    )
                    self._last_max = point
                    self.epochs = EpochFile(self.epochs.path)  # the cut rewrote it
                # Before the first byte of this epoch arrives: a replica stands for election
                # only with the current epoch recorded (controller/member.py).
                self._note_epoch(state)
                await self._run_app("SLAVE", master)
            log.info(
                "replica %d follows master %d (%s) of epoch %d",
                self.replica_id,
                state.master,
                state.master_addr,
                state.epoch,
            )

    async def step_down(self, reason: str) -> None:
        """Deposed or the lease lost: stop acknowledging now (the fence already refuses), then
        wait as a STANDBY until the member names the master to follow."""
        async with self._switching:
            log.warning("replica %d steps down: %s", self.replica_id, reason)
            if self.role != "STANDBY" and not self._stopping:
                await self._stop_app()
                await self._run_app("STANDBY", None)

    def set_sync_set(self, ids: frozenset[int]) -> None:
        self._sync_set = ids
        master = self._ha_master()
        if master is not None:
            master.set_sync_set(ids, self.replica_id)

    def lagging(self, max_ms: int) -> frozenset[int]:
        master = self._ha_master()
        return master.lagging(max_ms) if master is not None else frozenset()

    def caught_up(self) -> frozenset[int]:
        master = self._ha_master()
        return master.caught_up() if master is not None else frozenset()

    # -- the running app ---------------------------------------------------------------------

    def _ha_master(self) -> HAMaster | None:
        app = self.app
        if app is None or self.role != "MASTER":
            return None
        return app.replication.master

    def runtime_fields(self) -> dict[str, str]:
        """The controller's keys in GET_BROKER_RUNTIME_INFO (`tidemq cluster list` shows them)."""
        state = self._state
        fields = {
            "controllerMode": "true",
            "replicaId": str(self.replica_id),
            "controllerRole": self.role,
            "syncStateSet": ",".join(str(i) for i in sorted(self._sync_set)),
            "leaseValid": "true" if self._lease.valid() else "false",
        }
        if state is not None:
            fields["controllerEpoch"] = str(state.epoch)
            fields["controllerMaster"] = str(state.master)
        return fields

    def _note_epoch(self, state: GroupState) -> None:
        """A slave's log now agrees with `state`'s history up to its end: record the epoch."""
        if self.epochs.last_epoch < state.epoch:
            start = dict(state.epochs).get(state.epoch, self._last_max)
            self.epochs.append(state.epoch, start)

    def _role_config(self, role: str) -> BrokerConfig:
        """The plain (4.x-shaped) config of one role: the master registers as brokerId 0."""
        if role == "MASTER":
            return dataclasses.replace(
                self.config,
                enable_controller_mode=False,
                broker_role="SYNC_MASTER",
                broker_id=MASTER_BROKER_ID,
            )
        return dataclasses.replace(
            self.config,
            enable_controller_mode=False,
            broker_role="SLAVE",
            broker_id=self.replica_id,
        )

    async def _run_app(self, role: str, master: tuple[str, str] | None) -> None:
        # The fence: the member acts as master on a lease that still holds (it is not yet
        # MASTER while this app starts, so the first sends may be refused for a moment).
        controlled = ControlledRole(
            self.replica_id, self.member.may_acknowledge, master, fields=self.runtime_fields
        )
        app = BrokerApp(
            self._role_config(role),
            self.clock,
            disk_usage_probe=self._probe,
            controlled=controlled,
        )
        await app.start()
        self.app = app
        self.role = role
        self._replicating = role == "SLAVE"
        self._last_max = app.store.max_physical_offset

    async def _stop_app(self) -> None:
        app, self.app = self.app, None
        if app is not None:
            self._last_max = app.store.max_physical_offset
            await app.stop()
        self._replicating = False
