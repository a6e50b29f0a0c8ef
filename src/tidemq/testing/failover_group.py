"""`controlled_group()`: a controller-mode broker group as real processes, with a real etcd.

    etcd (EtcdProcess, testing/etcd.py) ◀── leases, state CAS ──┐
    namesrv-0 ◀── registration (master as brokerId 0) ──────────┤
                                            broker-a-r1, broker-a-r2, broker-a-r3
                                            (enableControllerMode, brokerId = replica id 1..n,
                                             one haSecret, each its own ports and store)

The replicas are started together (their order decides nothing: the first to create the
group's state in etcd is master of epoch 1). `master()` asks the name servers which replica
they publish as brokerId 0, as a client would find it; tests kill, pause and restart the
replicas with the ServerProcess methods (testing/processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.client.admin import Admin
from tidemq.errors import QueueError
from tidemq.testing.cluster import TEST_BROKER_SETTINGS
from tidemq.testing.etcd import EtcdProcess
from tidemq.testing.processes import ServerProcess, broker_process, namesrv_process
from tidemq.testing.wait import eventually_async

GROUP: Final = "broker-a"
# Lease and catch-up settings that keep a test's failover within seconds.
FAST_FAILOVER_SETTINGS: Final[Mapping[str, str]] = {
    "controllerLeaseTtlSeconds": "2",
    "haMaxTimeSlaveNotCatchup": "2000",
    "haSendHeartbeatInterval": "500",
    "haHousekeepingInterval": "3000",
    "slaveSyncIntervalMs": "300",
}


@dataclass
class ControlledGroup:
    root: Path
    etcd: EtcdProcess
    namesrvs: list[ServerProcess] = field(default_factory=list)
    # replicas[i] has replica id (brokerId) i + 1
    replicas: list[ServerProcess] = field(default_factory=list)
    ha_secret: str = ""

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.address for n in self.namesrvs)

    def replica(self, replica_id: int) -> ServerProcess:
        return self.replicas[replica_id - 1]

    def by_address(self, addr: str) -> ServerProcess | None:
        return next((r for r in self.replicas if r.address == addr), None)

    async def published_master(self) -> ServerProcess | None:
        """The replica the name servers publish as the group's master (None: none yet)."""
        try:
            async with Admin(self.namesrv_addr) as admin:
                info = await admin.cluster_info()
        except (QueueError, OSError):
            return None
        data = info.broker_addr_table.get(GROUP)
        addr = data.master_addr if data is not None else None
        return self.by_address(addr) if addr else None

    async def master(
        self, timeout_s: float = 30.0, *, not_: ServerProcess | None = None
    ) -> ServerProcess:
        """Wait until the name servers publish a running master (other than `not_`)."""
        found: list[ServerProcess] = []

        async def published() -> bool:
            master = await self.published_master()
            if master is None or master is not_ or not master.running:
                return False
            found[:] = [master]
            return True

        await eventually_async(published, timeout_s, what="a published master")
        return found[0]


@contextlib.asynccontextmanager
async def controlled_group(
    root: Path,
    *,
    replicas: int = 3,
    settings: Mapping[str, str] | None = None,
    log_level: str = "INFO",
) -> AsyncIterator[ControlledGroup]:
    """etcd, one name server and `replicas` controller-mode brokers of group broker-a.
    `settings` are broker.conf keys for every replica (after the defaults: they win)."""
    etcd = EtcdProcess(root / "etcd")
    group = ControlledGroup(root=root, etcd=etcd, ha_secret=secrets.token_hex(16))
    group.namesrvs.append(namesrv_process(root, 0, log_level))
    await etcd.start()
    try:
        for namesrv in group.namesrvs:
            await namesrv.start()
        for replica_id in range(1, replicas + 1):
            config = {
                "brokerIP1": "127.0.0.1",
                **TEST_BROKER_SETTINGS,
                **FAST_FAILOVER_SETTINGS,
                "enableControllerMode": "true",
                "controllerEtcdEndpoints": etcd.endpoint,
                "brokerId": str(replica_id),
                "haSecret": group.ha_secret,
                **(settings or {}),
            }
            group.replicas.append(
                broker_process(
                    root, f"{GROUP}-r{replica_id}", GROUP, group.namesrv_addr, config, log_level
                )
            )
        await asyncio.gather(*(replica.start() for replica in group.replicas))
        yield group
    finally:
        for server in [*reversed(group.replicas), *group.namesrvs]:
            with contextlib.suppress(TimeoutError):
                await server.stop()
        await etcd.stop()
