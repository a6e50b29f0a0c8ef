"""Broker-side message trace end to end (broker/trace.py): real clients against local_cluster,
the trace read back as the dashboard reads it (QUERY_MESSAGE by msgId on the trace topic)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.broker.config import ConfigError
from tidemq.cli.main import main as cli_main
from tidemq.client.admin import Admin
from tidemq.client.trace import message_trace
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.protocol import trace as tr
from tidemq.protocol.names import RMQ_SYS_TRACE_TOPIC
from tidemq.testing import LocalCluster, eventually, eventually_async, local_cluster

pytestmark = pytest.mark.integration

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
FAST_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms"
TRACED = {"brokerTraceEnable": "true", "messageDelayLevel": FAST_LEVELS}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings=TRACED) as running:
        yield running


def kinds(records: list[tr.TraceRecord]) -> list[tuple[str, str, bool]]:
    return [(r.trace_type, r.group, r.success) for r in records]


async def trace_until(
    cluster: LocalCluster, msg_id: str, done: Callable[[list[tr.TraceRecord]], bool]
) -> list[tr.TraceRecord]:
    """The message's trace once `done` holds for it."""
    found: list[tr.TraceRecord] = []

    async def check() -> bool:
        nonlocal found
        async with Admin(cluster.namesrv_addr) as admin:
            found = await message_trace(admin, msg_id)
        return done(found)

    await eventually_async(check, what=f"trace of {msg_id}")
    return found


async def consume(
    cluster: LocalCluster, group: str, topic: str, listener: Any, **options: Any
) -> PushConsumer:
    consumer = PushConsumer(
        group,
        cluster.namesrv_addr,
        consume_from_where=FIRST,
        persist_interval_ms=100,
        rebalance_interval_ms=200,
        **options,
    )
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    await consumer.start()
    return consumer


async def test_send_consume_commit_show_pub_sub_before_and_sub_after(cluster: LocalCluster) -> None:
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("TraceTopic", b"hello", tags="TagA", keys="order-7"))
    got: list[MessageExt] = []
    consumer = await consume(cluster, "CG_T", "TraceTopic", got.extend)
    try:
        records = await trace_until(
            cluster, sent.msg_id, lambda rs: any(r.trace_type == tr.SUB_AFTER for r in rs)
        )
    finally:
        await consumer.shutdown()
    assert kinds(records) == [
        (tr.PUB, "PG_T", True),
        (tr.SUB_BEFORE, "CG_T", True),
        (tr.SUB_AFTER, "CG_T", True),
    ]
    pub, before, after = records
    assert (pub.topic, pub.tags, pub.keys, pub.body_length) == ("TraceTopic", "TagA", "order-7", 5)
    assert pub.offset_msg_id == sent.offset_msg_id
    assert pub.store_host == cluster.brokers[0].address
    assert pub.msg_type == tr.MSG_TYPE_NORMAL
    assert before.retry_times == 0
    assert after.context_code == tr.CONTEXT_SUCCESS
    assert before.request_id.replace("pull", "ack") == after.request_id  # the same queue offset
    # Found by the message's key as well (the trace message is keyed by both).
    async with Admin(cluster.namesrv_addr) as admin:
        by_key = await admin.query_message_by_key(RMQ_SYS_TRACE_TOPIC, "order-7")
        by_offset_id = await message_trace(admin, sent.offset_msg_id)  # via its UNIQ_KEY
    assert by_key
    assert by_offset_id == records


async def test_failing_consumer_shows_send_back_then_dlq(cluster: LocalCluster) -> None:
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("PoisonTrace", b"poison"))

    def fail(messages: list[MessageExt]) -> None:
        raise RuntimeError("always fails")

    consumer = await consume(cluster, "CG_P", "PoisonTrace", fail, max_reconsume_times=1)
    try:
        records = await trace_until(
            cluster, sent.msg_id, lambda rs: any(r.context_code == tr.CONTEXT_DLQ for r in rs)
        )
    finally:
        await consumer.shutdown()
    failed = [r for r in records if r.trace_type == tr.SUB_AFTER and not r.success]
    assert [(r.group, r.context_code, r.request_id) for r in failed] == [
        ("CG_P", tr.CONTEXT_FAILED, "sendback:1"),
        ("CG_P", tr.CONTEXT_DLQ, "dlq:2"),  # consumed twice,
    ]
    deliveries = [r.retry_times for r in records if r.trace_type == tr.SUB_BEFORE]
    assert deliveries == [0, 1]


class Decides:
    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.state

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return self.state


@pytest.mark.parametrize(
    "state", [LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE]
)
async def test_transaction_outcome_is_an_end_transaction_record(
    cluster: LocalCluster, state: LocalTransactionState
) -> None:
    producer = TransactionProducer("PG_TX", cluster.namesrv_addr, listener=Decides(state))
    async with producer:
        sent = await producer.send_message_in_transaction(Message("TxTrace", b"t", keys="tx-k"))
    records = await trace_until(
        cluster, sent.msg_id, lambda rs: any(r.trace_type == tr.END_TRANSACTION for r in rs)
    )
    pub, end = records
    assert (pub.trace_type, pub.msg_type, pub.group) == (tr.PUB, tr.MSG_TYPE_TRANS_HALF, "PG_TX")
    assert (end.trace_type, end.group, end.topic, end.keys) == (
        tr.END_TRANSACTION,
        "PG_TX",
        "TxTrace",
        "tx-k",
    )
    assert end.transaction_state == state.name
    assert end.from_transaction_check is False
    assert end.transaction_id == sent.transaction_id


async def test_cli_prints_the_timeline_and_json(cluster: LocalCluster, capsys: Any) -> None:
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("CliTrace", b"x", keys="cli-k"))
    await trace_until(cluster, sent.msg_id, bool)
    argv = ["message", "trace", "-n", cluster.namesrv_addr, "--id", sent.msg_id.lower()]
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, argv) == 0
    table = capsys.readouterr().out
    for word in ("sent", "CliTrace", "keys=cli-k"):
        assert word in table
    assert await asyncio.to_thread(cli_main, [*argv, "--json"]) == 0
    document = orjson.loads(capsys.readouterr().out)
    assert document["msg_id"] == sent.msg_id
    assert [r["trace_type"] for r in document["records"]] == [tr.PUB]
    unknown = ["message", "trace", "-n", cluster.namesrv_addr, "--id", "00" * 16]
    assert await asyncio.to_thread(cli_main, unknown) == 1


async def test_tracing_off_writes_nothing(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster:
        broker = cluster.brokers[0]
        assert broker.trace is None
        async with Producer("PG_T", cluster.namesrv_addr) as producer:
            await producer.send(Message("Untraced", b"x"))
        assert broker.topics.get(RMQ_SYS_TRACE_TOPIC) is None
        assert RMQ_SYS_TRACE_TOPIC not in broker.store.topics_and_queues()


async def test_trace_topic_enable_alone_creates_the_topic_but_traces_nothing(
    tmp_path: Path,
) -> None:
    settings = {"traceTopicEnable": "true", "msgTraceTopicName": "MyTrace"}
    async with local_cluster(tmp_path, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        assert broker.topics.get("MyTrace") is not None
        assert broker.trace is None


async def test_only_listed_topics_are_traced(tmp_path: Path) -> None:
    settings = {"brokerTraceEnable": "true", "brokerTraceTopics": "Listed, Other"}
    async with local_cluster(tmp_path, broker_settings=settings) as cluster:
        trace = cluster.brokers[0].trace
        assert trace is not None
        async with Producer("PG_T", cluster.namesrv_addr) as producer:
            await producer.send(Message("NotListed", b"x"))
            listed = await producer.send(Message("Listed", b"y"))
        await trace_until(cluster, listed.msg_id, bool)
        assert trace.written == 1
        assert [trace.traced(t) for t in ("Other", "NotListed", RMQ_SYS_TRACE_TOPIC)] == [
            True,
            False,
            False,
        ]
        assert not trace.traced("%RETRY%CG")


async def test_a_full_buffer_drops_and_counts(cluster: LocalCluster, monkeypatch: Any) -> None:
    import tidemq.broker.trace as broker_trace

    trace = cluster.brokers[0].trace
    assert trace is not None
    monkeypatch.setattr(broker_trace, "RECORDS_MAX", 2)
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        await producer.send_batch([Message("Burst", b"%d" % i) for i in range(5)])
    await eventually(lambda: trace.dropped == 3)
    await eventually(lambda: trace.written == 2)


async def test_a_bad_trace_topic_name_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="msgTraceTopicName"):
        async with local_cluster(tmp_path, broker_settings={"msgTraceTopicName": "bad topic"}):
            pass


async def test_a_delayed_send_is_traced_when_parked_not_again_when_delivered(
    cluster: LocalCluster,
) -> None:
    message = Message("DelayTrace", b"later", keys="d-1", delay_level=1)  # 100 ms here
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        sent = await producer.send(message)
    store = cluster.brokers[0].store
    queue_id = sent.message_queue.queue_id
    await eventually(lambda: store.max_offset("DelayTrace", queue_id) == 1)
    trace = cluster.brokers[0].trace
    assert trace is not None
    await trace.flush()
    records = await trace_until(cluster, sent.msg_id, bool)
    assert [(r.trace_type, r.msg_type, r.topic) for r in records] == [
        (tr.PUB, tr.MSG_TYPE_DELAY, "DelayTrace")
    ]


async def test_a_large_burst_is_written_in_chunks_that_never_hold_the_loop(
    cluster: LocalCluster,
) -> None:
    import tidemq.broker.trace as broker_trace

    trace = cluster.brokers[0].trace
    assert trace is not None
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        for _ in range(8):
            await producer.send_batch([Message("BurstTrace", b"b" * 64) for _ in range(250)])
    store = cluster.brokers[0].store
    await eventually(lambda: trace.written >= 2000)
    queues = store.topics_and_queues()["BurstTrace"]
    # Deliveries of 32 records to two groups and a commit per queue (≤ 256 named): ~5000 records.
    expected = 0
    for queue_id in queues:
        count = store.max_offset("BurstTrace", queue_id)
        for start in range(0, count, 32):
            found = store.get_messages("BurstTrace", queue_id, start, 32)
            trace.delivered("CG_BURST", "BurstTrace", list(found.records))
            trace.delivered("CG_BURST2", "BurstTrace", list(found.records))
        trace.acked("CG_BURST", "BurstTrace", queue_id, 0, count)
        expected += 2 * count + min(count, broker_trace.ACK_NAMED_MAX)
    longest_lag = 0.0
    loop = asyncio.get_running_loop()
    written = trace.written
    async with asyncio.timeout(60):
        while trace.written - written < expected:
            before = loop.time()
            await asyncio.sleep(0.001)
            longest_lag = max(longest_lag, loop.time() - before)
    assert trace.dropped == 0
    # A chunk names ≤ 200 records, plus one event's (a commit's are read 64 at a time): the
    # guard against an unchunked writer, which names every one of them in one call.
    limit = broker_trace.CHUNK_RECORDS_MAX + broker_trace.ACK_READ_MAX
    assert 32 < trace.largest_chunk_records <= limit
    # ~2 ms of reading plus one store put; loose bounds: the test machine is shared (a GC
    # pause or a busy core adds tens of ms). Measured on a loaded 2-core machine: chunked ~12 ms
    # per chunk and ~30 ms of lag; unchunked, one call of ~370 ms (fails the first bound).
    assert trace.longest_chunk_s < 0.05 or longest_lag < 0.25
    assert longest_lag < 0.5  # a cheap task kept running throughout


async def test_tool_groups_are_not_traced_and_first_deliveries_forget_the_oldest(
    cluster: LocalCluster, monkeypatch: Any
) -> None:
    import tidemq.broker.trace as broker_trace

    trace = cluster.brokers[0].trace
    assert trace is not None
    monkeypatch.setattr(broker_trace, "FIRST_DELIVERED_MAX", 2)
    async with Producer("PG_T", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("GroupsTrace", b"g"))
    store = cluster.brokers[0].store
    queue_id = sent.message_queue.queue_id
    records = list(store.get_messages("GroupsTrace", queue_id, 0, 1).records)
    for group in ("TOOLS_CONSUMER", "CID_RMQ_SYS_X", "TIDEMQ_CLI_DLQ_READER"):
        trace.delivered(group, "GroupsTrace", records)
        trace.acked(group, "GroupsTrace", queue_id, None, 1)
    for group in ("CG_OLD", "CG_A", "CG_B"):  # CG_OLD's first delivery is forgotten
        trace.delivered(group, "GroupsTrace", records)
    await trace.flush()
    for group in ("CG_OLD", "CG_B"):
        trace.acked(group, "GroupsTrace", queue_id, None, 1)
    found = await trace_until(
        cluster, sent.msg_id, lambda rs: any(r.trace_type == tr.SUB_AFTER for r in rs)
    )
    assert sorted((r.trace_type, r.group) for r in found if r.trace_type != tr.PUB) == [
        (tr.SUB_AFTER, "CG_B"),
        (tr.SUB_BEFORE, "CG_A"),
        (tr.SUB_BEFORE, "CG_B"),
        (tr.SUB_BEFORE, "CG_OLD"),
    ]
