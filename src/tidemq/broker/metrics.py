"""The broker's Prometheus metrics (metricsExporterType=PROM): RocketMQ 5's names and labels,
built at scrape time from the counters the broker keeps anyway.

    handlers ──(plain ints)──▶ BrokerStats, TransactionStats, RpcLatency, LoopLagMonitor
    GET /metrics ─▶ BrokerCollector.collect() ─▶ metric families ─▶ Prometheus text

Nothing is exported between scrapes: counting costs what it costs with metrics off, and a
scrape walks the tables once (the consumer-offset table for lag: one dict lookup per queue).
The lag latency needs the store time of each lagging queue's oldest unconsumed record: read once
per committed offset and cached, within LAG_READ_BUDGET_S per scrape (a read can map a
consume-queue file); past the budget a queue keeps the value last read. Every family
carries upstream's common labels cluster (brokerClusterName), node_type=broker and node_id
(brokerName). docs/operations.md lists every family with its labels.

What differs from upstream, and why:
- message_type is "transaction" for half messages (counted under RMQ_SYS_TRANS_HALF_TOPIC) and
  "normal" otherwise: the counters are per topic, not per type (no per-message work).
- rocketmq_message_size has no topic label, and a batch is bucketed at its mean size.
- rocketmq_commit/rollback_messages_total are the broker's totals (TransactionStats).
- rocketmq_storage_dispatch_behind_bytes is not exported: the store dispatches as it appends
  and publishes no dispatched offset (a failed dispatch is logged and retried by the store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.config import BrokerConfig
from tidemq.broker.offsets import ConsumerOffsetTable, split_key
from tidemq.broker.replication import Replication
from tidemq.broker.stats import SIZE_BUCKETS, BrokerStats
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import Clock
from tidemq.metrics import families
from tidemq.metrics.gc_pauses import process_gc_pauses
from tidemq.metrics.http import MetricsServer
from tidemq.metrics.loop_lag import LoopLagMonitor
from tidemq.protocol.names import (
    CID_RMQ_SYS_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    is_retry_topic,
    is_system_topic,
)
from tidemq.remoting.handlers import RpcLatency
from tidemq.store.message_store import FileMessageStore

log = logging.getLogger(__name__)

Labels = Sequence[tuple[str, str]]
# Store reads a scrape may spend on lag latency (the oldest unconsumed message's store time):
# with thousands of queues behind, reading each would hold the loop for a second.
LAG_READ_BUDGET_S = 0.02


def _flag(value: bool) -> str:
    return "true" if value else "false"


def is_system(topic: str, group: str = "") -> bool:
    """Upstream's is_system: a system topic, or a group named CID_RMQ_SYS_*."""
    return is_system_topic(topic) or group.upper().startswith(CID_RMQ_SYS_PREFIX)


@dataclass(frozen=True, slots=True)
class BrokerMetricsParts:
    """What the collector reads: the broker's own parts, handed over by app.py."""

    config: BrokerConfig
    stats: BrokerStats
    transaction_stats: TransactionStats
    ledger: TransactionLedger
    store: FileMessageStore
    offsets: ConsumerOffsetTable
    clients: ClientRegistry
    replication: Replication
    rpc: RpcLatency
    loop_lag: LoopLagMonitor
    now_ms: Callable[[], int]


class BrokerCollector(Collector):
    def __init__(self, parts: BrokerMetricsParts) -> None:
        self._parts = parts
        config = parts.config
        self._base: Labels = (
            ("cluster", config.broker_cluster_name),
            ("node_type", "broker"),
            ("node_id", config.broker_name),
        )
        # (group, topic, queue id) → (committed offset, store time of the message there)
        self._oldest: dict[tuple[str, str, int], tuple[int, int]] = {}

    def _names(self, *extra: str) -> list[str]:
        return [*(name for name, _ in self._base), *extra]

    def _values(self, *extra: str) -> list[str]:
        return [*(value for _, value in self._base), *extra]

    def collect(self) -> Iterator[Metric]:
        yield from self._traffic_in()
        yield from self._traffic_out()
        yield from self._lag()
        yield from self._connections()
        yield from self._transactions()
        yield from self._storage()
        yield from self._replication()
        yield from families.rpc_latency(self._parts.rpc, self._base)
        yield from families.loop_lag(self._parts.loop_lag, self._base)
        yield from families.gc_pauses(process_gc_pauses(), self._base)

    def _traffic_in(self) -> Iterator[Metric]:
        stats = self._parts.stats
        labels = self._names("topic", "message_type", "is_system")
        messages = CounterMetricFamily(
            "rocketmq_messages_in_total", "Messages stored by sends", labels=labels
        )
        throughput = CounterMetricFamily(
            "rocketmq_throughput_in_total", "Bytes stored by sends (whole records)", labels=labels
        )
        for topic, count in stats.put_nums.items():
            kind = "transaction" if topic == RMQ_SYS_TRANS_HALF_TOPIC else "normal"
            values = self._values(topic, kind, _flag(is_system(topic)))
            messages.add_metric(values, count)
            throughput.add_metric(values, stats.put_bytes.get(topic, 0))
        yield messages
        yield throughput
        sizes = HistogramMetricFamily(
            "rocketmq_message_size", "Sizes of stored messages, in bytes", labels=self._names()
        )
        buckets = families.cumulative_buckets(SIZE_BUCKETS, stats.size_buckets)
        sizes.add_metric(self._values(), buckets, sum_value=stats.size_sum)
        yield sizes

    def _traffic_out(self) -> Iterator[Metric]:
        stats = self._parts.stats
        labels = self._names("topic", "consumer_group", "is_retry", "is_system")
        messages = CounterMetricFamily(
            "rocketmq_messages_out_total", "Messages returned by pulls", labels=labels
        )
        throughput = CounterMetricFamily(
            "rocketmq_throughput_out_total", "Bytes returned by pulls", labels=labels
        )
        for (group, topic), count in stats.get_nums.items():
            values = self._values(
                topic, group, _flag(is_retry_topic(topic)), _flag(is_system(topic, group))
            )
            messages.add_metric(values, count)
            throughput.add_metric(values, stats.get_bytes.get((group, topic), 0))
        yield messages
        yield throughput
        dlq = CounterMetricFamily(
            "rocketmq_send_to_dlq_messages_total",
            "Messages moved to %DLQ%<group> by consumer send-back",
            labels=self._names("topic", "consumer_group", "is_system"),
        )
        for (group, topic), count in stats.dlq_nums.items():
            dlq.add_metric(self._values(topic, group, _flag(is_system(topic, group))), count)
        yield dlq

    def _lag(self) -> Iterator[Metric]:
        """Per (group, topic) of the consumer-offset table: lag = Σ(max - committed), inflight =
        Σ(pulled - committed), ready = Σ(max - max(pulled, committed)), latency = now - store
        time of the oldest unconsumed message (0 when none)."""
        parts = self._parts
        store, pulled = parts.store, parts.stats.pull_offsets
        now = parts.now_ms()
        labels = self._names("topic", "consumer_group", "is_retry", "is_system")
        lag_f = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Unconsumed", labels=labels)
        latency_f = GaugeMetricFamily(
            "rocketmq_consumer_lag_latency",
            "Age of the oldest unconsumed message, in milliseconds",
            labels=labels,
        )
        inflight_f = GaugeMetricFamily(
            "rocketmq_consumer_inflight_messages", "Pulled, not committed", labels=labels
        )
        ready_f = GaugeMetricFamily(
            "rocketmq_consumer_ready_messages", "Stored, not yet pulled", labels=labels
        )
        deadline = time.perf_counter() + LAG_READ_BUDGET_S
        max_offset, cache = store.max_offset, self._oldest
        for key, queues in parts.offsets.items():
            topic, group = split_key(key)
            lag = inflight = ready = 0
            oldest = 0
            # ~10,000 queues per scrape: plain comparisons, no calls but the store's
            for queue_id, committed in queues.items():
                end = max_offset(topic, queue_id)
                if end <= committed:
                    continue
                lag += end - committed
                pulled_to = pulled.get((group, topic, queue_id), committed)
                if pulled_to > committed:
                    inflight += (end if end < pulled_to else pulled_to) - committed
                    if end > pulled_to:
                        ready += end - pulled_to
                else:
                    ready += end - committed
                cached = cache.get((group, topic, queue_id))
                if cached is not None and cached[0] == committed:
                    stored = cached[1]
                else:
                    stored = self._read_oldest(group, topic, queue_id, committed, deadline)
                if stored and (oldest == 0 or stored < oldest):
                    oldest = stored
            values = self._values(
                topic, group, _flag(is_retry_topic(topic)), _flag(is_system(topic, group))
            )
            lag_f.add_metric(values, lag)
            latency_f.add_metric(values, now - oldest if oldest else 0)
            inflight_f.add_metric(values, inflight)
            ready_f.add_metric(values, ready)
        yield from (lag_f, latency_f, inflight_f, ready_f)

    def _read_oldest(
        self, group: str, topic: str, queue_id: int, committed: int, deadline: float
    ) -> int:
        """The store time of the queue's message at `committed` (0: unknown), read while the
        scrape's read budget lasts (a read may map a consume-queue file: measured 0.1-3 ms);
        past it, the last value read stands until a later scrape reads it again."""
        key = (group, topic, queue_id)
        if time.perf_counter() >= deadline:
            cached = self._oldest.get(key)
            return cached[1] if cached is not None else 0
        stored = self._parts.store.store_time_at(topic, queue_id, committed) or 0
        self._oldest[key] = (committed, stored)
        return stored

    def _connections(self) -> Iterator[Metric]:
        clients = self._parts.clients
        producers: dict[tuple[str, str], int] = {}
        for group in clients.producer_groups():
            for channel in clients.producer_channels(group):
                attrs = (channel.language.lower(), str(channel.version))
                producers[attrs] = producers.get(attrs, 0) + 1
        family = GaugeMetricFamily(
            "rocketmq_producer_connections",
            "Producer connections",
            labels=self._names("language", "version", "protocol_type"),
        )
        for (language, version), count in producers.items():
            family.add_metric(self._values(language, version, "remoting"), count)
        yield family
        consumers: dict[tuple[str, str, str, str], int] = {}
        for group in clients.consumer_groups():
            info = clients.consumer_group(group)
            if info is None:
                continue
            mode = info.consume_type.lower()
            for channel in info.channels.values():
                key = (group, channel.language.lower(), str(channel.version), mode)
                consumers[key] = consumers.get(key, 0) + 1
        family = GaugeMetricFamily(
            "rocketmq_consumer_connections",
            "Consumer connections",
            labels=self._names(
                "consumer_group",
                "language",
                "version",
                "consume_mode",
                "protocol_type",
                "is_system",
            ),
        )
        for (group, language, version, mode), count in consumers.items():
            system = _flag(is_system("", group))
            family.add_metric(
                self._values(group, language, version, mode, "remoting", system), count
            )
        yield family

    def _transactions(self) -> Iterator[Metric]:
        parts = self._parts
        half = GaugeMetricFamily(
            "rocketmq_half_messages", "Half messages awaiting their end", labels=self._names()
        )
        half.add_metric(self._values(), parts.ledger.in_flight)
        yield half
        for name, what, value in (
            ("rocketmq_commit_messages_total", "Transactions committed", "committed"),
            ("rocketmq_rollback_messages_total", "Transactions rolled back", "rolled_back"),
        ):
            family = CounterMetricFamily(name, what, labels=self._names())
            family.add_metric(self._values(), getattr(parts.transaction_stats, value))
            yield family

    def _storage(self) -> Iterator[Metric]:
        store = self._parts.store
        end = store.max_physical_offset
        for name, what, value in (
            ("rocketmq_storage_size", "Commit-log bytes held", end - store.min_physical_offset),
            (
                "rocketmq_storage_flush_behind_bytes",
                "Commit-log bytes appended, not yet flushed",
                max(0, end - store.flushed_physical_offset),
            ),
        ):
            family = GaugeMetricFamily(name, what, labels=self._names("storage_type"))
            family.add_metric(self._values("local"), value)
            yield family

    def _replication(self) -> Iterator[Metric]:
        """TideMQ's own (upstream exports no HA figures): a master's view of each slave, or a
        slave's view of its master."""
        replication = self._parts.replication
        acked = GaugeMetricFamily(
            "tidemq_replication_slave_ack_offset",
            "Commit-log offset each slave acknowledged",
            labels=self._names("slave"),
        )
        lag_bytes = GaugeMetricFamily(
            "tidemq_replication_lag_bytes",
            "Commit-log bytes a slave lacks (on a slave: slave=self)",
            labels=self._names("slave"),
        )
        lag_ms = GaugeMetricFamily(
            "tidemq_replication_lag_ms",
            "How long the first byte a slave lacks has waited, in milliseconds",
            labels=self._names("slave"),
        )
        if replication.master is not None:
            for slave in replication.master.slaves():
                name = f"{slave.broker_id}@{slave.addr}"
                acked.add_metric(self._values(name), slave.acked_offset)
                lag_bytes.add_metric(self._values(name), slave.lag_bytes)
                lag_ms.add_metric(self._values(name), slave.lag_ms)
        elif replication.slave is not None:
            state = replication.slave.state()
            lag_bytes.add_metric(self._values("self"), state.lag_bytes)
            lag_ms.add_metric(self._values("self"), state.lag_ms)
        yield from (acked, lag_bytes, lag_ms)


class MetricsSource(Protocol):
    """What BrokerMetrics reads of the broker (BrokerApp is one)."""

    config: BrokerConfig
    clock: Clock
    stats: BrokerStats
    transaction_stats: TransactionStats
    transactions: TransactionResolver
    store: FileMessageStore
    offsets: ConsumerOffsetTable
    clients: ClientRegistry
    replication: Replication


class BrokerMetrics:
    """The broker's metrics parts and their lifecycle: the loop-lag monitor always (its WARNING
    needs it), and with metricsExporterType=PROM the RPC timing (`rpc`, set on the handler
    table) and the exporter. (BrokerStats is sampled by one of the app's periodic services:
    VIEW_BROKER_STATS_DATA and runtime info read its windows with or without PROM.)"""

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self.rpc = RpcLatency() if config.metrics_exporter_type == "PROM" else None
        self.loop_lag = LoopLagMonitor(f"broker {config.broker_name}")
        self.registry: CollectorRegistry | None = None
        self.server: MetricsServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None, "metricsExporterType is not PROM"
        return self.server.port

    async def start(self, source: MetricsSource) -> None:
        self.loop_lag.start()
        if self.rpc is None:
            return
        config = source.config
        parts = BrokerMetricsParts(
            config,
            source.stats,
            source.transaction_stats,
            source.transactions.ledger,
            source.store,
            source.offsets,
            source.clients,
            source.replication,
            self.rpc,
            self.loop_lag,
            source.clock.now_ms,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(parts))
        host = config.metrics_prom_exporter_host or config.broker_ip
        self.server = MetricsServer(self.registry, host, config.metrics_prom_exporter_port)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
        await self.loop_lag.stop()
