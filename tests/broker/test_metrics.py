"""The PROM exporter: known traffic in, a real HTTP scrape out, parsed by prometheus_client."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from broker_harness import SMALL_STORE, Harness, messages, running_broker
from prometheus_client.parser import text_string_to_metric_families

from tidemq.broker.app import BrokerApp
from tidemq.broker.config import ConfigError
from tidemq.broker.config_file import load_broker_config
from tidemq.broker.stats import TOPIC_PUT_NUMS
from tidemq.cli.main import build_parser
from tidemq.cli.servers import broker_port_hints, dev_overrides, listen_error_line
from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader, PullSysFlag
from tidemq.protocol.headers_query import ConsumerSendMsgBackRequestHeader
from tidemq.protocol.message import SysFlag
from tidemq.remoting.acceptor import ListenError
from tidemq.testing import eventually

PROM = {"metricsExporterType": "PROM", "metricsPromExporterPort": "0"}
BASE = {"cluster": "DefaultCluster", "node_type": "broker"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


async def scrape(harness: Harness, path: str = "/metrics") -> tuple[int, str]:
    port = harness.app.metrics.port
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{path}")


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels` (and the broker's base labels)."""
    wanted = {**BASE, "node_id": "broker-a", **labels}.items()
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def _prepare(broker: Harness, body: bytes) -> int:
    at = broker.app.store.max_physical_offset
    props = {"TRAN_MSG": "true", "PGROUP": "PG_TX"}
    sent = await broker.send("TX", body, properties=props, sys_flag=SysFlag.PREPARED)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    return at


async def _end(broker: Harness, half_at: int, queue_offset: int, verdict: int) -> None:
    header = EndTransactionRequestHeader(
        producer_group="PG_TX",
        tran_state_table_offset=queue_offset,
        commit_log_offset=half_at,
        commit_or_rollback=verdict,
        msg_id="M",
    )
    request = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())
    answer = await broker.call(request)
    assert answer.code == ResponseCode.SUCCESS, answer.remark


async def _traffic(broker: Harness) -> tuple[int, int]:
    """5 sends of 100 bytes to T, 3 pulled by G (offset 2 committed), one moved to %DLQ%G, one
    transaction committed and one rolled back. Returns the bytes stored to T and pulled."""
    for _ in range(5):
        sent = await broker.send("T", b"x" * 100)
        assert sent.code == ResponseCode.SUCCESS
    everything = await broker.pull("T", group="OTHER", max_msgs=32)
    stored = len(everything.body)
    pulled = await broker.pull("T", group="G", max_msgs=3)
    records = messages(pulled)
    assert len(records) == 3
    commit = PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET
    # commits offset 2 of G; answers from offset 3 on (not counted: nothing more than asked)
    await broker.pull("T", group="G", offset=3, max_msgs=1, sys_flag=commit, commit_offset=2)
    back = ConsumerSendMsgBackRequestHeader(
        offset=records[0].physical_offset, group="G", delay_level=-1, origin_topic="T"
    )
    request = RemotingCommand(code=RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=back.to_fields())
    assert (await broker.call(request)).code == ResponseCode.SUCCESS
    first = await _prepare(broker, b"commit me")
    second = await _prepare(broker, b"roll me back")
    await _end(broker, first, 0, 8)
    await _end(broker, second, 1, 12)
    return stored, len(pulled.body)


async def test_scrape_reports_known_traffic(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", **PROM) as broker:
        stored, pulled_bytes = await _traffic(broker)
        await asyncio.sleep(0.02)  # the oldest unconsumed message is at least 20 ms old
        status, text = await scrape(broker)
        assert status == 200
        samples = parse(text)
        t = {"topic": "T"}
        assert value(samples, "rocketmq_messages_in_total", **t, message_type="normal") == 5
        assert value(samples, "rocketmq_throughput_in_total", **t) == stored
        half = {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "message_type": "transaction"}
        assert value(samples, "rocketmq_messages_in_total", **half, is_system="true") == 2
        g = {"topic": "T", "consumer_group": "G", "is_retry": "false"}
        # 3 by the first pull, 1 by the committing pull (offset 3)
        assert value(samples, "rocketmq_messages_out_total", **g) == 4
        one_more = (
            messages(await broker.pull("T", group="Z", offset=3, max_msgs=1)).pop().total_size
        )
        assert value(samples, "rocketmq_throughput_out_total", **g) == pulled_bytes + one_more
        # committed 2 of 5, pulled to 4: lag 3, in flight 2, ready 1
        assert value(samples, "rocketmq_consumer_lag_messages", **g) == 3
        assert value(samples, "rocketmq_consumer_inflight_messages", **g) == 2
        assert value(samples, "rocketmq_consumer_ready_messages", **g) == 1
        assert 20 <= value(samples, "rocketmq_consumer_lag_latency", **g) < 60_000
        dlq = {"topic": "T", "consumer_group": "G"}
        assert value(samples, "rocketmq_send_to_dlq_messages_total", **dlq) == 1
        assert value(samples, "rocketmq_commit_messages_total") == 1
        assert value(samples, "rocketmq_rollback_messages_total") == 1
        assert value(samples, "rocketmq_half_messages") == 0
        assert value(samples, "rocketmq_message_size_count") == 7  # 5 plain, 2 halves
        assert value(samples, "rocketmq_message_size_bucket", le="1024.0") == 7
        send = {"request_code": "send_message", "response_code": "success"}
        assert value(samples, "rocketmq_rpc_latency_count", **send) == 7
        assert value(samples, "rocketmq_rpc_latency_bucket", **send, le="+Inf") == 7
        pull = {"request_code": "pull_message", "response_code": "success"}
        assert value(samples, "rocketmq_rpc_latency_count", **pull) >= 3
        assert value(samples, "rocketmq_storage_size", storage_type="local") > stored
        assert value(samples, "tidemq_event_loop_lag_seconds", quantile="0.99") >= 0


async def test_unknown_path_is_404(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", **PROM) as broker:
        status, _ = await scrape(broker, "/nothing")
        assert status == 404
        status, text = await scrape(broker, "/metrics")
        assert status == 200
        assert "rocketmq_messages_in_total" in text


async def test_loop_lag_is_measured(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", **PROM) as broker:
        monitor = broker.app.metrics.loop_lag
        before = monitor.over_warn
        await asyncio.sleep(0.06)  # let a probe start, then block the loop
        started = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - started < 0.25:
            pass
        await eventually(lambda: monitor.over_warn > before, what="a probe over 100 ms late")
        _, text = await scrape(broker)
        assert value(parse(text), "tidemq_event_loop_lag_seconds", quantile="1.0") >= 0.15


@pytest.mark.parametrize("kind", ["OTLP_GRPC", "LOG", "nonsense"])
def test_unimplemented_exporter_is_refused(tmp_path: Path, kind: str) -> None:
    overrides = {"storePathRootDir": str(tmp_path), "metricsExporterType": kind}
    with pytest.raises(ConfigError, match="metricsExporterType"):
        BrokerApp(load_broker_config(None, {}, overrides), SystemClock())


async def test_metrics_off_by_default(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as broker:
        assert broker.app.metrics.server is None
        assert broker.app.server.handlers.observer is None


async def test_stats_are_sampled_with_metrics_off(tmp_path: Path) -> None:
    """VIEW_BROKER_STATS_DATA and runtime info read BrokerStats' windows with or without PROM."""
    async with running_broker(tmp_path / "store") as broker:
        assert (await broker.send("T", b"x")).code == ResponseCode.SUCCESS
        [sampler] = [s for s in broker.app._periodic if s.name == "stats-sample"]
        sampler.trigger()
        stats = broker.app.stats
        await eventually(lambda: stats.window(TOPIC_PUT_NUMS, "T").minute.sum == 1)


def test_dev_metrics_port_turns_the_exporters_on(tmp_path: Path) -> None:
    argv = ["dev", "--data-dir", str(tmp_path), "--slave", "--metrics-port", "7001"]
    master, slave = dev_overrides(build_parser().parse_args(argv), {})
    assert master["metricsExporterType"] == slave["metricsExporterType"] == "PROM"
    assert master["metricsPromExporterPort"] == "7001"
    assert slave["metricsPromExporterPort"] == "7003"  # the name server has 7002
    [plain] = dev_overrides(build_parser().parse_args(["dev", "--data-dir", str(tmp_path)]), {})
    assert "metricsExporterType" not in plain


async def test_a_taken_metrics_port_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        overrides = {**SMALL_STORE, "storePathRootDir": str(tmp_path), **PROM}
        overrides["metricsPromExporterPort"] = str(port)
        config = load_broker_config(None, {}, overrides)
        app = BrokerApp(config, SystemClock())
        with pytest.raises(ListenError) as caught:
            await app.start()
        assert caught.value.port == port
        line = listen_error_line(caught.value, broker_port_hints(config, "--port"))
        assert "metricsPromExporterPort" in line
