"""The TideMQ server processes of the compat suite, started as an operator starts them.

The server is started exactly as an operator would, through the `tidemq` command (the flag names
are the contract with the CLI). Data lives in the test's tmp_path, ports are picked free, and the
server's output goes to a log file that is quoted when anything fails. conftest.py builds its
fixtures from these; a test module that needs another layout (tests/compat/test_cpp_replication.py:
a replicated group) imports them directly.

"Ready" means more than open ports: the name server must answer a route for TBW102, i.e. the
broker has registered. Both official clients ask the name server first, and a C++ producer whose
first route lookup fails reports the send as failed rather than retrying later.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.security.signing import Credentials, sign
from tidemq.testing.processes import free_port

SERVER_START_TIMEOUT_S = 30.0  # Python start-up, store recovery on an empty dir, registration.
SERVER_STOP_TIMEOUT_S = 15.0  # SIGTERM to exit: persist offsets, unregister, close the store.
PORT_POLL_INTERVAL_S = 0.1  # Between connection attempts while a server starts.
ROUTE_PROBE_TIMEOUT_S = 2.0  # One GET_ROUTEINFO_BY_TOPIC round trip on loopback.
LOG_TAIL_CHARS = 6000  # How much of a server or driver log a failure message quotes.


def unique(prefix: str) -> str:
    """A topic or group name no other test (or earlier run on the same server) uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def tail(path: Path) -> str:
    try:
        data = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"<{path} missing>"
    return data[-LOG_TAIL_CHARS:]


# --- the server under test -------------------------------------------------------------------


@dataclass
class ServerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def describe(self) -> str:
        return f"--- {self.name} (exit {self.process.poll()}) log {self.log_path} ---\n" + tail(
            self.log_path
        )


@dataclass
class TideMQServer:
    namesrv_addr: str
    broker_addr: str
    processes: list[ServerProcess]
    work_dir: Path
    # (accessKey, secretKey) the tests' own name-server queries sign with: an ACL name server
    # answers reads to a valid signature only.
    credentials: tuple[str, str] | None = None

    def logs(self) -> str:
        return "\n".join(proc.describe() for proc in self.processes)

    def admin(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Runs `tidemq <args>` and fails the test, quoting its output, if it does not succeed."""
        argv = [sys.executable, "-m", "tidemq.cli.main", *args]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, cwd=self.work_dir, check=False
        )
        if result.returncode != 0:
            pytest.fail(
                f"{' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                f"stderr:\n{result.stderr}\n{self.logs()}"
            )
        return result

    def queue_count(self, topic: str) -> int:
        """Read queues of the topic summed over its brokers, as the name server reports them.

        Waits for the route first: a broker registers an auto-created topic asynchronously.
        """
        wait_for_route(self, topic)
        response = query_route(self.namesrv_addr, topic, self.credentials)
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        route = json.loads(response.body)
        return sum(int(queue["readQueueNums"]) for queue in route["queueDatas"])

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.admin(
            "topic", "create", "--namesrv-addr", self.namesrv_addr, "--topic", topic,
            "--queues", str(queues),
        )  # fmt: skip
        wait_for_route(self, topic)


def spawn(name: str, args: list[str], work_dir: Path) -> ServerProcess:
    log_path = work_dir / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli.main", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work_dir,
            env=env,
            start_new_session=True,
        )
    return ServerProcess(name, process, log_path)


def wait_for_port(port: int, server: TideMQServer) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in server.processes:
            if proc.process.poll() is not None:
                pytest.fail(f"{proc.name} exited before port {port} opened\n{server.logs()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(PORT_POLL_INTERVAL_S)
    pytest.fail(f"port {port} not accepting after {SERVER_START_TIMEOUT_S}s\n{server.logs()}")


def query_route(
    namesrv_addr: str, topic: str, credentials: tuple[str, str] | None = None
) -> RemotingCommand:
    """One raw GET_ROUTEINFO_BY_TOPIC, spelled as the C++ client spells it (signed with
    `credentials` when given)."""
    host, port = namesrv_addr.rsplit(":", 1)
    request = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext_fields={"topic": topic},
        language="CPP",
    )  # fmt: skip
    if credentials is not None:
        sign(request, Credentials(*credentials))
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=ROUTE_PROBE_TIMEOUT_S) as sock:
        sock.sendall(encode(request))
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("name server closed the connection")
            for frame in decoder.feed(chunk):
                if frame.is_response and frame.opaque == 1:
                    return frame


def wait_for_route(server: TideMQServer, topic: str) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    last: str = "no answer"
    while time.monotonic() < deadline:
        try:
            response = query_route(server.namesrv_addr, topic, server.credentials)
        except OSError as exc:
            last = repr(exc)
        else:
            if response.code == ResponseCode.SUCCESS:
                return
            last = f"code {response.code} remark {response.remark!r}"
        time.sleep(PORT_POLL_INTERVAL_S)
    pytest.fail(f"no route for {topic} after {SERVER_START_TIMEOUT_S}s ({last})\n{server.logs()}")


def stop_server(server: TideMQServer) -> None:
    # Broker first, so it can unregister from a name server that is still there.
    for proc in reversed(server.processes):
        if proc.process.poll() is None:
            proc.process.send_signal(signal.SIGTERM)
            try:
                proc.process.wait(SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.process.pid, signal.SIGKILL)
                proc.process.wait()


# Segments are preallocated: RocketMQ's 1 GiB commit-log default would reserve a real GiB of
# disk per test server. The clients cannot tell the difference.
SMALL_SEGMENTS = {"mappedFileSizeCommitLog": str(64 * 1024 * 1024)}


def set_flags(settings: dict[str, str]) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@contextlib.contextmanager
def dev_server(
    work_dir: Path,
    settings: dict[str, str],
    extra_args: list[str] | None = None,
    credentials: tuple[str, str] | None = None,
) -> Iterator[TideMQServer]:
    """`tidemq dev` in `work_dir` (small segments, `settings` as --set), served once its ports
    accept and its broker has registered (a route is served); stopped on exit."""
    namesrv_port, broker_port = free_port(), free_port()
    proc = spawn(
        "dev",
        ["dev", "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port),
         "--data-dir", str(work_dir / "data"), *(extra_args or []),
         *set_flags({**SMALL_SEGMENTS, **settings})],
        work_dir,
    )  # fmt: skip
    server = TideMQServer(
        f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{broker_port}", [proc], work_dir, credentials
    )
    try:
        wait_for_port(namesrv_port, server)
        wait_for_port(broker_port, server)
        wait_for_route(server, "TBW102")
        yield server
    finally:
        stop_server(server)
