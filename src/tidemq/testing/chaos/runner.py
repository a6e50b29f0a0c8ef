"""One chaos run: topology ─▶ servers ─▶ workload ─▶ faults ─▶ drain ─▶ verdict.

    cleanup of crashed runs' namespaces and mounts
    Topology.create()  (or loopback)      runner enters the client namespace
    etcd, name server, b1 b2 b3           wait for a master, create the three topics
    workload processes (client ns)        producers, ordered, tx, consumers; all "ready"
    warm-up, then each scheduled step     apply ─▶ hold ─▶ heal ─▶ quiet
    drain                                 heal all, every server up, producers stop sending
                                          ("settled"), consumers catch up (or stop progressing)
    stop everything, destroy the topology
    check(history) ─▶ one table on stdout, verdict.json; exit 0 iff the verdict passes

Files under the run directory: logs/<process>.log, journal/<client>.jsonl, ledger.db (the
transactional producer's SQLite), faults.jsonl, run.json (the arguments and schedule),
verdict.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Final

from tidemq import Admin
from tidemq.testing.chaos import netns
from tidemq.testing.chaos.checker import History, check, load_history, render
from tidemq.testing.chaos.faults import Injector, schedule
from tidemq.testing.chaos.netns import AnyTopology, LoopbackTopology, Topology
from tidemq.testing.chaos.nodes import (
    CLIENT,
    CLUSTER,
    ChaosCluster,
    NodeProcess,
    node_specs,
    unmount_stale,
)
from tidemq.testing.chaos.workload import ORDER_TOPIC, TOPIC, TX_TOPIC, read_ledger
from tidemq.testing.wait import eventually_async

WARMUP_S: Final = 3.0
QUEUES: Final = 4
MASTER_TIMEOUT_S: Final = 60.0
# Before a step: how long to wait for the group to have a master again.
MASTER_WAIT_S: Final = 30.0
READY_TIMEOUT_S: Final = 60.0
# The drain ends when consumers have everything, or when they made no progress for this long.
DRAIN_STALL_S: Final = 45.0
SETTLE_TIMEOUT_S: Final = 30.0
JOURNAL_PEEK_BYTES: Final = 16 * 1024
# Between two checks of what the consumers still miss (each reads every journal).
CATCH_UP_POLL_S: Final = 2.0


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _worker(
    topo: AnyTopology, run_dir: Path, namesrv: str, role: str, index: int, seed: int
) -> NodeProcess:
    name = f"{role}{index}"
    argv = [sys.executable, "-m", "tidemq.testing.chaos.workload", role, "--namesrv", namesrv]
    argv += ["--out", str(run_dir / "journal" / f"{name}.jsonl"), "--index", str(index)]
    argv += ["--seed", str(seed), "--db", str(run_dir / "ledger.db")]
    return NodeProcess(
        name=name,
        node=CLIENT,
        argv=argv,
        log_path=run_dir / "logs" / f"{name}.log",
        prefix=topo.exec_prefix(CLIENT),
        host="",
        port=0,
    )


def _journal_has(path: Path, event: str) -> bool:
    """Whether the journal has `event` near its start ("ready") or in its tail ("settled"):
    a long run's journals hold megabytes, and this is polled."""
    try:
        with path.open("rb") as journal:
            head = journal.read(JOURNAL_PEEK_BYTES)
            size = journal.seek(0, 2)
            journal.seek(max(0, size - JOURNAL_PEEK_BYTES))
            tail = journal.read()
    except FileNotFoundError:
        return False
    needle = f'"ev":"{event}"'.encode()
    return needle in head or needle in tail


class Run:
    """The state of one run between its phases."""

    def __init__(self, args: argparse.Namespace, topo: AnyTopology) -> None:
        self.args = args
        self.topo = topo
        self.run_dir: Path = args.run_dir
        self.cluster = ChaosCluster(
            topo,
            self.run_dir,
            mode=args.mode,
            etcd_members=args.etcd_members,
            tmpfs_stores=args.disk_full,
        )
        self.workers: list[NodeProcess] = []
        self.dead_workers: set[str] = set()

    def journal(self, worker: NodeProcess) -> Path:
        return self.run_dir / "journal" / f"{worker.name}.jsonl"

    async def start_servers(self, admin: Admin, injector: Injector) -> None:
        say(f"starting etcd, name server, brokers ({self.args.mode} mode)")
        await self.cluster.start()

        async def topics_created() -> bool:
            for process in self.cluster.all():
                if not process.running:
                    raise RuntimeError(f"{process.name} exited:\n{process.log_tail()}")
            if await injector.master() is None:
                return False
            try:
                for topic in (TOPIC, ORDER_TOPIC, TX_TOPIC):
                    await admin.create_topic(
                        topic, cluster=CLUSTER, read_queue_nums=QUEUES, write_queue_nums=QUEUES
                    )
            except Exception:  # not registered yet: asked again
                return False
            return True

        await eventually_async(topics_created, MASTER_TIMEOUT_S, what="a master and the topics")
        say(f"master is {await injector.master()}; topics created")

    async def start_workload(self) -> None:
        a = self.args
        roles = [("producer", i) for i in range(a.producers)]
        roles += [("ordered", 0), ("tx", 0)]
        roles += [("consumer", i) for i in range(a.consumers)]
        namesrv = self.cluster.namesrv_addr
        self.workers = [_worker(self.topo, self.run_dir, namesrv, r, i, a.seed) for r, i in roles]
        for worker in self.workers:
            worker.spawn()

        async def all_ready() -> bool:
            for worker in self.workers:
                if not worker.running:
                    raise RuntimeError(f"{worker.name} exited:\n{worker.log_tail()}")
            return all(_journal_has(self.journal(w), "ready") for w in self.workers)

        await eventually_async(all_ready, READY_TIMEOUT_S, what="every client ready")
        say(f"{len(self.workers)} clients running")

    async def faults(self, injector: Injector) -> None:
        steps = schedule(self.args.seed, self.args.faults, self.args.kinds)
        (self.run_dir / "run.json").write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(self.args).items()},
                    "namespaces": self.topo.namespaced,
                    "steps": [asdict(s) for s in steps],
                },
                indent=1,
            )
        )
        rng = random.Random(self.args.seed + 1)
        await asyncio.sleep(WARMUP_S)
        for number, step in enumerate(steps, 1):
            await self.revive("before step")
            await self._await_master(injector)
            say(f"step {number}/{len(steps)}: {' + '.join(step.kinds)} for {step.hold_s} s")
            try:
                await injector.run_step(step, rng)
            except Exception as exc:  # a restart that failed: logged, revived before the next
                say(f"step {number} did not heal cleanly: {type(exc).__name__}: {exc}")
            await asyncio.sleep(step.quiet_s)

    async def _await_master(self, injector: Injector) -> None:
        """A step starts once the group has a master again (bounded: a group that stays
        headless still gets its faults, whose master faults are then skipped)."""

        async def has_master() -> bool:
            return await injector.master() is not None

        try:
            await eventually_async(has_master, MASTER_WAIT_S, what="a master")
        except TimeoutError:
            say(f"no master after {MASTER_WAIT_S} s; going on")

    async def revive(self, when: str) -> None:
        """Start every server that is not running: between steps, only one that exited on
        its own (every fault restarts what it killed). A client that exited is not restarted
        (its ids and sequence numbers would start again); both are logged to crashes.jsonl."""
        for worker in self.workers:
            if not worker.running and worker.name not in self.dead_workers:
                self.dead_workers.add(worker.name)
                self._crashed(worker, when, "not restarted")
        for process in self.cluster.all():
            if process.running:
                continue
            self._crashed(process, when, "restarting it")
            try:
                await process.start()
            except (RuntimeError, TimeoutError) as exc:
                say(f"{process.name} did not restart: {exc}")

    def _crashed(self, process: NodeProcess, when: str, action: str) -> None:
        last_line = (process.log_tail(2000).strip().splitlines() or [""])[-1][:300]
        say(f"{process.name} is not running ({when}); {action}. Its log ends: {last_line}")
        with (self.run_dir / "crashes.jsonl").open("a") as crashes:
            record = {"name": process.name, "t": time.time(), "when": when, "log": last_line}
            crashes.write(json.dumps(record) + "\n")

    async def restore(self) -> None:
        """Heal every link, continue every paused process, start every stopped one."""
        self.topo.heal_all()
        for process in self.cluster.all():
            process.resume()
        await self.revive("at the drain")
        for mount in self.cluster.mounts:
            (mount / "chaos-ballast").unlink(missing_ok=True)

    def history(self) -> History:
        return load_history(
            sorted((self.run_dir / "journal").glob("*.jsonl")),
            read_ledger(self.run_dir / "ledger.db"),
            self.run_dir / "faults.jsonl",
            self.run_dir / "crashes.jsonl",
        )

    async def drain(self) -> None:
        say("drain: healing everything, stopping the producers")
        await self.restore()
        producers = [w for w in self.workers if not w.name.startswith("consumer")]
        for worker in producers:
            if worker.process is not None and worker.running:
                worker.process.send_signal(signal.SIGUSR1)

        async def settled() -> bool:
            return all(_journal_has(self.journal(w), "settled") for w in producers)

        try:
            await eventually_async(settled, SETTLE_TIMEOUT_S, what="producers settled")
        except TimeoutError as exc:
            say(str(exc))
        await self._catch_up()

    async def _catch_up(self) -> None:
        """Wait until consumers received every acknowledged send and committed transaction,
        or made no progress for DRAIN_STALL_S."""
        loop = asyncio.get_running_loop()
        best, since = -1, loop.time()
        while True:
            verdict = check(self.history())
            missing = len(verdict.lost) + len(verdict.committed_invisible)
            if missing == 0:
                say("drain: consumers have everything")
                return
            if best < 0 or missing < best:
                best, since = missing, loop.time()
            elif loop.time() - since > DRAIN_STALL_S:
                say(f"drain: {missing} still missing after {DRAIN_STALL_S} s without progress")
                return
            await asyncio.sleep(CATCH_UP_POLL_S)

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)
        await self.cluster.stop()


async def run(args: argparse.Namespace, topo: AnyTopology) -> int:
    chaos = Run(args, topo)
    try:
        async with Admin(chaos.cluster.namesrv_addr, timeout_ms=2_000) as admin:
            injector = Injector(chaos.cluster, args.run_dir / "faults.jsonl", admin)
            await chaos.start_servers(admin, injector)
            await chaos.start_workload()
            await chaos.faults(injector)
            await chaos.drain()
    finally:
        say("stopping clients and servers")
        await chaos.stop()
    verdict = check(chaos.history())
    where = "network namespaces" if topo.namespaced else "loopback (partitions skipped)"
    title = (
        f"chaos run: seed {args.seed}, {args.faults} fault steps, {args.mode} mode, {where}, "
        f"run dir {args.run_dir}"
    )
    print(render(verdict, title), flush=True)
    (args.run_dir / "verdict.json").write_text(
        json.dumps({"ok": verdict.ok, **asdict(verdict)}, default=str)
    )
    return 0 if verdict.ok else 1


def make_topology(args: argparse.Namespace) -> AnyTopology:
    """Namespaces when this process may make them (and --loopback was not asked for)."""
    removed = netns.cleanup_stale() + unmount_stale()
    if removed:
        say(f"removed leftovers of crashed runs: {', '.join(removed)}")
    specs = node_specs(args.etcd_members)
    if not args.loopback and netns.netns_usable():
        return Topology(specs)
    say("network namespaces not usable: loopback, partitions skipped")
    return LoopbackTopology(specs)


def main(args: argparse.Namespace) -> int:
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if any(args.run_dir.iterdir()):
        # An earlier run's journals would be read as this one's.
        say(f"run directory {args.run_dir} is not empty: give a new one")
        return 2
    topo = make_topology(args)
    topo.create()
    try:
        # Before any thread exists: every later thread and socket lives in the client's network.
        topo.enter(CLIENT)
        return asyncio.run(run(args, topo))
    finally:
        topo.destroy()
