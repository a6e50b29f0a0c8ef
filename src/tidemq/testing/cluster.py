"""`local_cluster()`: a name server and N brokers in this process, on ports the OS picks.

Each test gets its own cluster and its own directory, so tests never share a path or a port
(nats `RANDOM_PORT`). The same composition roots as `tidemq dev` are used, not fakes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import Clock, SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig

# Segment sizes for test brokers. Segments are preallocated (fallocate), so RocketMQ's 1 GiB
# commit-log default would reserve a real GiB per test broker and fill a CI disk; tests that
# exercise rollovers pass smaller values still.
TEST_BROKER_SETTINGS: Final[Mapping[str, str]] = {
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(20_000 * 20),
}


@dataclass
class LocalCluster:
    namesrv: NamesrvApp
    brokers: list[BrokerApp] = field(default_factory=list)
    root: Path = Path()
    # broker.conf keys given to local_cluster(); reapplied when a broker restarts.
    broker_settings: dict[str, str] = field(default_factory=dict)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"

    @property
    def broker_addr(self) -> str:
        return self.brokers[0].address

    def broker_config_overrides(self, index: int) -> dict[str, str]:
        return {
            "namesrvAddr": self.namesrv_addr,
            "listenPort": "0",
            "storePathRootDir": str(self.root / f"broker-{index}"),
            "brokerName": f"broker-{chr(ord('a') + index)}",
            "brokerIP1": "127.0.0.1",
            **TEST_BROKER_SETTINGS,
            **self.broker_settings,
        }

    async def restart_broker(self, index: int = 0, **overrides: str) -> BrokerApp:
        """Stop broker `index` cleanly and start a new one on the same directory."""
        old = self.brokers[index]
        await old.stop()
        settings = self.broker_config_overrides(index)
        settings["listenPort"] = str(old.port)
        settings.update(overrides)
        app = BrokerApp(load_broker_config(None, {}, settings), old.clock)
        await app.start()
        self.brokers[index] = app
        return app


@contextlib.asynccontextmanager
async def local_cluster(
    root: Path,
    *,
    brokers: int = 1,
    broker_settings: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[LocalCluster]:
    """Start a name server and `brokers` brokers under `root`; stop them all on exit.

    `broker_settings` are broker.conf keys applied to every broker (e.g. a tiny
    mappedFileSizeCommitLog so tests cross segment rollovers).
    """
    clock = clock or SystemClock()
    namesrv = NamesrvApp(NamesrvConfig(listen_port=0), clock)
    await namesrv.start()
    cluster = LocalCluster(namesrv=namesrv, root=root, broker_settings=dict(broker_settings or {}))
    try:
        for index in range(brokers):
            settings = cluster.broker_config_overrides(index)
            app = BrokerApp(load_broker_config(None, {}, settings), clock)
            await app.start()
            cluster.brokers.append(app)
        yield cluster
    finally:
        for app in reversed(cluster.brokers):
            await app.stop()
        await namesrv.stop()
