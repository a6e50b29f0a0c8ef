"""The cost of metrics (issue 17): pipelined produce against two `tidemq dev` processes started
side by side, measured in turns (off, on, off, on, ...) so both see the same machine, and the
loop time one scrape of a broker with 10,000 queues takes.

    off  metricsExporterType=DISABLE: the counters (BrokerStats) still count, nothing is timed
    on   tidemq dev --metrics-port: RPC latency timed per request, /metrics scraped every
         `--scrape-every` seconds by this process during the turn (a real HTTP GET)

Each turn sends for `--seconds` with `--window` send_nowait futures in flight on one producer,
1 KiB bodies, ASYNC_FLUSH (bench_security.py's load and its helpers). Target: on >= 0.97x off.
Also reported: the server process's CPU per message (what a busy machine changes least).

Scrape cost: an in-process broker with 100 topics of 100 queues, one message in each queue and
a consumer group one message behind on every queue (so the lag latency reads each queue's
oldest record), scraped `--scrapes` times; the median and max time of the collection, which is
loop time (collectors run on the loop thread). Target: well under 100 ms.

Usage: python benchmarks/bench_metrics.py [--runs 3] [--seconds 3] [--window 256]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_security import (
    BODY_SIZE,
    GROUP,
    Variant,
    dev_server,
    free_port,
    pipelined,
    prepare,
    process_cpu_s,
)
from prometheus_client.exposition import generate_latest

from tidemq import Producer
from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.remoting.loop import install_uvloop
from tidemq.store.types import MessageToStore

TARGET = 0.97
SCRAPE_TOPICS = 100
SCRAPE_QUEUES = 100


async def _scraper(port: int, every_s: float, stop: asyncio.Event) -> int:
    """GET /metrics every `every_s` until `stop`; the number of scrapes."""
    url = f"http://127.0.0.1:{port}/metrics"
    count = 0

    def get() -> None:
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()

    while not stop.is_set():
        await asyncio.to_thread(get)
        count += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
    return count


def _free_pair() -> int:
    """A free port whose next one is free too (`tidemq dev --metrics-port N` binds N and N+1)."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


async def produce_ab(args: argparse.Namespace, root: Path) -> str:
    metrics_port = _free_pair()
    variants = [Variant("off", []), Variant("on", ["--metrics-port", str(metrics_port)])]
    body = os.urandom(BODY_SIZE)
    rates: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    scrapes = 0
    with contextlib.ExitStack() as stack:
        for variant in variants:
            variant.namesrv, variant.pid = stack.enter_context(
                dev_server(root / variant.name, variant.dev_args)
            )
        producers: dict[str, Producer] = {}
        try:
            for variant in variants:
                await prepare(variant)
                producers[variant.name] = producer = Producer(GROUP, variant.namesrv)
                await producer.start()
                await pipelined(producer, min(args.seconds, 1.0), args.window, body)  # warm up
            for _ in range(args.runs):
                for variant in variants:
                    stop = asyncio.Event()
                    scraping = None
                    if variant.name == "on":
                        scraping = asyncio.create_task(
                            _scraper(metrics_port, args.scrape_every, stop)
                        )
                    server_before = process_cpu_s(variant.pid)
                    started = time.perf_counter()
                    rate = await pipelined(producers[variant.name], args.seconds, args.window, body)
                    sent = rate * (time.perf_counter() - started)
                    server_cpu = process_cpu_s(variant.pid) - server_before
                    stop.set()
                    if scraping is not None:
                        scrapes += await scraping
                    rates[variant.name].append((rate, server_cpu / sent * 1e6))
        finally:
            for producer in producers.values():
                await producer.shutdown()
    off = statistics.median(r for r, _ in rates["off"])
    on = statistics.median(r for r, _ in rates["on"])
    off_cpu = statistics.median(c for _, c in rates["off"])
    on_cpu = statistics.median(c for _, c in rates["on"])
    verdict = "met" if on / off >= TARGET else "MISSED"
    return "\n".join(
        [
            f"pipelined produce, 1 KiB bodies, window {args.window}, ASYNC_FLUSH, "
            f"python {sys.version.split()[0]}, median of {args.runs} turns; CPU: the server's",
            f"off {off:>10,.0f} msg/s  {off_cpu:6.1f} us/msg   turns "
            + " ".join(f"{r:,.0f}" for r, _ in rates["off"]),
            f"on  {on:>10,.0f} msg/s  {on_cpu:6.1f} us/msg   turns "
            + " ".join(f"{r:,.0f}" for r, _ in rates["on"])
            + f"  ({scrapes} scrapes)",
            f"on/off {on / off:.3f}x  target >= {TARGET}x {verdict}; server CPU per message "
            f"{on_cpu / off_cpu:.3f}x",
        ]
    )


def _fill(app: BrokerApp) -> None:
    """One message in each queue of SCRAPE_TOPICS x SCRAPE_QUEUES (stored directly: the scrape
    is measured, not the sends), and group G committed at offset 0 on every queue (one
    behind), as pulls of G would have left it."""
    host = ("127.0.0.1", app.port)
    for t in range(SCRAPE_TOPICS):
        topic = f"Scrape{t}"
        app.topics.ensure(topic, SCRAPE_QUEUES)
        for queue_id in range(SCRAPE_QUEUES):
            message = MessageToStore(topic, queue_id, b"x" * 100, 0, "", 0, 1, host, host)
            result = app.store.put_message(message)
            assert result.ok, result
            app.stats.put(topic, 1, result.size)
            app.offsets.commit("G", topic, queue_id, 0)
            app.stats.pulled("G", topic, queue_id, 1)
        app.stats.got("G", topic, SCRAPE_QUEUES, 100 * SCRAPE_QUEUES)


async def scrape_cost(args: argparse.Namespace, root: Path) -> str:
    overrides = {
        "storePathRootDir": str(root / "scrape"),
        "listenPort": "0",
        "brokerIP1": "127.0.0.1",
        "listenHost": "127.0.0.1",
        "metricsExporterType": "PROM",
        "metricsPromExporterPort": "0",
        "flushDiskType": "ASYNC_FLUSH",
    }
    app = BrokerApp(load_broker_config(None, {}, overrides), SystemClock())
    await app.start()
    try:
        _fill(app)
        registry = app.metrics.registry
        assert registry is not None
        times_ms = []
        size = 0
        cpu_ms = []
        for _ in range(args.scrapes):
            started, cpu = time.perf_counter(), time.process_time()
            size = len(generate_latest(registry))
            times_ms.append((time.perf_counter() - started) * 1000)
            cpu_ms.append((time.process_time() - cpu) * 1000)
    finally:
        await app.stop()
    queues = SCRAPE_TOPICS * SCRAPE_QUEUES
    return (
        f"scrape of {queues:,} queues ({SCRAPE_TOPICS} topics, 1 group behind on each queue): "
        f"median {statistics.median(times_ms):.1f} ms, max {max(times_ms):.1f} ms of loop time "
        f"(first {times_ms[0]:.1f} ms: it reads each queue's oldest record within its budget; "
        f"CPU median {statistics.median(cpu_ms):.1f} ms) over {args.scrapes} scrapes, "
        f"{size / 1024:.0f} KiB of text"
    )


async def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-metrics-") as tmp:
        root = Path(tmp)
        produce = await produce_ab(args, root)
        cost = await scrape_cost(args, root)
    return f"{produce}\n{cost}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="turns per variant (median)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one turn")
    parser.add_argument("--window", type=int, default=256, help="sends in flight")
    parser.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes timed for the cost")
    args = parser.parse_args()
    install_uvloop()
    print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
