"""Out of file descriptors, a server logs it and accepts again once descriptors are free
(issue 11, item 9).

Before the fix, on uvloop (the default loop) the name server and broker said nothing: libuv
accepted each waiting connection with a reserved descriptor and closed it at once. On asyncio's
loop every failed accept logged a traceback. Each server here runs in a child process with a
small RLIMIT_NOFILE (soft and hard, so nothing raises it back), leaving this process's own limit
untouched; the test fills its descriptor table with connections, then frees some.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.remoting.acceptor import Acceptor, listen
from tidemq.remoting.log_limit import LOG_LINES_PER_WINDOW_MAX, LOG_WINDOW_MS, LogLimit
from tidemq.testing import eventually

# Descriptors the child may hold: its interpreter, loop and listening socket take about 15.
CHILD_OPEN_FILES_MAX = 64
# More connections than the child can accept, so some wait in its listen backlog.
CONNECTIONS = CHILD_OPEN_FILES_MAX + 16
WAIT_S = 20.0
NOT_ACCEPTING = "cannot accept connections"

# A real name server on the loop named by argv[1]; prints its port, runs until stdin closes.
CHILD = """
import asyncio, logging, resource, sys
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")

async def main() -> None:
    app = NamesrvApp(NamesrvConfig(listen_port=0), SystemClock(), host="127.0.0.1")
    await app.start()
    sys.stdout.write(f"{app.port}\\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await app.stop()

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHILD_OPEN_FILES_MAX, CHILD_OPEN_FILES_MAX))


class Child:
    """The child process and the lines of its log, read by a thread as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        assert process.stdout is not None
        self.port = int(process.stdout.readline())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def join(self) -> None:
        self._reader.join(timeout=WAIT_S)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def logged(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


@pytest.fixture(params=["asyncio", "uvloop"])
def child(request: pytest.FixtureRequest) -> Iterator[Child]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, request.param],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_limit_open_files,  # the child's own limit, set before exec
    )
    child = None
    try:
        child = Child(process)
        yield child
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if child is not None:
            child.join()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _route_request(sock: socket.socket) -> RemotingCommand:
    """GET_ROUTEINFO_BY_TOPIC for an unknown topic over `sock`, answered TOPIC_NOT_EXIST."""
    sock.settimeout(WAIT_S)
    request = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=7, ext_fields={"topic": "absent"}
    )
    sock.sendall(encode(request))
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        assert data, "the server closed the connection instead of answering"
        frames = decoder.feed(data)
        if frames:
            return frames[0]


def test_out_of_descriptors_is_logged_and_accepting_resumes(child: Child) -> None:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.create_connection(("127.0.0.1", child.port)))
            for _ in range(CONNECTIONS)
        ]
        _wait_until(lambda: bool(child.logged(NOT_ACCEPTING)), "the accept failure logged")
        [line, *_] = child.logged(NOT_ACCEPTING)
        assert f"open files limit {CHILD_OPEN_FILES_MAX}" in line
        assert not child.logged("Traceback")
        # The newest connection waits in the backlog: it is neither answered nor reset yet.
        waiting = sockets[-1]
        waiting.settimeout(0.2)
        with pytest.raises(TimeoutError):
            waiting.recv(1)

        # Free descriptors: the waiting connection is accepted and answered.
        for sock in sockets[: CONNECTIONS // 2]:
            sock.close()
        answer = _route_request(waiting)
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    # And a new connection is served too; the failures were logged a few times, not per try.
    with socket.create_connection(("127.0.0.1", child.port)) as fresh:
        assert _route_request(fresh).code == ResponseCode.TOPIC_NOT_EXIST
    # LogLimit's windows: a slow run (a loaded machine) may span more than one.
    windows = int((time.monotonic() - started) * 1000 // LOG_WINDOW_MS) + 1
    assert len(child.logged(NOT_ACCEPTING)) <= LOG_LINES_PER_WINDOW_MAX * windows


class _FailingOnce:
    """A listening socket whose next accept() fails with `error` (a peer's network error that
    Linux reports from accept()), then accepts as usual."""

    def __init__(self, sock: socket.socket, error: OSError) -> None:
        self._sock = sock
        self._error: OSError | None = error

    def accept(self) -> tuple[socket.socket, object]:
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._sock.accept()

    def fileno(self) -> int:
        return self._sock.fileno()

    def getsockname(self) -> object:
        return self._sock.getsockname()

    def close(self) -> None:
        self._sock.close()


async def test_a_connection_error_from_accept_does_not_stop_accepting() -> None:
    """EPROTO and the like belong to one connection: the acceptor goes on at once instead of
    pausing ACCEPT_RETRY_DELAY_MS, so no peer's broken handshake stops a server accepting."""
    made: list[asyncio.BaseTransport] = []

    class Recorder(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    listener = _FailingOnce(listen("127.0.0.1", 0), OSError(errno.EPROTO, "Protocol error"))
    acceptor = Acceptor(
        listener,  # type: ignore[arg-type]
        Recorder,
        name="test",
        log=LogLimit(logging.getLogger("test"), SystemClock()),
    )
    acceptor.start()
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setblocking(False)
    try:
        await loop.sock_connect(client, ("127.0.0.1", acceptor.port))
        await eventually(lambda: bool(made), what="the connection accepted")
        assert acceptor.accept_failures == 0
    finally:
        client.close()
        for transport in made:
            transport.close()
        await acceptor.close()


def _run_with_soft_limit(soft: int, *args: str) -> str:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
        preexec_fn=lower,  # the child's own limit, set before exec
    )
    return result.stdout


def test_soft_limit_is_raised_to_the_hard_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= 256:
        pytest.skip("the hard limit leaves no room to lower the soft one")
    code = (
        "from tidemq.remoting.acceptor import raise_open_files_limit\n"
        "import sys; sys.stdout.write(repr(raise_open_files_limit()))"
    )
    assert _run_with_soft_limit(256, sys.executable, "-c", code) == repr((256, hard))


def test_print_config_shows_the_limit(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= 256:
        pytest.skip("the hard limit leaves no room to lower the soft one")
    tidemq = Path(sys.executable).parent / "tidemq"
    out = _run_with_soft_limit(
        256, str(tidemq), "broker", "--print-config", "--data-dir", str(tmp_path)
    )
    [line] = [line for line in out.splitlines() if "RLIMIT_NOFILE" in line]
    assert line.startswith("#")  # the output stays a valid broker.conf
    assert f": {hard} at start" in line
    assert "256" in line
