"""`tidemq namesrv --max-connections N --max-connections-per-address N`: the name server's
connection caps, end to end in a process of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.testing.processes import free_port

START_TIMEOUT_S = 20.0


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    log = (tmp_path / "namesrv.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli.main", "namesrv", "--port", str(port),
         "--max-connections", "5", "--max-connections-per-address", "1"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    try:
        # Its log says when it listens: a probe connection would take the one place per
        # address until the server saw it close.
        deadline = time.monotonic() + START_TIMEOUT_S
        while "listening on" not in (text := (tmp_path / "namesrv.log").read_text()):
            assert process.poll() is None, text
            assert time.monotonic() < deadline, f"name server did not start\n{text}"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _closed_at_once(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_second_connection_from_one_address_is_closed(namesrv: int) -> None:
    first = socket.create_connection(("127.0.0.1", namesrv))
    time.sleep(0.2)  # the server has taken the first (its close would race the second's)
    second = socket.create_connection(("127.0.0.1", namesrv))
    try:
        assert _closed_at_once(second)
        first.settimeout(0.5)
        with pytest.raises(TimeoutError):  # the first is still served: nothing to read, open
            first.recv(1)
    finally:
        first.close()
        second.close()


def test_a_negative_cap_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidemq.cli.main", "namesrv", "--max-connections", "-1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--max-connections" in result.stderr
