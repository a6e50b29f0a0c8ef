"""The chaos suite's network: one namespace per node, two bridges in a hub namespace.

                       hub namespace (tmqc-<pid>-hub)
          ┌──────────── bridge DATA 10.213.1.0/24 ───────────────┐
          │      │       │       │       │                       │
        ns1-d  b1-d    b2-d    b3-d    cli-d          (hub-side veth ends)
          │      │       │       │       │
         ns1     b1      b2      b3     cli   etcd1 ...   (one namespace each)
                 │       │       │               │
               b1-c    b2-c    b3-c           etcd1-c
          └──────┴─ bridge CTL 10.213.2.0/24 ─────┴──────────┘

Every name starts with `tmqc-<pid>-` (the runner's pid): a runner that crashed leaves
namespaces whose pid is dead, and the next run removes them first (`cleanup_stale`). Deleting a
namespace deletes the veth ends in it, and a veth pair dies with either end, so removing the
namespaces removes everything; nothing is created in the root namespace and no address is
ever configured outside the suite's namespaces.

A partition is `ip link set <hub-side end> down`: the node's own interface stays up, so its
processes see a silent network (no RST, no "unreachable"), which is what a pulled cable or a
dead switch port looks like. `tc netem` and nftables are not available, so there are no delays
or one-way losses: links are up or down.

Where namespaces cannot be made (not root), `LoopbackTopology` places every node on 127.0.0.1
with ports of its own and partitions are not possible (the runner marks them skipped).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

PREFIX: Final = "tmqc-"
DATA: Final = "data"
CTL: Final = "ctl"
# 10.SUBNET_X.<1 DATA | 2 CTL>.<host>: private, inside the suite's namespaces only.
SUBNET_X: Final = 213
_NET_Y: Final = {DATA: 1, CTL: 2}
_HUB: Final = "hub"
_CLONE_NEWNET: Final = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def netns_usable() -> bool:
    """True when this process may create network namespaces (root, `ip` present)."""
    if os.geteuid() != 0:
        return False
    probe = f"{PREFIX}probe-{os.getpid()}"
    try:
        if _ip("netns", "add", probe, check=False).returncode != 0:
            return False
        _ip("netns", "del", probe, check=False)
    except FileNotFoundError:
        return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(ns: str) -> None:
    """SIGKILL every process in namespace `ns` (deleting a namespace kills nothing)."""
    for word in _ip("netns", "pids", ns, check=False).stdout.split():
        if word == str(os.getpid()):
            continue  # the runner itself, entered into the client's namespace
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)


def cleanup_stale() -> list[str]:
    """Delete the namespaces of runners that are no longer alive; returns their names."""
    try:
        listing = _ip("netns", "list", check=False).stdout
    except FileNotFoundError:
        return []
    removed = []
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.match(rf"{PREFIX}(\d+)-", name)
        if match and not _pid_alive(int(match.group(1))):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class NodeSpec:
    """A node's name (also its namespace suffix, ≤ 10 characters) and the networks it joins."""

    name: str
    networks: tuple[str, ...]


@dataclass
class Topology:
    """Namespaces, bridges and veths of one run; `create()` builds, `destroy()` removes."""

    nodes: list[NodeSpec]
    run_id: int = field(default_factory=os.getpid)
    namespaced: bool = True
    _hosts: dict[str, int] = field(default_factory=dict)
    _down: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            if len(node.name) > 10 or not re.fullmatch(r"[a-z0-9]+", node.name):
                raise ValueError(f"node name {node.name!r}: a-z0-9, at most 10 characters")
            self._hosts[node.name] = 10 + index

    def ns(self, node: str) -> str:
        return f"{PREFIX}{self.run_id}-{node}"

    @property
    def hub(self) -> str:
        return self.ns(_HUB)

    def address(self, node: str, network: str = DATA) -> str:
        """The node's IPv4 address on `network` (DATA or CTL)."""
        return f"10.{SUBNET_X}.{_NET_Y[network]}.{self._hosts[node]}"

    def node_of(self, address: str) -> str | None:
        """The node an address ("ip" or "ip:port") belongs to."""
        host = address.rsplit(":", 1)[0]
        for node in self._hosts:
            if host in (self.address(node, DATA), self.address(node, CTL)):
                return node
        return None

    def exec_prefix(self, node: str) -> list[str]:
        """Argv words that run a command inside the node's namespace."""
        return ["ip", "netns", "exec", self.ns(node)]

    def create(self) -> None:
        """Build the namespaces, the hub's two bridges and a veth pair per node and network."""
        try:
            _ip("netns", "add", self.hub)
            hub = ["-n", self.hub]
            for network in (DATA, CTL):
                _ip(*hub, "link", "add", network, "type", "bridge")
                _ip(*hub, "link", "set", network, "up")
            for node in self.nodes:
                self._create_node(node)
        except BaseException:
            self.destroy()
            raise

    def _create_node(self, node: NodeSpec) -> None:
        ns = self.ns(node.name)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        for network in node.networks:
            hub_end = self._hub_end(node.name, network)
            # The node's end is made in its namespace at once: in the hub, the name `data` or
            # `ctl` is the bridge's.
            _ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", network,
                "netns", ns)  # fmt: skip
            _ip("-n", self.hub, "link", "set", hub_end, "master", network, "up")
            prefix = f"{self.address(node.name, network)}/24"
            _ip("-n", ns, "addr", "add", prefix, "dev", network)
            _ip("-n", ns, "link", "set", network, "up")

    @staticmethod
    def _hub_end(node: str, network: str) -> str:
        return f"{node}-{network[0]}"

    def destroy(self) -> None:
        """Delete every namespace of this run (veths and bridges go with them)."""
        for name in [*(self.ns(n.name) for n in self.nodes), self.hub]:
            _kill_inside(name)
            _ip("netns", "del", name, check=False)

    def _set(self, node: str, networks: Iterable[str], up: bool) -> None:
        spec = next(n for n in self.nodes if n.name == node)
        for network in networks:
            if network not in spec.networks:
                continue
            end = self._hub_end(node, network)
            _ip("-n", self.hub, "link", "set", end, "up" if up else "down")
            (self._down.discard if up else self._down.add)(end)

    def partition(self, node: str) -> None:
        """Cut the node from everyone: both hub-side ends down."""
        self._set(node, (DATA, CTL), up=False)

    def partition_from_etcd(self, node: str) -> None:
        """Cut the node from etcd only (the CTL network); DATA stays up."""
        self._set(node, (CTL,), up=False)

    def heal(self, node: str) -> None:
        self._set(node, (DATA, CTL), up=True)

    def heal_all(self) -> None:
        for node in self.nodes:
            self.heal(node.name)

    @property
    def partitioned(self) -> frozenset[str]:
        """Hub-side ends that are down now."""
        return frozenset(self._down)

    def enter(self, node: str) -> None:
        """Move this process's network into the node's namespace (setns; Python 3.11 has no
        os.setns). Call before any thread starts: a thread keeps the namespace it was made in."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.ns(node)}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.ns(node)} failed")
        finally:
            os.close(fd)


@dataclass
class LoopbackTopology:
    """The fallback without namespaces: every node on 127.0.0.1, no partitions."""

    nodes: list[NodeSpec]
    namespaced: bool = False

    def address(self, node: str, network: str = DATA) -> str:
        return "127.0.0.1"

    def node_of(self, address: str) -> str | None:
        return None  # ports, not addresses, tell nodes apart here: the caller maps them

    def exec_prefix(self, node: str) -> list[str]:
        return []

    def create(self) -> None:
        pass

    def destroy(self) -> None:
        pass

    def partition(self, node: str) -> None:
        raise NotImplementedError("partitions need network namespaces")

    partition_from_etcd = partition

    def heal(self, node: str) -> None:
        pass

    def heal_all(self) -> None:
        pass

    @property
    def partitioned(self) -> frozenset[str]:
        return frozenset()

    def enter(self, node: str) -> None:
        pass


AnyTopology = Topology | LoopbackTopology
