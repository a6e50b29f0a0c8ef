"""`tidemq namesrv --metrics-port`: RPC latency and the route table's size over a real scrape."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.namesrv import NamesrvApp, NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import GetRouteInfoRequestHeader
from tidemq.remoting import RemotingClient
from tidemq.testing import eventually


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _one(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    found = [v for (n, ls), v in samples.items() if n == name and labels.items() <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def test_namesrv_exports_rpc_latency_and_routes(tmp_path: Path) -> None:
    namesrv = NamesrvApp(
        NamesrvConfig(listen_port=0), SystemClock(), host="127.0.0.1", metrics_port=0
    )
    await namesrv.start()
    client = RemotingClient()
    broker: BrokerApp | None = None
    try:
        assert namesrv.metrics is not None
        port = namesrv.metrics.port
        samples = await asyncio.to_thread(_scrape, port)
        assert _one(samples, "tidemq_namesrv_topics", node_type="namesrv") == 0
        header = GetRouteInfoRequestHeader(topic="NoSuchTopic")
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields=header.to_fields()
        )
        answer = await client.invoke(f"127.0.0.1:{namesrv.port}", request, 5000)
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        overrides = {
            "storePathRootDir": str(tmp_path / "store"),
            "listenPort": "0",
            "brokerIP1": "127.0.0.1",
            "listenHost": "127.0.0.1",
            "namesrvAddr": f"127.0.0.1:{namesrv.port}",
        }
        broker = BrokerApp(load_broker_config(None, {}, overrides), SystemClock())
        await broker.start()
        await eventually(lambda: namesrv.routes.cluster_info().broker_addr_table != {})
        samples = await asyncio.to_thread(_scrape, port)
        route = {"request_code": "get_routeinfo_by_topic", "response_code": "topic_not_exist"}
        assert _one(samples, "rocketmq_rpc_latency_count", **route) == 1
        register = {"request_code": "register_broker", "response_code": "success"}
        assert _one(samples, "rocketmq_rpc_latency_count", **register) >= 1
        assert _one(samples, "tidemq_namesrv_topics") > 0  # the broker's system topics
        assert _one(samples, "tidemq_namesrv_brokers") == 1
        assert _one(samples, "tidemq_event_loop_lag_seconds", quantile="0.99") >= 0
        assert _one(samples, "tidemq_gc_pause_seconds_count", generation="2") >= 0  # exported
    finally:
        if broker is not None:
            await broker.stop()
        await client.close()
        await namesrv.stop()
