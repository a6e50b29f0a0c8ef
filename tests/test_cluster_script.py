"""`scripts/cluster-2x2.sh start` returns once the name server lists every broker.

A broker registers with the name server just after it starts listening, so a start that only
waited for the ports could return before the last broker was registered, and `tidemq topic
create` run next (the README's cluster snippet) created the topic on one master of two.

To hold the registrations back deterministically, the test starts the name server itself,
pauses it (SIGSTOP: its port still accepts, it answers nothing) and hands it to the script
through the script's pid file, so the script takes it as already running. The brokers then
listen but cannot register: the script must still be waiting. Once the name server resumes the
script returns, and at that moment every broker is listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tidemq import Admin
from tidemq.testing import eventually_async
from tidemq.testing.processes import free_port, namesrv_process

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

ROOT: Final = Path(__file__).resolve().parent.parent
SCRIPT: Final = ROOT / "scripts" / "cluster-2x2.sh"
# broker-a's master and slave, broker-b's master and slave: BROKER_PORT_BASE + these.
BROKER_OFFSETS: Final = (0, 10, 20, 30)
# Each broker also binds port - 2 (VIP) and port + 1 (HA): the span from base - 2 must be free.
PORT_SPAN: Final = 34
# Four brokers' Python start-up one after another, on a loaded 2-core machine.
LISTEN_TIMEOUT_S: Final = 60.0
# With the brokers listening and the name server paused, how long the script is given to return
# (wrongly): it polled the last port every 0.1 s, so it would have returned well within this.
HELD_S: Final = 3.0
# From the name server's resumption to the script's return: one registration retry (<= 1 s)
# plus a `tidemq cluster list` per 0.2 s.
RETURN_TIMEOUT_S: Final = 60.0


def _span_is_free(first: int, count: int) -> bool:
    for port in range(first, first + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _broker_port_base(namesrv_port: int) -> int:
    for _ in range(100):
        base = free_port()
        span = range(base - 2, base - 2 + PORT_SPAN)
        in_range = base - 2 > 1024 and span.stop < 65536 and namesrv_port not in span
        if in_range and _span_is_free(span.start, PORT_SPAN):
            return base
    raise RuntimeError("no free span of ports for scripts/cluster-2x2.sh")


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def test_start_returns_once_the_name_server_lists_every_broker(tmp_path: Path) -> None:
    namesrv = namesrv_process(tmp_path, 0, "INFO")
    await namesrv.start()
    base = _broker_port_base(namesrv.port)
    broker_ports = [base + offset for offset in BROKER_OFFSETS]
    cluster_dir = tmp_path / "cluster"
    (cluster_dir / "pids").mkdir(parents=True)
    (cluster_dir / "pids" / "namesrv.pid").write_text(f"{namesrv.pid}\n")
    env = {
        **os.environ,
        "TIDEMQ": str(Path(sys.executable).parent / "tidemq"),
        "NAMESRV_PORT": str(namesrv.port),
        "BROKER_PORT_BASE": str(base),
    }
    output = tmp_path / "script.out"
    namesrv.pause()
    with output.open("w") as sink:
        script = await asyncio.create_subprocess_exec(
            "bash",
            str(SCRIPT),
            "start",
            str(cluster_dir),
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the brokers it starts are in its process group
        )
    try:
        for port in broker_ports:
            await eventually_async(
                functools.partial(_accepts, port), LISTEN_TIMEOUT_S, what=f"port {port} accepts"
            )
        with pytest.raises(TimeoutError):  # listening is not being listed
            await asyncio.wait_for(script.wait(), HELD_S)
        namesrv.resume()
        code = await asyncio.wait_for(script.wait(), RETURN_TIMEOUT_S)
        assert code == 0, output.read_text()
        async with Admin(namesrv.address) as admin:
            info = await admin.cluster_info()
        listed = {
            addr
            for broker in info.broker_addr_table.values()
            for addr in broker.broker_addrs.values()
        }
        assert listed == {f"127.0.0.1:{port}" for port in broker_ports}
    finally:
        if script.returncode is None:
            script.kill()
            await script.wait()
        if namesrv.running:
            namesrv.resume()
        stop = await asyncio.create_subprocess_exec(
            "bash", str(SCRIPT), "stop", str(cluster_dir), env=env, stderr=subprocess.PIPE
        )
        _, stop_errors = await stop.communicate()
        with contextlib.suppress(ProcessLookupError):  # whatever the stop left behind
            os.killpg(script.pid, signal.SIGKILL)
        await namesrv.stop()  # the script's stop has sent it SIGTERM already
    assert stop.returncode == 0, stop_errors.decode()
