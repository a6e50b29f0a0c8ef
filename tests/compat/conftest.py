"""Fixtures for the compat suite: a real TideMQ in subprocesses, and official clients beside it.

The server is either `tidemq dev` (name server and broker in one process) or a separate
`tidemq namesrv` and `tidemq broker`, started by compat_servers.py as an operator starts them.

Every client role of the C++ library runs in its own process (tests/compat/cpp_driver.py); see
that module for why. `CppClient` is the test-side handle: it collects the driver's JSON events on
a reader thread and lets a test wait for a condition over them with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from compat_servers import (
    SMALL_SEGMENTS,
    TideMQServer,
    dev_server,
    set_flags,
    spawn,
    stop_server,
    tail,
    unique,
    wait_for_port,
    wait_for_route,
)

from tidemq.testing.processes import free_port

COMPAT_DIR = Path(__file__).resolve().parent
CPP_DRIVER = COMPAT_DIR / "cpp_driver.py"
JS_DIR = COMPAT_DIR / "js"

DRIVER_START_TIMEOUT_S = 20.0  # A driver process importing the binding and starting a client.
DRIVER_STOP_TIMEOUT_S = 30.0  # C++ consumer shutdown: final offset commit, unregister, threads.


@pytest.fixture
def dev_settings() -> dict[str, str]:
    """broker.conf keys for `tidemq dev` (`--set KEY=VALUE`); a test module overrides this
    fixture to change them, e.g. a short messageDelayLevel so retries come fast."""
    return {}


@pytest.fixture
def tidemq_dev(tmp_path: Path, dev_settings: dict[str, str]) -> Iterator[TideMQServer]:
    """`tidemq dev`: one name server and one broker in one process."""
    work_dir = tmp_path / "server"
    work_dir.mkdir()
    with dev_server(work_dir, dev_settings) as server:
        yield server


@pytest.fixture
def tidemq_split(tmp_path: Path) -> Iterator[TideMQServer]:
    """`tidemq namesrv` and `tidemq broker` as two processes."""
    namesrv_port, broker_port = free_port(), free_port()
    work_dir = tmp_path / "server"
    work_dir.mkdir()
    namesrv = spawn(
        "namesrv",
        ["namesrv", "--port", str(namesrv_port), "--data-dir", str(work_dir / "namesrv")],
        work_dir,
    )
    server = TideMQServer(
        f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{broker_port}", [namesrv], work_dir
    )
    try:
        wait_for_port(namesrv_port, server)
        broker = spawn(
            "broker",
            ["broker", "--namesrv-addr", server.namesrv_addr, "--port", str(broker_port),
             "--data-dir", str(work_dir / "broker"), *set_flags(SMALL_SEGMENTS)],
            work_dir,
        )  # fmt: skip
        server.processes.append(broker)
        wait_for_port(broker_port, server)
        wait_for_route(server, "TBW102")
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def tidemq(request: pytest.FixtureRequest) -> TideMQServer:
    """The server for a test: `dev` unless parametrized indirectly with "split"."""
    kind = getattr(request, "param", "dev")
    server: TideMQServer = request.getfixturevalue(f"tidemq_{kind}")
    return server


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    return unique


# --- C++ client processes --------------------------------------------------------------------

Event = dict[str, Any]


@dataclass
class CppClient:
    """One cpp_driver.py process and the events it has reported so far."""

    name: str
    role: str
    process: subprocess.Popen[str]
    home: Path
    stderr_path: Path
    server: TideMQServer
    events: list[Event] = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)
    next_id: int = 0

    reader: threading.Thread | None = None

    def start_reader(self) -> None:
        self.reader = threading.Thread(target=self._read, name=f"reader-{self.name}", daemon=True)
        self.reader.start()

    def close_pipes(self) -> None:
        """After the process has exited: let the reader drain, then close both pipes."""
        if self.reader is not None:
            self.reader.join(DRIVER_STOP_TIMEOUT_S)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "garbage", "line": line}
            with self.condition:
                self.events.append(event)
                self.condition.notify_all()
        with self.condition:
            self.events.append({"event": "eof"})
            self.condition.notify_all()

    def diagnostics(self) -> str:
        cpp_logs = sorted((self.home / "logs" / "rocketmq-cpp").glob("*"))
        parts = [
            f"--- driver {self.name} (exit {self.process.poll()}) stderr ---",
            tail(self.stderr_path),
            f"--- last events of {self.name} ---",
            "\n".join(json.dumps(event) for event in self.events[-15:]),
        ]
        for log in cpp_logs:
            parts += [f"--- {log} ---", tail(log)]
        parts.append(self.server.logs())
        return "\n".join(parts)

    def wait_for(
        self, predicate: Callable[[list[Event]], bool], timeout_s: float, what: str
    ) -> list[Event]:
        """Waits until predicate(events) holds; fails with diagnostics at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self.condition:
            while not predicate(self.events):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._ended():
                    if predicate(self.events):
                        break
                    pytest.fail(
                        f"{self.name}: {what} not seen in {timeout_s}s\n{self.diagnostics()}"
                    )
                self.condition.wait(remaining)
            return list(self.events)

    def _ended(self) -> bool:
        return any(event["event"] in ("eof", "fatal") for event in self.events)

    def received(self) -> list[Event]:
        with self.condition:
            return [event for event in self.events if event["event"] == "received"]

    def write(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def request(self, command: dict[str, Any]) -> int:
        """Sends one producer command; returns its id (see `result`)."""
        self.next_id += 1
        self.write(json.dumps({**command, "id": self.next_id}))
        return self.next_id

    def result(self, command_id: int, timeout_s: float = 20.0) -> Event:
        def done(events: list[Event]) -> bool:
            return any(event.get("id") == command_id for event in events)

        events = self.wait_for(done, timeout_s, f"result of command {command_id}")
        return next(event for event in events if event.get("id") == command_id)

    def send(self, topic: str, body: str, mode: str = "sync", **extra: Any) -> Event:
        """One send that must succeed; returns the driver's "sent" event."""
        event = self.result(self.request({"op": "send", "mode": mode, "topic": topic,
                                          "body": body, **extra}))  # fmt: skip
        if event["event"] != "sent":
            pytest.fail(f"{mode} send of {body!r} failed: {event}\n{self.diagnostics()}")
        return event

    def stop(self) -> None:
        """Clean shutdown through the client's own shutdown(); fails if it does not finish."""
        if self.process.poll() is None:
            try:
                self.write('{"op": "stop"}' if self.role == "producer" else "stop")
            except BrokenPipeError:
                pass
        self.wait_for(
            lambda events: any(event["event"] in ("stopped", "done") for event in events),
            DRIVER_STOP_TIMEOUT_S,
            "clean shutdown",
        )
        try:
            self.process.wait(DRIVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit after shutdown\n{self.diagnostics()}")
        self.close_pipes()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.close_pipes()


@dataclass
class CppClients:
    """Factory for driver processes bound to one server; everything is reaped at teardown."""

    server: TideMQServer
    work_dir: Path
    clients: list[CppClient] = field(default_factory=list)
    # (access key, secret key) every driver signs with (set_session_credentials), or None.
    credentials: tuple[str, str] | None = None

    def _spawn(self, name: str, args: list[str]) -> CppClient:
        home = self.work_dir / f"home-{name}"
        home.mkdir(parents=True)
        stderr_path = self.work_dir / f"{name}.stderr"
        if self.credentials is not None:
            args = [*args, "--access-key", self.credentials[0], "--secret-key", self.credentials[1]]
        with stderr_path.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(CPP_DRIVER), *args, "--namesrv", self.server.namesrv_addr],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"},
                cwd=home,
            )
        client = CppClient(name, args[0], process, home, stderr_path, self.server)
        self.clients.append(client)
        client.start_reader()
        client.wait_for(
            lambda events: any(event["event"] == "ready" for event in events),
            DRIVER_START_TIMEOUT_S,
            "start",
        )
        return client

    def producer(self, group: str | None = None) -> CppClient:
        group = group or unique("PG")
        return self._spawn(f"producer-{len(self.clients)}", ["producer", "--group", group])

    def push(
        self,
        group: str,
        topic: str,
        expr: str = "*",
        *,
        model: str = "clustering",
        orderly: bool = False,
        fail_once: bool = False,
    ) -> CppClient:
        # A consumer that starts before its topic has a route retries only every 30 s.
        wait_for_route(self.server, topic)
        args = ["push", "--group", group, "--topic", topic, "--expr", expr, "--model", model]
        if orderly:
            args.append("--orderly")
        if fail_once:
            args.append("--fail-once")
        return self._spawn(f"push-{len(self.clients)}", args)

    def pull(
        self, topic: str, expect: int, expr: str = "*", timeout_s: float = 20.0
    ) -> list[Event]:
        """Runs a pull consumer to completion; returns the messages it reported."""
        wait_for_route(self.server, topic)
        client = self._spawn(
            f"pull-{len(self.clients)}",
            ["pull", "--group", unique("PULL"), "--topic", topic, "--expr", expr,
             "--expect", str(expect), "--timeout-s", str(timeout_s)],
        )  # fmt: skip
        client.wait_for(
            lambda events: any(event["event"] == "done" for event in events),
            timeout_s + DRIVER_STOP_TIMEOUT_S,
            "pull to finish",
        )
        client.stop()
        return client.received()


@pytest.fixture
def cpp(tidemq: TideMQServer, tmp_path: Path) -> Iterator[CppClients]:
    clients = CppClients(tidemq, tmp_path / "cpp")
    yield clients
    for client in clients.clients:
        client.kill()


@pytest.fixture
def node_ons() -> Path:
    """The ali-ons driver directory, with its node_modules installed."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not (JS_DIR / "node_modules" / "ali-ons").is_dir():
        pytest.skip("run `npm ci` in tests/compat/js first")
    return JS_DIR
