"""Start and stop the servers under test: every one on 127.0.0.1, free ports, data in a temp dir.

Each server is a child process of the suite and is stopped by its own pid (never by name), so a
run leaves nothing behind. Binaries come from Debian packages (`make bench-deps`); a peer whose
binary is missing is reported as absent, not as a failure.

Durability of each configuration, as the table states it:
  redis         AOF appendonly yes; appendfsync set per driver (everysec / always) by CONFIG SET
  nats          JetStream file storage, one replica (2.9: fsync every 2 min, ack before fsync)
  rabbitmq      durable classic queue, persistent messages, publisher confirms (fsync before ack)
  tidemq        `tidemq dev` (separate process), flushDiskType ASYNC_FLUSH or SYNC_FLUSH
  nats R3       three nats-server processes in one cluster (routes on loopback), JetStream file
                storage; a stream with num_replicas=3 acks once two of three stored it
  tidemq group  `tidemq namesrv` and one `tidemq broker` process per master and slave
                (replication cases: brokerRole ASYNC_MASTER / SYNC_MASTER / SLAVE)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sidebyside.common import HOST, free_port, wait_port

log = logging.getLogger(__name__)

START_TIMEOUT_S = 90.0  # RabbitMQ boots an Erlang VM; the others are up in well under a second
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Server:
    name: str
    address: str  # what the driver connects to: host:port (tidemq: the name server)
    pid: int
    version: str
    durability: str
    broker_address: str = ""  # tidemq only: the broker's own port, for the raw load generator
    pids: tuple[int, ...] = ()  # every process of a multi-process server (nats_cluster)


def binary_present(name: str) -> bool:
    """Whether the server `name` (redis, nats, rabbitmq) is installed."""
    binaries = {"redis": "redis-server", "nats": "nats-server", "rabbitmq": "rabbitmq-server"}
    return shutil.which(binaries[name]) is not None or (
        name == "rabbitmq" and Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists()
    )


def _stop(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    # Children left in the group (the Erlang VM under rabbitmq-server's script) go with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _spawn(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, stopped as one
        )


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (
        (done.stdout or done.stderr).strip().splitlines()[0]
        if (done.stdout or done.stderr)
        else "?"
    )


@contextlib.contextmanager
def _running(
    name: str, argv: list[str], port: int, root: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    process = _spawn(argv, root / f"{name}.log", env)
    try:
        if not wait_port(port, START_TIMEOUT_S, alive=lambda: process.poll() is None):
            tail = (root / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} did not open port {port}: {tail}")
        yield process
    finally:
        _stop(process)


@contextlib.contextmanager
def redis(root: Path) -> Iterator[Server]:
    port = free_port()
    data = root / "redis"
    data.mkdir()
    argv = ["redis-server", "--bind", HOST, "--port", str(port), "--dir", str(data)]
    argv += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
    argv += ["--daemonize", "no", "--protected-mode", "yes"]
    with _running("redis", argv, port, root) as process:
        yield Server(
            "redis",
            f"{HOST}:{port}",
            process.pid,
            _version(["redis-server", "--version"]),
            "AOF, appendfsync per row",
        )


@contextlib.contextmanager
def nats(root: Path) -> Iterator[Server]:
    port = free_port()
    data = root / "nats"
    data.mkdir()
    conf = data / "nats.conf"
    conf.write_text(
        f"listen: {HOST}:{port}\nmax_payload: 8MB\n"
        f'jetstream {{\n  store_dir: "{data}/js"\n  max_memory_store: 1GB\n'
        "  max_file_store: 20GB\n}\n"
    )
    with _running("nats", ["nats-server", "-c", str(conf)], port, root) as process:
        yield Server(
            "nats",
            f"{HOST}:{port}",
            process.pid,
            _version(["nats-server", "--version"]),
            "JetStream file storage, R1",
        )


@contextlib.contextmanager
def rabbitmq(root: Path) -> Iterator[Server]:
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    data = root / "rabbitmq"
    (data / "log").mkdir(parents=True)
    (data / "enabled_plugins").write_text("[].\n")
    (data / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = {HOST}:{port}\ndisk_free_limit.absolute = 1GB\n"
    )
    cookie = data / ".erlang.cookie"
    cookie.write_text("TIDEMQBENCHCOOKIE")
    cookie.chmod(0o400)
    erl_args = "-kernel inet_dist_use_interface {127,0,0,1}"
    env = {
        **os.environ,
        "HOME": str(data),
        "RABBITMQ_NODENAME": f"bench{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(data / "mnesia"),
        "RABBITMQ_LOG_BASE": str(data / "log"),
        "RABBITMQ_PID_FILE": str(data / "rabbit.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(data / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(data / "rabbitmq.conf"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": erl_args,
        "RABBITMQ_CTL_ERL_ARGS": erl_args,
        "ERL_EPMD_ADDRESS": HOST,
        "ERL_EPMD_PORT": str(epmd_port),
    }
    # Our own epmd on a free port, so the Erlang VM registers there and we stop what we started.
    with _running(
        "epmd", ["epmd", "-address", HOST, "-port", str(epmd_port)], epmd_port, data, env
    ):
        argv = ["/usr/lib/rabbitmq/bin/rabbitmq-server"]
        with _running("rabbitmq", argv, port, data, env) as process:
            version = _version(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"])
            yield Server(
                "rabbitmq",
                f"{HOST}:{port}",
                process.pid,
                f"rabbitmq-server {version}",
                "durable classic queue, persistent, confirms",
            )


@contextlib.contextmanager
def tidemq(root: Path, flush: str, *extra_settings: str) -> Iterator[Server]:
    """`tidemq dev` as a separate process with flushDiskType=`flush`, data under `root`."""
    namesrv_port, broker_port = free_port(), free_port()
    data = root / f"tidemq-{flush.lower()}-{broker_port}"
    data.mkdir()
    argv = [sys.executable, "-m", "tidemq.cli.main", "--log-level", "WARNING", "dev"]
    argv += ["--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port)]
    argv += ["--data-dir", str(data / "store"), "--set", f"flushDiskType={flush}"]
    argv += ["--set", "vipChannelEnabled=false"]
    for setting in extra_settings:
        argv += ["--set", setting]
    with _running("tidemq", argv, broker_port, data) as process:
        wait_port(namesrv_port, START_TIMEOUT_S)
        from tidemq import __version__

        yield Server(
            "tidemq",
            f"{HOST}:{namesrv_port}",
            process.pid,
            f"tidemq {__version__}",
            f"commit log, {flush}" + (" (group commit)" if flush == "SYNC_FLUSH" else ""),
            f"{HOST}:{broker_port}",
        )


NATS_REPLICAS = 3  # the replicated peer: a three-node JetStream cluster


@contextlib.contextmanager
def nats_cluster(root: Path, nodes: int = NATS_REPLICAS) -> Iterator[Server]:
    """`nodes` nats-server processes forming one cluster on loopback, JetStream on each.

    The Server's address lists every node's client address, comma-separated (NatsR3Driver
    connects to all of them). JetStream's meta leader is elected a moment after the routes
    connect; the driver retries its first stream creation until then.
    """
    client_ports = [free_port() for _ in range(nodes)]
    route_ports = [free_port() for _ in range(nodes)]
    with contextlib.ExitStack() as stack:
        pids = []
        for index, (port, route_port) in enumerate(zip(client_ports, route_ports, strict=True)):
            data = root / f"nats-r{index}"
            data.mkdir(parents=True)
            routes = ", ".join(
                f"nats-route://{HOST}:{other}" for other in route_ports if other != route_port
            )
            conf = data / "nats.conf"
            conf.write_text(
                f"server_name: bench-r{index}\nlisten: {HOST}:{port}\nmax_payload: 8MB\n"
                f'jetstream {{\n  store_dir: "{data}/js"\n  max_memory_store: 1GB\n'
                "  max_file_store: 20GB\n}\n"
                f"cluster {{\n  name: bench\n  listen: {HOST}:{route_port}\n"
                f"  routes: [{routes}]\n}}\n"
            )
            argv = ["nats-server", "-c", str(conf)]
            process = stack.enter_context(_running(f"nats-r{index}", argv, port, data))
            pids.append(process.pid)
        yield Server(
            "nats-r3",
            ",".join(f"{HOST}:{port}" for port in client_ports),
            pids[0],
            _version(["nats-server", "--version"]),
            f"JetStream file storage, R{nodes} ({nodes} processes, one cluster)",
            pids=tuple(pids),
        )


@dataclass(frozen=True)
class Broker:
    """One `tidemq broker` process of a group."""

    name: str
    address: str  # host:listenPort
    pid: int
    store: Path
    log: Path

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass(frozen=True)
class Group:
    """A name server and one broker group (a master and its slaves), each its own process."""

    server: Server  # what the drivers use: address = the name server, broker = the master
    master: Broker
    slaves: tuple[Broker, ...]
    namesrv: str
    secret: str
    root: Path

    @property
    def pids(self) -> dict[str, int]:
        return {b.name: b.pid for b in (self.master, *self.slaves)}


# Set by bench_replication.py --no-uvloop: the group's processes keep asyncio's default loop.
GROUP_UVLOOP = {"on": True}
_NO_UVLOOP = (
    "import sys, tidemq.remoting.loop as loop; loop.install_uvloop = lambda: False; "
    "from tidemq.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def _tidemq_argv(*words: str) -> list[str]:
    start = ["-m", "tidemq.cli.main"] if GROUP_UVLOOP["on"] else ["-c", _NO_UVLOOP]
    return [sys.executable, *start, "--log-level", "WARNING", *words]


@contextlib.contextmanager
def tidemq_namesrv(root: Path) -> Iterator[str]:
    """`tidemq namesrv` on a free port; yields its address."""
    port = free_port()
    data = root / f"namesrv-{port}"
    data.mkdir(parents=True)
    argv = _tidemq_argv("namesrv", "--port", str(port), "--data-dir", str(data))
    with _running("namesrv", argv, port, data):
        yield f"{HOST}:{port}"


@contextlib.contextmanager
def tidemq_broker(
    root: Path, namesrv: str, name: str, settings: dict[str, str], store: Path | None = None
) -> Iterator[Broker]:
    """`tidemq broker` named `name` (brokerName from `settings`), on a port whose HA neighbour
    (port + 1, haListenPort's default) is free; its store under `root` unless given."""
    from tidemq.testing.processes import free_broker_port

    port = free_broker_port()
    data = root / f"{name}-{port}"
    data.mkdir(parents=True)
    store = store if store is not None else data / "store"
    argv = _tidemq_argv("broker", "--namesrv-addr", namesrv, "--port", str(port))
    argv += ["--data-dir", str(store)]
    argv += [word for key, value in settings.items() for word in ("--set", f"{key}={value}")]
    with _running(name, argv, port, data) as process:
        yield Broker(name, f"{HOST}:{port}", process.pid, store, data / f"{name}.log")


def group_settings(flush: str, role: str, secret: str, **extra: str) -> dict[str, str]:
    """broker.conf keys of a bench group's master (`role`); a slave adds its role and id."""
    settings = {"brokerName": "bench-a", "brokerIP1": HOST, "flushDiskType": flush}
    settings |= {"brokerRole": role, "vipChannelEnabled": "false"}
    if secret:
        settings["haSecret"] = secret
    return settings | extra


def slave_settings(master: dict[str, str], broker_id: int = 1) -> dict[str, str]:
    return master | {"brokerRole": "SLAVE", "brokerId": str(broker_id)}


def group_durability(flush: str, role: str, slaves: int) -> str:
    if not slaves:
        return f"one broker, {flush}" + (" (group commit)" if flush == "SYNC_FLUSH" else "")
    acked = "ack after the slave has it" if role == "SYNC_MASTER" else "ack before replication"
    return f"{role} + {slaves} slave, {flush} on both, {acked}"


@contextlib.contextmanager
def tidemq_group(
    root: Path, flush: str, role: str = "ASYNC_MASTER", slaves: int = 0, **extra: str
) -> Iterator[Group]:
    """A name server, a master with `role` and `slaves` slaves, every one its own process.

    The slaves are started after the master; whether they have connected is the caller's to
    wait for (sidebyside.replication.wait_in_sync)."""
    import secrets

    secret = secrets.token_hex(16) if slaves or role != "ASYNC_MASTER" else ""
    settings = group_settings(flush, role, secret, **extra)
    with contextlib.ExitStack() as stack:
        namesrv = stack.enter_context(tidemq_namesrv(root))
        master = stack.enter_context(tidemq_broker(root, namesrv, "master", settings))
        followers = tuple(
            stack.enter_context(
                tidemq_broker(root, namesrv, f"slave{i}", slave_settings(settings, i))
            )
            for i in range(1, slaves + 1)
        )
        from tidemq import __version__

        server = Server(
            "tidemq",
            namesrv,
            master.pid,
            f"tidemq {__version__}",
            group_durability(flush, role, slaves),
            master.address,
        )
        yield Group(server, master, followers, namesrv, secret, root)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of a process, in bytes (RssFile counts mapped segments)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found
