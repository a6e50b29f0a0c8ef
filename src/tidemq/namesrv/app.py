"""NamesrvApp: the name server's composition root.

Builds the route table, the KV store, the handlers, the remoting server and the housekeeping
service, starts them in that order and stops them in reverse. `tidemq namesrv` runs one in its own
process; `tidemq dev` runs one beside a broker on the same loop.
"""

from __future__ import annotations

import logging

from tidemq.clock import Clock
from tidemq.namesrv.access import NamesrvAcl
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.handlers import NamesrvHandlers
from tidemq.namesrv.housekeeping import BrokerHousekeeping
from tidemq.namesrv.kv import KVStore
from tidemq.namesrv.metrics import NamesrvMetrics
from tidemq.namesrv.route_table import RouteTable
from tidemq.remoting import Connection, RemotingServer

logger = logging.getLogger(__name__)


class NamesrvApp:
    def __init__(
        self,
        config: NamesrvConfig,
        clock: Clock,
        *,
        host: str = "0.0.0.0",
        metrics_port: int | None = None,
    ) -> None:
        """`metrics_port`: serve Prometheus metrics on host:port (namesrv/metrics.py; 0: a
        free port); None: no exporter, no RPC timing."""
        self.config = config
        self.clock = clock
        self.routes = RouteTable()
        self.kv = KVStore(config.kv_config_path)
        # A bad ACL file raises here (AclFileError): the name server does not start on it.
        self.acl = NamesrvAcl(config.acl_file) if config.acl_file is not None else None
        table = NamesrvHandlers(self.routes, self.kv, clock).table()
        self.metrics: NamesrvMetrics | None = None
        if metrics_port is not None:
            node = f"{host}:{config.listen_port}"
            self.metrics = NamesrvMetrics(self.routes, host, metrics_port, node)
            table.observer = self.metrics.rpc
        self.server = RemotingServer(
            table,
            host,
            config.listen_port,
            name="namesrv",
            clock=clock,
            incomplete_frame_bytes_max=config.incomplete_frame_bytes_max,
            frame_completion_timeout_ms=config.frame_completion_timeout_ms,
            limits=config.limits,
            request_hook=self.acl.hook if self.acl is not None else None,
            tls=config.tls,  # a bad certificate or key raises TlsConfigError here
        )
        self.server.add_connection_listener(on_close=self._on_connection_closed)
        self.housekeeping = BrokerHousekeeping(
            self.routes,
            clock,
            scan_interval_ms=config.scan_interval_ms,
            broker_expiry_ms=config.broker_expiry_ms,
        )
        self._started = False

    @property
    def port(self) -> int:
        """The bound port (the real one when the config asked for 0)."""
        return self.server.port

    async def start(self) -> None:
        self.kv.load()
        await self.server.start()
        await self.housekeeping.start()
        if self.acl is not None:
            await self.acl.start()
        if self.metrics is not None:
            await self.metrics.start()
        self._started = True
        logger.info("name server started on port %d", self.port)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.metrics is not None:
            await self.metrics.stop()
        if self.acl is not None:
            await self.acl.stop()
        await self.housekeeping.stop()
        await self.server.stop()
        logger.info("name server stopped")

    def _on_connection_closed(self, connection: Connection) -> None:
        for broker in self.routes.on_connection_closed(connection):
            logger.info(
                "broker %s (%s) dropped: its connection closed",
                broker.broker_addr,
                broker.broker_name,
            )
