"""The chaos suite's faults: a seeded schedule of bounded faults, and their injection.

    schedule(seed, count) ──▶ [Step(kinds=("kill_master",), hold_s=4.2, quiet_s=3.1), ...]
    for step: targets resolved now (who is master?) ─▶ apply each ─▶ hold ─▶ heal in reverse
              ─▶ quiet (the group recovers; the workload keeps running throughout)

Every fault ends: a killed process is restarted on its store, a paused one continued, a link
set up again, a ballast file removed. Steps are single faults or a master fault mixed with a
fault elsewhere (a slave, etcd). The schedule depends on the seed alone; which broker is master
when a step starts depends on the run, so targets are picked then, from the group itself:
GET_BROKER_RUNTIME_INFO of each running broker (controllerRole / brokerRole); when two claim
it (a deposed master that has not noticed yet), the name servers' route (brokerId 0) decides.

Kinds that need what the run lacks (partitions without namespaces, a disk-full slave without
tmpfs stores) are recorded as skipped, with the reason, so the table says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from tidemq import Admin
from tidemq.protocol import message as pm
from tidemq.testing.chaos.checker import FaultRecord
from tidemq.testing.chaos.nodes import GROUP, ChaosCluster, NodeProcess

MASTER_FAULTS: Final = ("kill_master", "pause_master", "partition_master", "partition_master_etcd")
OTHER_FAULTS: Final = ("kill_slave", "kill_etcd", "disk_full_slave")
KINDS: Final = (*MASTER_FAULTS, *OTHER_FAULTS, "restart_group")
# Not a fault the promise covers: kill the master and delete its store. Only asked for by name
# (`--kinds wipe_master`), to show that a run which really loses messages fails.
SELF_TEST_KINDS: Final = ("wipe_master",)
_ON_MASTER: Final = (*MASTER_FAULTS, *SELF_TEST_KINDS)
NEEDS_NETNS: Final = frozenset({"partition_master", "partition_master_etcd"})
NEEDS_TMPFS: Final = frozenset({"disk_full_slave"})
# Hold times (seconds) per kind: a pause outlasts the 2 s lease; a kill stays dead a while.
HOLD_S: Final = {
    "kill_master": (2.0, 6.0),
    "kill_slave": (2.0, 6.0),
    "kill_etcd": (2.0, 5.0),
    "pause_master": (3.0, 6.0),
    "partition_master": (3.0, 8.0),
    "partition_master_etcd": (3.0, 8.0),
    "restart_group": (0.5, 2.0),
    "disk_full_slave": (4.0, 8.0),
    "wipe_master": (2.0, 4.0),
}
QUIET_S: Final = (3.0, 6.0)
# Room left on a filled tmpfs store: less than one message, so every write fails.
DISK_FULL_SLACK_BYTES: Final = 4096
ASK_TIMEOUT_MS: Final = 1_500
# controllerRole of a controller-mode master; brokerRole of a 4.x one.
MASTER_ROLES: Final = frozenset({"MASTER", "SYNC_MASTER", "ASYNC_MASTER"})


@dataclass(frozen=True)
class Step:
    kinds: tuple[str, ...]
    hold_s: float
    quiet_s: float


def schedule(seed: int, count: int, kinds: tuple[str, ...] = KINDS) -> list[Step]:
    """`count` steps from `seed`: about three in four a single fault (every kind in turn, in a
    shuffled cycle), the rest a master fault mixed with one elsewhere."""
    rng = random.Random(seed)
    cycle: list[str] = []
    mixed_count = count // 4
    steps = []
    for index in range(count):
        if index >= count - mixed_count:
            pair = (rng.choice(MASTER_FAULTS), rng.choice(OTHER_FAULTS))
            chosen = tuple(k for k in pair if k in kinds) or (rng.choice(kinds),)
        else:
            if not cycle:
                cycle = list(kinds)
                rng.shuffle(cycle)
            chosen = (cycle.pop(),)
        hold = max(rng.uniform(*HOLD_S[k]) for k in chosen)
        steps.append(Step(chosen, round(hold, 2), round(rng.uniform(*QUIET_S), 2)))
    rng.shuffle(steps)
    return steps


Heal = Callable[[], Awaitable[None]]


class Injector:
    """Applies and heals faults on one run's cluster; logs each to `faults.jsonl`."""

    def __init__(self, cluster: ChaosCluster, log_path: Path, admin: Admin) -> None:
        self.cluster = cluster
        self.topology = cluster.topology
        self.log_path = log_path
        self.admin = admin
        self.records: list[FaultRecord] = []
        # Each broker's last GET_BROKER_RUNTIME_INFO table (the master's in-sync set is logged).
        self.runtime: dict[str, dict[str, str]] = {}

    def unavailable(self, kind: str) -> str | None:
        """Why `kind` cannot be applied in this run, or None."""
        if kind in NEEDS_NETNS and not self.topology.namespaced:
            return "no network namespaces"
        if kind in NEEDS_TMPFS and not self.cluster.mounts:
            return "stores not on tmpfs"
        return None

    async def _role(self, process: NodeProcess) -> str | None:
        if not process.running or process.paused:
            return None
        try:
            async with asyncio.timeout(ASK_TIMEOUT_MS / 1000):
                table = await self.admin.broker_runtime_info(process.address)
        except Exception:  # a broker that does not answer has no role we can use
            return None
        self.runtime[process.name] = table
        return table.get("controllerRole") or table.get("brokerRole")

    async def master(self) -> str | None:
        """The broker node that is master now, or None: asked of the running brokers
        themselves (the name servers may still route to a dead one)."""
        roles = {name: await self._role(process) for name, process in self.cluster.brokers.items()}
        masters = [n for n, r in roles.items() if r in MASTER_ROLES]
        if len(masters) <= 1:
            return masters[0] if masters else None
        # Several say so (a deposed master that has not noticed yet): the name servers' pick.
        with contextlib.suppress(Exception):
            info = await self.admin.cluster_info()
            addr = info.broker_addr_table[GROUP].broker_addrs.get(pm.MASTER_BROKER_ID)
            routed = self.cluster.broker_by_address(addr) if addr is not None else None
            if routed in masters:
                return routed
        return masters[0]

    async def _slave(self, rng: random.Random, master: str | None) -> str:
        slaves = [n for n in self.cluster.brokers if n != master]
        return rng.choice(sorted(slaves))

    async def run_step(self, step: Step, rng: random.Random) -> None:
        """Apply the step's faults, hold, heal them in reverse order, log them."""
        master = await self.master()
        in_sync = self.runtime.get(master, {}).get("syncStateSet") if master else None
        applied: list[tuple[str, str, float, Heal | None, str | None]] = []
        for kind in step.kinds:
            reason = self.unavailable(kind)
            target, heal = "-", None
            if reason is None:
                try:
                    target, heal = await self._apply(kind, master, rng)
                except FaultNotApplicable as exc:
                    reason = str(exc)
            applied.append((kind, target, time.time(), heal, reason))
        if any(heal is not None for *_, heal, _ in applied):
            await asyncio.sleep(step.hold_s)
        ends, errors = {}, []
        for kind, _target, _start, heal, _reason in reversed(applied):
            if heal is not None:
                try:
                    await heal()
                except Exception as exc:  # the others still heal; the runner's drain retries
                    errors.append(exc)
            ends[kind] = time.time()
        for kind, target, start, _heal, reason in applied:
            self._log(FaultRecord(kind, target, start, ends[kind], reason, in_sync))
        if errors:
            raise errors[0]

    def _log(self, record: FaultRecord) -> None:
        self.records.append(record)
        with self.log_path.open("a") as log:
            log.write(json.dumps(asdict(record)) + "\n")

    async def _apply(self, kind: str, master: str | None, rng: random.Random) -> tuple[str, Heal]:
        if kind in _ON_MASTER and master is None:
            raise FaultNotApplicable("no master found")
        if kind == "restart_group":
            return "group", await self._restart_group()
        if kind == "kill_etcd":
            etcd = rng.choice(self.cluster.etcds)
            return etcd.name, self._kill(etcd)
        target = master if kind in _ON_MASTER else await self._slave(rng, master)
        assert target is not None
        process = self.cluster.broker(target)
        if kind in ("kill_master", "kill_slave"):
            return target, self._kill(process)
        if kind == "wipe_master":
            heal = self._kill(process)
            assert process.store_dir is not None
            for entry in process.store_dir.iterdir():  # the tmpfs mount point itself stays
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            return target, heal
        if kind == "pause_master":
            process.pause()
            return target, _async(process.resume)
        if kind == "partition_master":
            self.topology.partition(target)
            return target, _async(lambda: self.topology.heal(target))
        if kind == "partition_master_etcd":
            self.topology.partition_from_etcd(target)
            return target, _async(lambda: self.topology.heal(target))
        if kind == "disk_full_slave":
            return target, self._fill_disk(process)
        raise ValueError(f"unknown fault kind {kind!r}")

    @staticmethod
    def _kill(process: NodeProcess) -> Heal:
        process.kill()
        return process.start

    async def _restart_group(self) -> Heal:
        brokers = list(self.cluster.brokers.values())
        await asyncio.gather(*(b.stop() for b in brokers))

        async def heal() -> None:
            for broker in brokers:
                broker.spawn()
            await asyncio.gather(*(b.wait_ready() for b in brokers))

        return heal

    @staticmethod
    def _fill_disk(process: NodeProcess) -> Heal:
        """A ballast file takes all but a few KiB of the broker's tmpfs store."""
        assert process.store_dir is not None
        ballast = process.store_dir / "chaos-ballast"
        stat = os.statvfs(process.store_dir)
        free = stat.f_bavail * stat.f_frsize - DISK_FULL_SLACK_BYTES
        if free > 0:
            with ballast.open("wb") as f:
                os.posix_fallocate(f.fileno(), 0, free)

        async def heal() -> None:
            ballast.unlink(missing_ok=True)

        return heal


class FaultNotApplicable(Exception):
    """The fault's target does not exist right now (e.g. no master to kill)."""


def _async(action: Callable[[], None]) -> Heal:
    async def heal() -> None:
        action()

    return heal
