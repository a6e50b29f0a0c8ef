"""`process_cluster()`: name servers and brokers as separate `tidemq` processes, for fault tests.

`local_cluster()` runs everything in the test's own event loop, which is right for most tests
but cannot show what a real crash does: a SIGKILL leaves no `stop()` behind, a SIGSTOP freezes a
peer's socket without closing it, and a restarted process rebuilds its state from disk alone.
This module starts each server as the user would (`tidemq namesrv`, `tidemq broker --set ...`)
on loopback ports chosen free, with its own store and log file under the test's directory, and
lets a test kill, pause, stop and restart each one on the same ports and store.

Readiness is "the port accepts a connection". A broker's registration with the name servers is
not awaited here: tests wait for the route they need with `eventually`.

Replicated groups (issue 13): `slaves=n` adds to each group broker-a, broker-b... the slaves
broker-a-s1 ... broker-a-s<n> (same brokerName, brokerId 1..n, brokerRole SLAVE, their own store
and ports), listed in `ProcessCluster.slaves` so `brokers` keeps meaning "the masters". Masters
and slaves share one haSecret; the masters' haListenPort is left at its default, listenPort + 1,
which free_broker_port() keeps free.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.testing.cluster import TEST_BROKER_SETTINGS

# Python start-up, imports and store recovery of a small store, on a loaded 2-core machine.
START_TIMEOUT_S: Final = 30.0
# SIGTERM to exit: persist offsets, unregister from the name servers, close the store.
STOP_TIMEOUT_S: Final = 20.0
# How long a process may take to be reaped after SIGKILL (the kernel frees its mappings).
KILL_TIMEOUT_S: Final = 10.0
# Between connection attempts while a server starts.
PORT_POLL_INTERVAL_S: Final = 0.05
# How much of a server's log a start failure quotes.
LOG_TAIL_CHARS: Final = 4000
# How many times a port pick is retried when another process took the port meanwhile.
PORT_PICK_ATTEMPTS: Final = 50


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the OS's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# The ports (VIP, listen, HA) of every broker port handed out by this process: brokers are
# picked before any of them binds, so a later pick must not land on an earlier one's trio.
_handed_out: set[int] = set()


def free_broker_port() -> int:
    """A free port whose VIP neighbour (port - 2) and HA neighbour (port + 1) are free as well,
    and none of them handed out to an earlier broker of this process."""
    for _ in range(PORT_PICK_ATTEMPTS):
        port = free_port()
        trio = {port - 2, port, port + 1}
        if port <= 1024 or trio & _handed_out:
            continue
        if _port_is_free(port - 2) and _port_is_free(port + 1):
            _handed_out.update(trio)
            return port
    raise RuntimeError("no free port with free neighbours found")


@dataclass
class ServerProcess:
    """One `tidemq` server process; `args` are the CLI words after `tidemq`."""

    name: str
    args: list[str]
    port: int
    log_path: Path
    store_dir: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return f"<{self.log_path} missing>"
        return text[-LOG_TAIL_CHARS:]

    async def start(self) -> None:
        """Start the process (same ports, same store) and wait until its port accepts."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._spawn()
        try:
            await self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def command(self) -> list[str]:
        """The argv to exec: `tidemq` with `args` (a subclass runs another program)."""
        return [sys.executable, "-m", "tidemq.cli.main", *self.args]

    async def wait_ready(self) -> None:
        """Return once the started process serves: by default, once its port accepts."""
        await self._wait_accepting()

    def _spawn(self) -> None:
        # Fork and exec only: the process's start-up is awaited by wait_ready.
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    async def _wait_accepting(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited while starting:\n{self.log_tail()}")
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"{self.name} did not accept on {self.port} within "
                        f"{START_TIMEOUT_S} s:\n{self.log_tail()}"
                    ) from None
                await asyncio.sleep(PORT_POLL_INTERVAL_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise RuntimeError(f"{self.name} is not running")
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs. Returns once the process is gone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            # Reaped here, so the ports and the store lock are free when this returns; after
            # SIGKILL this is the kernel tearing the process down, not the process's own work.
            self.process.wait(KILL_TIMEOUT_S)
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets open and answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    async def stop(self) -> int:
        """SIGTERM and wait for the process's clean exit; returns its exit code."""
        process = self.process
        if process is None or process.poll() is not None:
            self.process = None
            return 0 if process is None else process.returncode
        process.send_signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
        process.terminate()
        try:
            code = await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(
                f"{self.name} did not stop within {STOP_TIMEOUT_S} s:\n{self.log_tail()}"
            ) from None
        self.process = None
        return code


@dataclass
class ProcessCluster:
    root: Path
    namesrvs: list[ServerProcess] = field(default_factory=list)
    # The masters (brokerId 0), broker-a, broker-b, ...
    brokers: list[ServerProcess] = field(default_factory=list)
    # Every group's slaves, group by group: broker-a-s1, broker-a-s2, broker-b-s1, ...
    slaves: list[ServerProcess] = field(default_factory=list)
    # The haSecret masters and slaves were given (None: no replication configured).
    ha_secret: str | None = None

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.address for n in self.namesrvs)

    def all(self) -> list[ServerProcess]:
        """Every process in start order: name servers, masters, slaves."""
        return [*self.namesrvs, *self.brokers, *self.slaves]

    def slaves_of(self, master: ServerProcess | str) -> list[ServerProcess]:
        """The slaves of one group, by its master or its brokerName ("broker-a")."""
        name = master if isinstance(master, str) else master.name
        return [s for s in self.slaves if s.name.startswith(f"{name}-s")]


def _set_flags(settings: Mapping[str, str]) -> list[str]:
    return [word for key, value in settings.items() for word in ("--set", f"{key}={value}")]


def namesrv_process(root: Path, index: int, log_level: str) -> ServerProcess:
    """Name server `namesrv-<index>` on a free port, its data and log under `root`."""
    port = free_port()
    return ServerProcess(
        name=f"namesrv-{index}",
        args=[
            "--log-level",
            log_level,
            "namesrv",
            "--port",
            str(port),
            "--data-dir",
            str(root / f"namesrv-{index}"),
        ],
        port=port,
        log_path=root / "logs" / f"namesrv-{index}.log",
    )


def group_name(index: int) -> str:
    """The brokerName of group `index`: broker-a, broker-b, ..."""
    return f"broker-{chr(ord('a') + index)}"


def broker_process(
    root: Path,
    name: str,
    broker_name: str,
    namesrv_addr: str,
    settings: Mapping[str, str],
    log_level: str,
) -> ServerProcess:
    """Broker process `name` of group `broker_name` on a free port trio (VIP, listen, HA), its
    store and log under `root`."""
    port = free_broker_port()
    store = root / name
    return ServerProcess(
        name=name,
        args=[
            "--log-level",
            log_level,
            "broker",
            "--namesrv-addr",
            namesrv_addr,
            "--port",
            str(port),
            "--data-dir",
            str(store),
            "--broker-name",
            broker_name,
            *_set_flags(settings),
        ],
        port=port,
        log_path=root / "logs" / f"{name}.log",
        store_dir=store,
    )


def _group_processes(
    root: Path,
    index: int,
    slaves: int,
    namesrv_addr: str,
    settings: Mapping[str, str],
    slave_settings: Mapping[str, str],
    log_level: str,
) -> tuple[ServerProcess, list[ServerProcess]]:
    """Group `index`'s master and its `slaves` slaves (brokerId 1..slaves)."""
    name = group_name(index)
    master = broker_process(root, name, name, namesrv_addr, settings, log_level)
    followers = [
        broker_process(
            root,
            f"{name}-s{broker_id}",
            name,
            namesrv_addr,
            {**settings, "brokerRole": "SLAVE", "brokerId": str(broker_id), **slave_settings},
            log_level,
        )
        for broker_id in range(1, slaves + 1)
    ]
    return master, followers


@contextlib.asynccontextmanager
async def process_cluster(
    root: Path,
    *,
    namesrvs: int = 1,
    brokers: int = 1,
    broker_settings: Mapping[str, str] | None = None,
    log_level: str = "INFO",
    slaves: int = 0,
    ha_secret: str | None = None,
    slave_settings: Mapping[str, str] | None = None,
) -> AsyncIterator[ProcessCluster]:
    """Start `namesrvs` name servers and `brokers` broker groups (broker-a, broker-b, ...) as
    processes, each group a master and `slaves` slaves.

    `broker_settings` are broker.conf keys given to every broker with `--set` (masters and
    slaves); `slave_settings` are given to slaves after them (they win). With slaves, or with
    `ha_secret` given, every broker gets haSecret=`ha_secret` (default: a random one, in
    `ProcessCluster.ha_secret`). Masters start before slaves. On exit every process still running
    is stopped with SIGTERM (SIGKILL if it does not stop in time), slaves first.
    """
    cluster = ProcessCluster(root=root)
    cluster.namesrvs.extend(namesrv_process(root, index, log_level) for index in range(namesrvs))
    settings = {"brokerIP1": "127.0.0.1", **TEST_BROKER_SETTINGS, **(broker_settings or {})}
    if slaves or ha_secret is not None:
        cluster.ha_secret = ha_secret if ha_secret is not None else secrets.token_hex(16)
        settings["haSecret"] = cluster.ha_secret
    for index in range(brokers):
        master, group_slaves = _group_processes(
            root, index, slaves, cluster.namesrv_addr, settings, slave_settings or {}, log_level
        )
        cluster.brokers.append(master)
        cluster.slaves.extend(group_slaves)
    try:
        for server in cluster.all():
            await server.start()
        yield cluster
    finally:
        for server in reversed(cluster.all()):
            try:
                await server.stop()
            except TimeoutError:
                pass  # already killed by stop(); the test's own failure says more
