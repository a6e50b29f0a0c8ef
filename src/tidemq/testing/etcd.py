"""`EtcdProcess`: a real single-member etcd (Debian etcd-server) for controller and chaos tests.

    EtcdProcess(root)
      start()    /usr/bin/etcd on two loopback ports chosen free (client, peer), data in root
      kill()     SIGKILL: what a crash leaves (the data dir survives)
      pause()    SIGSTOP: the sockets stay open and nothing answers; resume() is SIGCONT
      stop()     SIGTERM and wait
      restart()  start again on the same ports and data dir

Readiness is "GET /health on the client port says healthy" (etcd serves HTTP/1 there besides
gRPC), polled with a deadline: a listening port alone may come before the member has elected
itself leader, and a CAS sent then would fail. Spawning, signals, stop and the log are
ServerProcess's (processes.py): only the command and readiness differ.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Final

from tidemq.testing.processes import START_TIMEOUT_S, ServerProcess, free_port

ETCD_BINARY: Final = "/usr/bin/etcd"
POLL_INTERVAL_S: Final = 0.05
HEALTH_TIMEOUT_S: Final = 1.0


class EtcdProcess(ServerProcess):
    """One etcd member; `endpoint` is what EtcdSession takes. Its data and log are in `root`."""

    def __init__(self, root: Path, name: str = "etcd0") -> None:
        self.root = root
        self.peer_port = free_port()
        super().__init__(name=name, args=[], port=free_port(), log_path=root / f"{name}.log")

    @property
    def client_port(self) -> int:
        return self.port

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def data_dir(self) -> Path:
        return self.root / f"{self.name}.data"

    def command(self) -> list[str]:
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

    async def wait_ready(self) -> None:
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

    async def restart(self) -> None:
        """Kill (if running) and start again on the same ports and data dir."""
        self.kill()
        await self.start()
