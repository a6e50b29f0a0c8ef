"""`local_cluster()`: a name server and N brokers in this process, on ports the OS picks.

Each test gets its own cluster and its own directory, so tests never share a path or a port
(nats `RANDOM_PORT`). The same composition roots as `tidemq dev` are used, not fakes.

`slaves=n` gives each broker group n slaves in the same loop (`LocalCluster.slaves[index]`: same
brokerName, brokerId 1..n, brokerRole SLAVE) and every broker one haSecret. haListenPort is left
unset: with listenPort 0 the master's HA listener takes a free port too, and registration reports
it to the slaves.
"""

from __future__ import annotations

import contextlib
import secrets
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
    # The masters (brokerId 0) of broker-a, broker-b, ...
    brokers: list[BrokerApp] = field(default_factory=list)
    root: Path = Path()
    # broker.conf keys given to local_cluster(); reapplied when a broker restarts.
    broker_settings: dict[str, str] = field(default_factory=dict)
    # slaves[index]: the slaves of brokers[index]'s group, brokerId 1, 2, ...
    slaves: list[list[BrokerApp]] = field(default_factory=list)
    # The haSecret every broker was given (None: no replication configured).
    ha_secret: str | None = None

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"

    @property
    def broker_addr(self) -> str:
        return self.brokers[0].address

    def all_brokers(self) -> list[BrokerApp]:
        """Masters, then every group's slaves."""
        return [*self.brokers, *(app for group in self.slaves for app in group)]

    def broker_config_overrides(self, index: int) -> dict[str, str]:
        return {
            "namesrvAddr": self.namesrv_addr,
            "listenPort": "0",
            "storePathRootDir": str(self.root / f"broker-{index}"),
            "brokerName": f"broker-{chr(ord('a') + index)}",
            "brokerIP1": "127.0.0.1",
            **TEST_BROKER_SETTINGS,
            **self._ha_settings(),
            **self.broker_settings,
        }

    def slave_config_overrides(self, index: int, broker_id: int) -> dict[str, str]:
        """The settings of slave `broker_id` (1, 2, ...) of group `index`."""
        return {
            **self.broker_config_overrides(index),
            "storePathRootDir": str(self.root / f"broker-{index}-s{broker_id}"),
            "brokerRole": "SLAVE",
            "brokerId": str(broker_id),
        }

    def _ha_settings(self) -> dict[str, str]:
        if self.ha_secret is None:
            return {}
        return {"haSecret": self.ha_secret}

    async def restart_broker(self, index: int = 0, **overrides: str) -> BrokerApp:
        """Stop broker `index` cleanly and start a new one on the same directory."""
        self.brokers[index] = await self._restart(
            self.brokers[index], self.broker_config_overrides(index), overrides
        )
        return self.brokers[index]

    async def restart_slave(
        self, index: int = 0, broker_id: int = 1, **overrides: str
    ) -> BrokerApp:
        """Stop slave `broker_id` of group `index` cleanly and start it again on its directory."""
        group = self.slaves[index]
        group[broker_id - 1] = await self._restart(
            group[broker_id - 1], self.slave_config_overrides(index, broker_id), overrides
        )
        return group[broker_id - 1]

    async def _restart(
        self, old: BrokerApp, settings: dict[str, str], overrides: Mapping[str, str]
    ) -> BrokerApp:
        await old.stop()
        settings["listenPort"] = str(old.port)
        settings.update(overrides)
        app = BrokerApp(load_broker_config(None, {}, settings), old.clock)
        await app.start()
        return app


async def _start_group(cluster: LocalCluster, index: int, slaves: int, clock: Clock) -> None:
    """Start group `index`'s master, then its slaves; each joins the cluster once started."""
    app = BrokerApp(load_broker_config(None, {}, cluster.broker_config_overrides(index)), clock)
    await app.start()
    cluster.brokers.append(app)
    cluster.slaves.append([])
    for broker_id in range(1, slaves + 1):
        settings = cluster.slave_config_overrides(index, broker_id)
        slave = BrokerApp(load_broker_config(None, {}, settings), clock)
        await slave.start()
        cluster.slaves[index].append(slave)


@contextlib.asynccontextmanager
async def local_cluster(
    root: Path,
    *,
    brokers: int = 1,
    broker_settings: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    slaves: int = 0,
    ha_secret: str | None = None,
    namesrv_config: NamesrvConfig | None = None,
) -> AsyncIterator[LocalCluster]:
    """Start a name server and `brokers` broker groups under `root`; stop them all on exit.

    `broker_settings` are broker.conf keys applied to every broker (e.g. a tiny
    mappedFileSizeCommitLog so tests cross segment rollovers). Each group has `slaves` slaves;
    with slaves, or with `ha_secret` given, every broker gets that haSecret (default: random).
    `namesrv_config`: the name server's settings (its port 0, a free one, as by default).
    """
    clock = clock or SystemClock()
    namesrv = NamesrvApp(namesrv_config or NamesrvConfig(listen_port=0), clock)
    await namesrv.start()
    cluster = LocalCluster(namesrv=namesrv, root=root, broker_settings=dict(broker_settings or {}))
    if slaves or ha_secret is not None:
        cluster.ha_secret = ha_secret if ha_secret is not None else secrets.token_hex(16)
    try:
        for index in range(brokers):
            await _start_group(cluster, index, slaves, clock)
        yield cluster
    finally:
        for app in reversed(cluster.all_brokers()):
            await app.stop()
        await namesrv.stop()
