"""The chaos suite's server processes: etcd, a name server and one broker group of three.

    cluster = ChaosCluster(topology, run_dir, mode="controller")
    await cluster.start()          etcd ─▶ name server ─▶ b1, b2, b3 (in their namespaces)
    cluster.broker("b2").kill()    SIGKILL, SIGSTOP/SIGCONT, SIGTERM, restart on the same store
    await cluster.stop()

Each process runs as `ip netns exec <its namespace> <argv>` (`ip` execs the command, so the pid
we hold is the server's and signals reach it), in a session of its own, its output appended to
`<run>/logs/<name>.log`. Readiness is "its port accepts a connection from inside its own
namespace": a tiny Python probe runs there, because the runner may not reach the node (etcd is
on the CTL network only).

The broker settings are in one place, `broker_settings()`: `mode="controller"` is issue 14's
failover group (enableControllerMode, etcd endpoints, replica ids 1..3), `mode="4x"` a
SYNC_MASTER with two SLAVEs (no failover: useful to exercise the plumbing, and to show the
losses a 4.x group suffers).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.testing.chaos.netns import CTL, DATA, AnyTopology, NodeSpec
from tidemq.testing.processes import free_broker_port, free_port

START_TIMEOUT_S: Final = 40.0
STOP_TIMEOUT_S: Final = 20.0
KILL_TIMEOUT_S: Final = 10.0
# Debian's etcd-server installs it here.
ETCD_BIN: Final = shutil.which("etcd") or "/usr/bin/etcd"
GROUP: Final = "broker-a"
CLUSTER: Final = "ChaosCluster"
BROKERS: Final = ("b1", "b2", "b3")
NAMESRV: Final = "ns1"
CLIENT: Final = "cli"
# Ports inside namespaces (every node has its own addresses, so they never collide).
NS_PORT: Final = 9876
BROKER_PORT: Final = 10911
ETCD_CLIENT_PORT: Final = 2379
ETCD_PEER_PORT: Final = 2380
# A tmpfs store (for the disk-full fault) of this size holds a long run's data far below the
# broker's own disk-usage limits (diskMaxUsedSpaceRatio); tmpfs takes memory only as it fills.
TMPFS_STORE_SIZE: Final = "512m"
# Small segments: at the workload's few tens of KB/s a new one is needed every few seconds, so
# a full disk is felt within a disk-full fault's hold, not only by the next config write.
COMMIT_LOG_SEGMENT_BYTES: Final = 256 * 1024
MAX_MESSAGE_BYTES: Final = 64 * 1024

_PROBE: Final = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)
"""


def node_specs(etcd_members: int = 1) -> list[NodeSpec]:
    """The run's nodes: etcd member(s) on CTL, the name server and the client on DATA, the
    brokers on both."""
    etcd = [NodeSpec(f"etcd{i}", (CTL,)) for i in range(1, etcd_members + 1)]
    brokers = [NodeSpec(name, (DATA, CTL)) for name in BROKERS]
    return [*etcd, NodeSpec(NAMESRV, (DATA,)), *brokers, NodeSpec(CLIENT, (DATA,))]


@dataclass
class NodeProcess:
    """One server process in a node's namespace; start/kill/pause/resume/stop/restart."""

    name: str
    node: str
    argv: list[str]
    log_path: Path
    prefix: list[str]
    host: str
    port: int
    store_dir: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0
    paused: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return f"<{self.log_path} missing>"

    def spawn(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.starts += 1
        self.paused = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [*self.prefix, *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    async def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited while starting:\n{self.log_tail()}")
            probe = await asyncio.create_subprocess_exec(
                *self.prefix, sys.executable, "-c", _PROBE, self.host, str(self.port), "2"
            )
            if await probe.wait() == 0:
                return
            if loop.time() > deadline:
                raise TimeoutError(f"{self.name} not ready in {timeout_s} s:\n{self.log_tail()}")

    async def start(self) -> None:
        self.spawn()
        try:
            await self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL and reap (a stopped process dies of SIGKILL as well)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(KILL_TIMEOUT_S)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        """SIGTERM, wait for a clean exit; SIGKILL when it takes too long."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
        self.paused = False

    async def restart(self) -> None:
        await self.stop()
        await self.start()


def broker_settings(
    mode: str,
    *,
    broker_index: int,
    etcd_endpoints: str,
    ha_secret: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """THE place that says how a chaos broker is configured (`--set` keys), per mode.

    controller: issue 14's group, every broker a replica with id 1..3, roles the controller's.
    4x: b1 SYNC_MASTER (brokerId 0), b2 and b3 SLAVEs 1 and 2 (no failover).
    """
    common = {
        "brokerClusterName": CLUSTER,
        "vipChannelEnabled": "false",
        "haSecret": ha_secret,
        "mappedFileSizeCommitLog": str(COMMIT_LOG_SEGMENT_BYTES),
        "maxMessageSize": str(MAX_MESSAGE_BYTES),
        "mappedFileSizeConsumeQueue": str(20_000 * 20),
        # Check-backs within the run: a half left open by a failover is resolved before drain.
        "transactionCheckInterval": "1000",
        "transactionTimeOut": "2000",
        "slaveSyncIntervalMs": "1000",
    }
    if mode == "controller":
        role = {
            "enableControllerMode": "true",
            "controllerEtcdEndpoints": etcd_endpoints,
            "controllerEtcdPrefix": "/tidemq-chaos",
            "controllerLeaseTtlSeconds": "2",
            "haMaxTimeSlaveNotCatchup": "3000",
            "brokerId": str(broker_index + 1),
        }
    elif mode == "4x":
        role = (
            {"brokerRole": "SYNC_MASTER", "brokerId": "0"}
            if broker_index == 0
            else {"brokerRole": "SLAVE", "brokerId": str(broker_index)}
        )
    else:
        raise ValueError(f"mode {mode!r}: controller or 4x")
    return {**common, **role, **(extra or {})}


@dataclass
class ChaosCluster:
    """etcd member(s), one name server and the group's three brokers of one run."""

    topology: AnyTopology
    run_dir: Path
    mode: str = "controller"
    etcd_members: int = 1
    tmpfs_stores: bool = False
    broker_extra: Mapping[str, str] = field(default_factory=dict)
    ha_secret: str = field(default_factory=lambda: secrets.token_hex(16))
    etcds: list[NodeProcess] = field(default_factory=list)
    namesrv: NodeProcess | None = None
    brokers: dict[str, NodeProcess] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        loopback = not self.topology.namespaced
        self.etcds = [self._etcd(i, loopback) for i in range(1, self.etcd_members + 1)]
        port = free_port() if loopback else NS_PORT
        self.namesrv = self._process(
            "namesrv",
            NAMESRV,
            port,
            ["namesrv", "--port", str(port), "--data-dir", str(self.run_dir / "namesrv")],
        )
        for index, name in enumerate(BROKERS):
            self.brokers[name] = self._broker(index, name, loopback)

    @property
    def namesrv_addr(self) -> str:
        assert self.namesrv is not None
        return self.namesrv.address

    @property
    def etcd_endpoints(self) -> str:
        return ";".join(e.address for e in self.etcds)

    def _process(self, name: str, node: str, port: int, tidemq_args: list[str]) -> NodeProcess:
        return NodeProcess(
            name=name,
            node=node,
            argv=[sys.executable, "-m", "tidemq.cli.main", "--log-level", "INFO", *tidemq_args],
            log_path=self.run_dir / "logs" / f"{name}.log",
            prefix=self.topology.exec_prefix(node),
            host=self.topology.address(node, DATA),
            port=port,
        )

    def _etcd(self, index: int, loopback: bool) -> NodeProcess:
        node = f"etcd{index}"
        members = range(1, self.etcd_members + 1)
        if loopback:
            client, peers = free_port(), {i: free_port() for i in members}
        else:
            client, peers = ETCD_CLIENT_PORT, dict.fromkeys(members, ETCD_PEER_PORT)
        ip = self.topology.address(node, CTL)
        peer_url = f"http://{ip}:{peers[index]}"
        initial = ",".join(
            f"etcd{i}=http://{self.topology.address(f'etcd{i}', CTL)}:{peers[i]}" for i in members
        )
        argv = [ETCD_BIN, "--name", node, "--data-dir", str(self.run_dir / node)]
        argv += ["--listen-client-urls", f"http://{ip}:{client}"]
        argv += ["--advertise-client-urls", f"http://{ip}:{client}"]
        argv += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        argv += ["--initial-cluster", initial, "--initial-cluster-state", "new"]
        argv += ["--initial-cluster-token", f"tmqc-{os.getpid()}"]
        log_path = self.run_dir / "logs" / f"{node}.log"
        prefix = self.topology.exec_prefix(node)
        return NodeProcess(node, node, argv, log_path, prefix, ip, client)

    def _broker(self, index: int, name: str, loopback: bool) -> NodeProcess:
        port = free_broker_port() if loopback else BROKER_PORT
        ip = self.topology.address(name, DATA)
        store = self.run_dir / name / "store"
        settings = broker_settings(
            self.mode,
            broker_index=index,
            etcd_endpoints=self.etcd_endpoints,
            ha_secret=self.ha_secret,
            extra={"brokerIP1": ip, "haListenPort": str(port + 1), **self.broker_extra},
        )
        args = ["broker", "--namesrv-addr", self.namesrv_addr, "--port", str(port)]
        args += ["--data-dir", str(store), "--broker-name", GROUP]
        args += [word for k, v in settings.items() for word in ("--set", f"{k}={v}")]
        process = self._process(name, name, port, args)
        process.store_dir = store
        return process

    def broker(self, name: str) -> NodeProcess:
        return self.brokers[name]

    def all(self) -> list[NodeProcess]:
        assert self.namesrv is not None
        return [*self.etcds, self.namesrv, *self.brokers.values()]

    def broker_by_address(self, address: str) -> str | None:
        """The broker node serving `address` (ip:port), by address or, on loopback, port."""
        for name, process in self.brokers.items():
            if process.address == address:
                return name
        return None

    async def start(self) -> None:
        if self.tmpfs_stores:
            self._mount_stores()
        for etcd in self.etcds:
            etcd.spawn()
        await asyncio.gather(*(e.wait_ready() for e in self.etcds))
        assert self.namesrv is not None
        await self.namesrv.start()
        # Controller mode: all three race for the state key; the first one's creation wins.
        for broker in self.brokers.values():
            broker.spawn()
        await asyncio.gather(*(b.wait_ready() for b in self.brokers.values()))

    def _mount_stores(self) -> None:
        """Each broker's store on a tmpfs of its own (the disk-full fault fills one); the mount
        source names the run, so a later run can unmount it if this one crashes."""
        for name, broker in self.brokers.items():
            assert broker.store_dir is not None
            broker.store_dir.mkdir(parents=True, exist_ok=True)
            source = f"tmqc-{os.getpid()}-{name}"
            options = f"size={TMPFS_STORE_SIZE}"
            mount = ["mount", "-t", "tmpfs", "-o", options, source, str(broker.store_dir)]
            subprocess.run(mount, check=True, capture_output=True)
            self.mounts.append(broker.store_dir)

    async def stop(self) -> None:
        """Stop everything (brokers first), then unmount the tmpfs stores."""
        for process in reversed(self.all()):
            try:
                await process.stop()
            except (OSError, subprocess.SubprocessError):
                process.kill()
        for mount in self.mounts:
            umount = ["umount", "-l", str(mount)]
            await asyncio.to_thread(subprocess.run, umount, capture_output=True, check=False)
        self.mounts.clear()


def unmount_stale() -> list[str]:
    """Unmount tmpfs stores left by crashed runs (mount source `tmqc-<dead pid>-<node>`)."""
    removed = []
    with open("/proc/mounts") as mounts:
        lines = mounts.read().splitlines()
    for line in lines:
        source, target, *_ = line.split()
        if not source.startswith("tmqc-"):
            continue
        pid = source.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
            removed.append(target)
    return removed
