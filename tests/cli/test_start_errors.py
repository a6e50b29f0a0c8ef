"""What stops a server from starting is one line naming the port or path and the setting to
change, exit status 1, no traceback (issue 16 item 1): the real `tidemq` entry point, in a
process of its own, against ports this test holds."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tidemq.testing.processes import free_broker_port, free_port

# A start that fails exits at once; a start that (wrongly) succeeds is cut off after this.
RUN_TIMEOUT_S = 60.0


@contextmanager
def _held(port: int) -> Iterator[None]:
    """Another program listening on `port` (on every address, as the servers bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen()
        yield


def _tidemq(cwd: Path, *argv: str) -> tuple[int, str]:
    """Exit status and stderr of `tidemq <argv>`."""
    done = subprocess.run(
        [sys.executable, "-m", "tidemq.cli.main", "--log-level", "WARNING", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return done.returncode, done.stderr


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_broker_port_in_use_names_listen_port(tmp_path: Path) -> None:
    port = free_broker_port()
    with _held(port):
        code, stderr = _tidemq(tmp_path, "broker", "--port", str(port), "--data-dir", "store")
    assert code == 1
    assert _one_line(stderr) == (
        f"tidemq broker: port {port} on 0.0.0.0 is in use: choose another listenPort (--port)"
    )


def test_broker_vip_port_in_use_says_it_is_the_vip_port(tmp_path: Path) -> None:
    port = free_broker_port()
    with _held(port - 2):
        code, stderr = _tidemq(tmp_path, "broker", "--port", str(port), "--data-dir", "store")
    assert code == 1
    assert _one_line(stderr) == (
        f"tidemq broker: port {port - 2} on 0.0.0.0 is in use (the VIP channel port,"
        " listenPort-2): choose another listenPort (--port), or --set vipChannelEnabled=false"
    )


def test_broker_ha_port_in_use_says_it_is_the_ha_port(tmp_path: Path) -> None:
    port = free_broker_port()
    with _held(port + 1):
        code, stderr = _tidemq(
            tmp_path, "broker", "--port", str(port), "--data-dir", "store",
            "--set", "brokerRole=SYNC_MASTER", "--set", "haSecret=0123456789abcdef-test",
        )  # fmt: skip
    assert code == 1
    line = _one_line(stderr)
    assert line.startswith(f"tidemq broker: port {port + 1} on 0.0.0.0 is in use (the HA port")
    assert "haListenPort" in line


def test_namesrv_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with _held(port):
        code, stderr = _tidemq(tmp_path, "namesrv", "--port", str(port))
    assert code == 1
    assert _one_line(stderr) == (
        f"tidemq namesrv: port {port} on 0.0.0.0 is in use: choose another --port"
    )


def test_dev_names_its_own_flags(tmp_path: Path) -> None:
    namesrv_port, broker_port = free_port(), free_broker_port()
    argv = ("dev", "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port))
    with _held(namesrv_port):
        code, stderr = _tidemq(tmp_path, *argv)
    assert code == 1
    assert _one_line(stderr) == (
        f"tidemq dev: port {namesrv_port} on 0.0.0.0 is in use: choose another --namesrv-port"
    )
    with _held(broker_port - 2):
        code, stderr = _tidemq(tmp_path, *argv)
    assert code == 1
    assert "choose another listenPort (--broker-port)" in _one_line(stderr)


def test_unusable_store_path_names_store_path_root_dir(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    store = tmp_path / "a-file" / "store"
    port = free_broker_port()
    code, stderr = _tidemq(tmp_path, "broker", "--port", str(port), "--data-dir", str(store))
    assert code == 1
    assert _one_line(stderr) == (
        f"tidemq broker: storePathRootDir={str(store)!r}: Not a directory: set"
        " storePathRootDir (--data-dir) to a directory this user can create and write"
    )
