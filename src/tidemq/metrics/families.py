"""Metric families both servers export: RPC latency (RocketMQ 5's rocketmq_rpc_latency), the
event-loop lag and the GC pauses. Built at scrape time from the plain counters that own them.

rocketmq_rpc_latency is upstream's histogram in milliseconds, labelled protocol_type=remoting,
request_code and response_code (their names in lower case, as upstream's REQUEST_CODE_MAP; a
code without a name is its number) and result (success: TideMQ counts answered requests only).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tidemq.metrics.gc_pauses import GC_PAUSE_BOUNDS_S, GcPauses
from tidemq.metrics.loop_lag import LoopLagMonitor
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.remoting.handlers import RPC_LATENCY_BOUNDS_MS, RpcLatency

_REQUEST_NAMES = {int(code): code.name.lower() for code in RequestCode}
_RESPONSE_NAMES = {int(code): code.name.lower() for code in ResponseCode}


def request_code_name(code: int) -> str:
    return _REQUEST_NAMES.get(code, str(code))


def response_code_name(code: int) -> str:
    return _RESPONSE_NAMES.get(code, str(code))


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """A Prometheus histogram's (le, cumulative count) pairs from per-bucket counts: one count
    per bound, then the +Inf one at `counts[len(bounds)]` (a slot after it is not read)."""
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip(bounds, counts, strict=False):
        cumulative += count
        buckets.append((str(float(bound)), cumulative))
    buckets.append(("+Inf", cumulative + counts[len(bounds)]))
    return buckets


def rpc_latency(observer: RpcLatency, base: Sequence[tuple[str, str]]) -> Iterator[Metric]:
    """rocketmq_rpc_latency from `observer`'s buckets; `base`: the server's own labels."""
    names = [name for name, _ in base]
    values = [value for _, value in base]
    family = HistogramMetricFamily(
        "rocketmq_rpc_latency",
        "Time from a request's dispatch to its answer, in milliseconds",
        labels=[*names, "protocol_type", "request_code", "response_code", "result"],
    )
    for (request, response), counts in observer.buckets.items():
        labels = [
            *values,
            "remoting",
            request_code_name(request),
            response_code_name(response),
            "success",
        ]
        buckets = cumulative_buckets(RPC_LATENCY_BOUNDS_MS, counts)
        family.add_metric(labels, buckets, sum_value=counts[-1] / 1e6)
    yield family


def loop_lag(monitor: LoopLagMonitor, base: Sequence[tuple[str, str]]) -> Iterator[Metric]:
    """tidemq_event_loop_lag_seconds{quantile}: the last minute's p50, p99 and max (1)."""
    family = GaugeMetricFamily(
        "tidemq_event_loop_lag_seconds",
        "How late the event loop ran a due timer, over the last minute (quantile 1: the max)",
        labels=[*(name for name, _ in base), "quantile"],
    )
    values = [value for _, value in base]
    for quantile, lag in monitor.quantiles().items():
        family.add_metric([*values, str(quantile)], lag)
    yield family
    over = CounterMetricFamily(
        "tidemq_event_loop_lag_probes_over_100ms",
        "Probes since start that found the loop over 100 ms late",
        labels=[name for name, _ in base],
    )
    over.add_metric(values, monitor.over_warn)
    yield over


def gc_pauses(pauses: GcPauses, base: Sequence[tuple[str, str]]) -> Iterator[Metric]:
    """tidemq_gc_pause_seconds{generation}: every cyclic-GC pause of the process since start."""
    family = HistogramMetricFamily(
        "tidemq_gc_pause_seconds",
        "How long each garbage collection stopped the process, by generation (2: full)",
        labels=[*(name for name, _ in base), "generation"],
    )
    values = [value for _, value in base]
    for generation, counts in enumerate(pauses.counts):
        buckets = cumulative_buckets(GC_PAUSE_BOUNDS_S, counts)
        family.add_metric([*values, str(generation)], buckets, pauses.sums[generation])
    yield family
