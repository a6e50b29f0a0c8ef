"""Start and stop the servers under test: every one on 127.0.0.1, free ports, data in a temp dir.

Each server is a child process of the suite and is stopped by its own pid (never by name), so a
run leaves nothing behind. Binaries come from Debian packages (`make bench-deps`); a peer whose
binary is missing is reported as absent, not as a failure.

Durability of each configuration, as the table states it:
  redis         AOF appendonly yes; appendfsync set per driver (everysec / always) by CONFIG SET
  nats          JetStream file storage, one replica (2.9: fsync every 2 min, ack before fsync)
  rabbitmq      durable classic queue, persistent messages, publisher confirms (fsync before ack)
  tidemq        `tidemq dev` (separate process), flushDiskType ASYNC_FLUSH or SYNC_FLUSH
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


def rss_bytes(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of a process, in bytes (RssFile counts mapped segments)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found
