"""The name server's Prometheus metrics (`tidemq namesrv --metrics-port N`): RPC latency by
request and response code, the route table's size and the event-loop lag.

Upstream's name server exports rocketmq_rpc_latency with node_type=namesrv; the route-table
gauges are TideMQ's (tidemq_namesrv_*). Built at scrape time, like the broker's
(broker/metrics.py); the counting is the remoting layer's RpcLatency.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tidemq.metrics import families
from tidemq.metrics.gc_pauses import process_gc_pauses
from tidemq.metrics.http import MetricsServer
from tidemq.metrics.loop_lag import LoopLagMonitor
from tidemq.namesrv.route_table import RouteTable
from tidemq.remoting.handlers import RpcLatency


class NamesrvCollector(Collector):
    def __init__(
        self, routes: RouteTable, rpc: RpcLatency, loop_lag: LoopLagMonitor, node_id: str
    ) -> None:
        self._routes = routes
        self._rpc = rpc
        self._loop_lag = loop_lag
        self._base = (("node_type", "namesrv"), ("node_id", node_id))

    def collect(self) -> Iterator[Metric]:
        names = [name for name, _ in self._base]
        values = [value for _, value in self._base]
        info = self._routes.cluster_info()
        for name, what, value in (
            (
                "tidemq_namesrv_topics",
                "Topics with a route",
                len(self._routes.topic_list().topic_list),
            ),
            ("tidemq_namesrv_brokers", "Broker names registered", len(info.broker_addr_table)),
            ("tidemq_namesrv_clusters", "Clusters registered", len(info.cluster_addr_table)),
        ):
            family = GaugeMetricFamily(name, what, labels=names)
            family.add_metric(values, value)
            yield family
        yield from families.rpc_latency(self._rpc, self._base)
        yield from families.loop_lag(self._loop_lag, self._base)
        yield from families.gc_pauses(process_gc_pauses(), self._base)


class NamesrvMetrics:
    """The exporter of one name server: RPC timing on its handler table, served on `port`."""

    def __init__(self, routes: RouteTable, host: str, port: int, node_id: str) -> None:
        self.rpc = RpcLatency()
        self.loop_lag = LoopLagMonitor(f"namesrv {node_id}")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NamesrvCollector(routes, self.rpc, self.loop_lag, node_id))
        self.server = MetricsServer(self.registry, host, port)

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self) -> None:
        self.loop_lag.start()
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()
        await self.loop_lag.stop()
