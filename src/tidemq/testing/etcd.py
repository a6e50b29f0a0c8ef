"""`EtcdProcess`: a real single-member etcd (Debian etcd-server) for controller and chaos tests.

    EtcdProcess(root)
      start()    /usr/bin/etcd on two loopback ports chosen free (client, peer), data in root
      kill()     SIGKILL: what a crash leaves (the data dir survives)
      pause()    SIGSTOP: the sockets stay open and nothing answers; resume() is SIGCONT
      stop()     SIGTERM and wait
      restart()  start again on the same ports and data dir

Readiness is "GET /health on the client port says healthy" (etcd serves HTTP/1 there besides
gRPC), polled with a deadline: a listening port alone may come before the member has elected
itself leader, and a CAS sent then would fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.testing.processes import free_port

ETCD_BINARY: Final = "/usr/bin/etcd"
START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
KILL_TIMEOUT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.05
HEALTH_TIMEOUT_S: Final = 1.0
LOG_TAIL_CHARS: Final = 4000


@dataclass
class EtcdProcess:
    """One etcd member; `endpoint` is what EtcdSession takes."""

    root: Path
    name: str = "etcd0"
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def data_dir(self) -> Path:
        return self.root / f"{self.name}.data"

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except FileNotFoundError:
            return f"<{self.log_path} missing>"

    def _args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD_BINARY,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            "--log-outputs=stderr",
        ]

    async def start(self) -> None:
        """Start etcd (same ports, same data dir on a restart) and wait until it is healthy."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._spawn()
        try:
            await self._wait_healthy()
        except BaseException:
            self.kill()
            raise

    def _spawn(self) -> None:
        # Fork and exec only: the start-up is awaited by _wait_healthy.
        self.starts += 1
        self.root.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self._args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    async def _wait_healthy(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not await self.healthy():
            if not self.running:
                raise RuntimeError(f"{self.name} exited while starting:\n{self.log_tail()}")
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{self.name} not healthy within {START_TIMEOUT_S} s:\n{self.log_tail()}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    async def healthy(self) -> bool:
        """One GET /health, bounded; False on any failure."""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.client_port)
                try:
                    writer.write(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                    await writer.drain()
                    answer = await reader.read()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError):
            return False
        return b'"health":"true"' in answer

    def kill(self) -> None:
        """SIGKILL and reap: the ports are free when this returns; the data dir is kept."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(KILL_TIMEOUT_S)
        self.process = None

    def _signal(self, signum: int) -> None:
        if self.process is None or not self.running:
            raise RuntimeError(f"{self.name} is not running")
        self.process.send_signal(signum)

    def pause(self) -> None:
        """SIGSTOP: the sockets stay open and nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    async def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused) and wait for the exit."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                raise TimeoutError(f"{self.name} did not stop:\n{self.log_tail()}") from None
        self.process = None

    async def restart(self) -> None:
        """Kill (if running) and start again on the same ports and data dir."""
        self.kill()
        await self.start()
