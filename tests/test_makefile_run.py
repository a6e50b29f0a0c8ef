"""`make run` with NAMESRV_PORT, BROKER_PORT and DATA_DIR: the real target, on free ports.

The install step is not what is tested (and needs the network): `make -o <stamp>` treats the
install stamp as done, so make goes straight to `tidemq dev` from the venv running the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tidemq import Admin
from tidemq.errors import QueueError
from tidemq.testing import eventually_async
from tidemq.testing.processes import free_broker_port, free_port

pytestmark = pytest.mark.integration

ROOT: Final = Path(__file__).resolve().parent.parent
MAKEFILE: Final = ROOT / "Makefile"
VENV: Final = Path(sys.executable).parent.parent
# Start-up of `tidemq dev` on a loaded 2-core machine, and its clean stop after SIGTERM.
START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 30.0


async def _registered(namesrv_addr: str, broker_addr: str) -> bool:
    try:
        async with Admin(namesrv_addr, timeout_ms=2_000) as admin:
            info = await admin.cluster_info()
    except QueueError:
        return False
    return any(broker_addr in b.broker_addrs.values() for b in info.broker_addr_table.values())


def _make_run(tmp_path: Path, namesrv_port: int, broker_port: int) -> subprocess.Popen[bytes]:
    command = ["make", "-s", "-f", str(MAKEFILE), "-C", str(ROOT)]
    command += ["-o", f"{VENV}/.run-installed", "run", f"VENV={VENV}"]
    command += [f"NAMESRV_PORT={namesrv_port}", f"BROKER_PORT={broker_port}"]
    command += [f"DATA_DIR={tmp_path / 'tq-data'}"]
    with (tmp_path / "make-run.log").open("wb") as log:
        # A session of its own: make and the `tidemq dev` it runs are signalled together.
        return subprocess.Popen(
            command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )


async def test_make_run_takes_ports_and_data_dir(tmp_path: Path) -> None:
    namesrv_port, broker_port = free_port(), free_broker_port()
    process = _make_run(tmp_path, namesrv_port, broker_port)
    try:
        namesrv_addr, broker_addr = f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{broker_port}"

        async def serving() -> bool:
            if process.poll() is not None:
                raise AssertionError((tmp_path / "make-run.log").read_text())
            return await _registered(namesrv_addr, broker_addr)

        await eventually_async(serving, START_TIMEOUT_S, what="make run's broker registered")
        assert (
            tmp_path / "tq-data" / "broker" / "lock"
        ).is_file()  # the store is the one DATA_DIR names
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
