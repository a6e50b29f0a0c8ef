"""Transactions end to end: TransactionProducer against an in-process name server and broker.

One test per branch of issue 3, on real sockets, with the check-back interval at 100 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker.app import BrokerApp
from tidemq.cli.main import main as cli_main
from tidemq.client.blocking import BlockingTransactionProducer
from tidemq.client.message import Message, MessageExt, SendStatus
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.errors import NoPermissionError
from tidemq.protocol import message as pm
from tidemq.protocol import record as rec
from tidemq.protocol.bodies_client import HeartbeatData, ProducerData
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FLAG_ONEWAY, RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.testing import eventually, local_cluster

pytestmark = pytest.mark.integration

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
CHECK_MAX = 3
SETTINGS = {
    "transactionCheckInterval": "100",
    "transactionTimeOut": "300",
    "transactionCheckMax": str(CHECK_MAX),
    # Passes that find no producer are not counted toward transactionCheckMax (issue 11, item 6);
    # this caps them, so test_no_live_producer_then_discarded ends as quickly as before.
    "transactionUnreachedCheckMax": str(CHECK_MAX),
}
GROUP = "PG_TX"
TOPIC = "TxTopic"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Any]:
    async with local_cluster(tmp_path, broker_settings=SETTINGS) as running:
        yield running


class Listener:
    """Answers from two lists (the last answer repeats) and records what it was asked."""

    def __init__(
        self, execute: LocalTransactionState | Exception | None, *checks: LocalTransactionState
    ) -> None:
        self.execute = execute
        self.checks = list(checks) or [UNKNOW]
        self.executed: list[Message] = []
        self.checked: list[MessageExt] = []
        self.check_times: list[float] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        self.executed.append(message)
        if isinstance(self.execute, Exception):
            raise self.execute
        return self.execute

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        self.check_times.append(time.monotonic())
        index = min(len(self.checked), len(self.checks)) - 1
        return self.checks[index]


def real_messages(broker: BrokerApp, topic: str = TOPIC) -> list[rec.StoredMessage]:
    found = []
    for queue_id in range(8):
        result = broker.store.get_messages(topic, queue_id, 0, 256)
        found += [rec.decode_record(r) for r in result.records]
    return found


def stats(broker: BrokerApp) -> dict[str, int]:
    return broker.transaction_stats.snapshot(broker.transactions.ledger.in_flight)


def producer(cluster: Any, listener: Any, name: str = "p1") -> TransactionProducer:
    return TransactionProducer(GROUP, cluster.namesrv_addr, listener=listener, instance_name=name)


async def test_commit(cluster: Any) -> None:
    listener = Listener(COMMIT)
    async with producer(cluster, listener) as p:
        result = await p.send_message_in_transaction(Message(TOPIC, b"c", keys="k1"), arg=7)
    assert result.local_transaction_state is COMMIT
    assert result.send_status is SendStatus.SEND_OK
    (executed,) = listener.executed
    assert executed.properties[pm.TRAN_MSG] == "true"
    assert executed.properties[pm.UNIQ_KEY] == result.msg_id
    broker = cluster.brokers[0]
    await eventually(lambda: len(real_messages(broker)) == 1)
    (real,) = real_messages(broker)
    assert real.body == b"c"
    assert real.property_map()[pm.UNIQ_KEY] == result.msg_id
    assert pm.TRAN_MSG not in real.property_map()
    assert stats(broker)["committed"] == 1
    assert listener.checked == []


async def test_rollback(cluster: Any) -> None:
    async with producer(cluster, Listener(ROLLBACK)) as p:
        result = await p.send_message_in_transaction(Message(TOPIC, b"r"))
    broker = cluster.brokers[0]
    await eventually(lambda: stats(broker)["rolled_back"] == 1)
    assert result.local_transaction_state is ROLLBACK
    assert real_messages(broker) == []


async def test_unknown_then_check_then_commit(cluster: Any) -> None:
    listener = Listener(UNKNOW, UNKNOW, COMMIT)
    async with producer(cluster, listener) as p:
        result = await p.send_message_in_transaction(Message(TOPIC, b"u"))
        broker = cluster.brokers[0]
        await eventually(lambda: len(real_messages(broker)) == 1)
    assert result.local_transaction_state is UNKNOW
    assert len(listener.checked) == 2
    assert [m.properties[pm.TRANSACTION_CHECK_TIMES] for m in listener.checked] == ["1", "2"]
    assert listener.checked[0].topic == TOPIC
    assert listener.checked[0].msg_id == result.msg_id
    assert stats(broker)["checked"] == 2


async def test_unknown_then_check_then_rollback(cluster: Any) -> None:
    listener = Listener(None, ROLLBACK)  # None from the listener counts as UNKNOW
    async with producer(cluster, listener) as p:
        result = await p.send_message_in_transaction(Message(TOPIC, b"u"))
        broker = cluster.brokers[0]
        await eventually(lambda: stats(broker)["rolled_back"] == 1)
    assert result.local_transaction_state is UNKNOW
    assert real_messages(broker) == []
    assert broker.transactions.ledger.in_flight == 0


async def test_listener_exception_is_unknow_and_checked(cluster: Any) -> None:
    listener = Listener(RuntimeError("db down"), COMMIT)
    async with producer(cluster, listener) as p:
        result = await p.send_message_in_transaction(Message(TOPIC, b"e"))
        await eventually(lambda: len(real_messages(cluster.brokers[0])) == 1)
    assert result.local_transaction_state is UNKNOW


async def test_repeated_unknown_is_discarded_after_check_max(cluster: Any) -> None:
    listener = Listener(UNKNOW, UNKNOW)
    broker = cluster.brokers[0]
    async with producer(cluster, listener) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"d"))
        await eventually(lambda: stats(broker)["discarded"] == 1)
    counts = [m.properties[pm.TRANSACTION_CHECK_TIMES] for m in listener.checked]
    assert counts == [str(i) for i in range(1, CHECK_MAX + 1)]
    assert real_messages(broker) == []
    assert len(real_messages(broker, pm.TRANS_CHECK_MAX_TIME_TOPIC)) == 1


async def test_immunity_time_delays_the_first_check(cluster: Any) -> None:
    listener = Listener(UNKNOW, COMMIT)
    async with producer(cluster, listener) as p:
        sent = time.monotonic()
        message = Message(TOPIC, b"i", properties={pm.CHECK_IMMUNITY_TIME_IN_SECONDS: "1"})
        await p.send_message_in_transaction(message)
        await eventually(lambda: len(real_messages(cluster.brokers[0])) == 1)
    assert listener.check_times[0] - sent >= 0.95  # not at transactionTimeOut (0.3 s)


async def test_lost_end_transaction_is_settled_by_the_check(cluster: Any) -> None:
    listener = Listener(COMMIT, COMMIT)
    async with producer(cluster, listener) as p:
        real_end = p._end_oneway
        dropped: list[int] = []

        async def lossy(addr: str, fields: dict[str, str], remark: str | None) -> None:
            if fields["fromTransactionCheck"] != "true":
                dropped.append(int(fields["commitOrRollback"]))  # the network ate it
                return
            await real_end(addr, fields, remark)

        p._end_oneway = lossy  # type: ignore[method-assign]
        await p.send_message_in_transaction(Message(TOPIC, b"l"))
        await eventually(lambda: len(real_messages(cluster.brokers[0])) == 1)
    assert dropped == [pm.SysFlag.COMMIT]
    assert len(listener.checked) == 1


async def test_crashed_producer_is_replaced_by_another_of_the_group(cluster: Any) -> None:
    first = producer(cluster, Listener(UNKNOW, UNKNOW), "crashing")
    other_listener = Listener(COMMIT, COMMIT)
    broker = cluster.brokers[0]
    async with producer(cluster, other_listener, "survivor") as survivor:
        await first.start()
        await first.send_message_in_transaction(Message(TOPIC, b"x"))
        await survivor.publish_info(TOPIC)  # learns the broker, so it heartbeats there
        await eventually(lambda: len(broker.clients.producer_channels(GROUP)) == 2)
        # A crash: the sockets close, nobody unregisters.
        await first.instance.remoting.close()
        await eventually(lambda: len(real_messages(broker)) == 1)
        with contextlib.suppress(Exception):
            await first.shutdown()
    assert len(other_listener.checked) >= 1
    assert len(real_messages(broker)) == 1


async def test_no_live_producer_then_discarded(cluster: Any) -> None:
    broker = cluster.brokers[0]
    async with producer(cluster, Listener(UNKNOW)) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"n"))
    await eventually(lambda: stats(broker)["discarded"] == 1)
    assert stats(broker)["check_no_producer"] == CHECK_MAX
    assert stats(broker)["checked"] == 0


async def end_raw(
    client: RemotingClient, addr: str, half: Any, action: int, group: str = GROUP
) -> RemotingCommand:
    """END_TRANSACTION as the C++ client sends it (a request, "0"/"1" booleans)."""
    _h, _p, offset = pm.decode_offset_msg_id(half.send_result.offset_msg_id)
    fields = {
        "producerGroup": group,
        "tranStateTableOffset": str(half.send_result.queue_offset),
        "commitLogOffset": str(offset),
        "commitOrRollback": str(action),
        "fromTransactionCheck": "0",
        "msgId": half.msg_id,
        "transactionId": half.msg_id,
    }
    cmd = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=fields, language="CPP")
    return await client.invoke(addr, cmd, 5_000)


async def test_double_commit_stores_once_and_commit_after_rollback_is_refused(
    cluster: Any,
) -> None:
    broker = cluster.brokers[0]
    client = RemotingClient()
    try:
        async with producer(cluster, Listener(COMMIT)) as p:
            committed = await p.send_half(Message(TOPIC, b"twice"))
            rolled = await p.send_half(Message(TOPIC, b"never"))
            await p.end_transaction(committed, COMMIT)
            await p.end_transaction(rolled, ROLLBACK)
            await eventually(lambda: stats(broker)["rolled_back"] == 1)
            again = await end_raw(client, broker.address, committed, pm.SysFlag.COMMIT)
            assert again.code == ResponseCode.SUCCESS
            late = await end_raw(client, broker.address, rolled, pm.SysFlag.COMMIT)
            assert late.code == ResponseCode.TRANSACTION_FAILED
            assert "ROLLED_BACK" in (late.remark or "")
            wrong = await end_raw(client, broker.address, committed, pm.SysFlag.ROLLBACK, "PG_X")
            assert (wrong.code, wrong.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "The producer group wrong",
            )
    finally:
        await client.close()
    assert [m.body for m in real_messages(broker)] == [b"twice"]
    assert stats(broker)["duplicate_answers"] == 1


async def test_broker_restart_with_halves_in_flight(cluster: Any) -> None:
    listener = Listener(UNKNOW, UNKNOW)
    async with producer(cluster, listener) as p:
        for i in range(3):
            await p.send_message_in_transaction(Message(TOPIC, b"h%d" % i))
        await eventually(lambda: len(listener.checked) >= 1)
        broker = await cluster.restart_broker(0, **SETTINGS)
        assert broker.transactions.ledger.in_flight == 3
        listener.checks = [COMMIT]
        await p.instance.heartbeat()  # re-register with the new broker process at once
        await eventually(lambda: len(real_messages(broker)) == 3)
    assert sorted(m.body for m in real_messages(broker)) == [b"h0", b"h1", b"h2"]
    assert broker.transactions.ledger.in_flight == 0


async def test_flush_timeout_status_means_rollback_without_the_listener(cluster: Any) -> None:
    listener = Listener(COMMIT)
    async with producer(cluster, listener) as p:
        original = p._send_with_retries

        async def slow_disk(topic: str, prepared: Any, **kw: Any) -> Any:
            result = await original(topic, prepared, **kw)
            return dataclasses.replace(result, status=SendStatus.FLUSH_DISK_TIMEOUT)

        p._send_with_retries = slow_disk  # type: ignore[method-assign]
        result = await p.send_message_in_transaction(Message(TOPIC, b"f"))
    assert result.local_transaction_state is ROLLBACK
    assert listener.executed == []
    await eventually(lambda: stats(cluster.brokers[0])["rolled_back"] == 1)


async def test_failed_half_send_raises_as_send_does_without_the_listener(cluster: Any) -> None:
    # A real refusal: the broker is configured to reject transactional messages. `send` raises
    # such a refusal, so send_message_in_transaction does too (issue 16): a caller that only
    # looked at local_transaction_state used to see ROLLBACK_MESSAGE and carry on.
    broker = await cluster.restart_broker(0, **SETTINGS, rejectTransactionMessage="true")
    listener = Listener(COMMIT)
    async with producer(cluster, listener) as p:
        with pytest.raises(NoPermissionError) as refused:
            await p.send_message_in_transaction(Message(TOPIC, b"x"))
        assert refused.value.response_code == ResponseCode.NO_PERMISSION
        # The step API still reports it, for callers that retry or decide themselves.
        half = await p.send_half(Message(TOPIC, b"y"))
        assert half.send_result is None
        assert isinstance(half.error, NoPermissionError)

    def blocking() -> None:
        with BlockingTransactionProducer(GROUP, cluster.namesrv_addr, listener=listener) as b:
            b.send_message_in_transaction(Message(TOPIC, b"z"))

    with pytest.raises(NoPermissionError):
        await asyncio.to_thread(blocking)
    assert listener.executed == []
    assert stats(broker)["prepared"] == 0


async def test_blocking_producer_runs_the_listener_in_the_calling_thread(cluster: Any) -> None:
    threads: list[int] = []

    class ThreadListener(Listener):
        def execute_local_transaction(self, message: Message, arg: Any) -> Any:
            threads.append(threading.get_ident())
            return COMMIT

    def run() -> LocalTransactionState:
        with BlockingTransactionProducer(
            GROUP, cluster.namesrv_addr, listener=ThreadListener(COMMIT)
        ) as p:
            threads.append(threading.get_ident())
            return p.send_message_in_transaction(Message(TOPIC, b"b")).local_transaction_state

    assert await asyncio.to_thread(run) is COMMIT
    assert threads[0] == threads[1]
    await eventually(lambda: len(real_messages(cluster.brokers[0])) == 1)


async def test_tx_list_and_stats_cli(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    async with producer(cluster, Listener(UNKNOW)) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"v", keys="order-42"))
        addr = cluster.brokers[0].address
        assert await asyncio.to_thread(cli_main, ["tx", "list", "-b", addr]) == 0
        listing = capsys.readouterr().out
        assert await asyncio.to_thread(cli_main, ["tx", "stats", "-n", cluster.namesrv_addr]) == 0
        stats_out = capsys.readouterr().out
    assert "order-42" in listing
    assert TOPIC in listing
    assert GROUP in listing
    assert "1 in flight" in listing
    header, row = stats_out.splitlines()[:2]
    assert header.split()[1:4] == ["PREPARED", "COMMITTED", "ROLLED_BACK"]
    assert row.split()[1] == "1"


async def test_raw_frames_of_the_flow_use_the_spec_field_names(cluster: Any) -> None:
    """What a Java TransactionMQProducer sends, spelled field by field (remoting.md §4.1, §4.11)."""
    checks: list[RemotingCommand] = []
    got_check = asyncio.Event()

    async def on_check(_c: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        checks.append(cmd)
        got_check.set()
        return None

    handlers = HandlerTable()
    handlers.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    client = RemotingClient(handlers)
    broker = cluster.brokers[0]
    addr = broker.address
    try:
        heartbeat = HeartbeatData(
            client_id="127.0.0.1@raw", producer_data_set=[ProducerData(GROUP)]
        )
        hb = await client.invoke(
            addr, RemotingCommand(code=RequestCode.HEART_BEAT, body=heartbeat.to_json()), 5_000
        )
        assert hb.code == ResponseCode.SUCCESS
        props = f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02UNIQ_KEY\x01RAWKEY1\x02WAIT\x01true\x02"
        send_fields = {
            "a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "4",
            "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false",
        }  # fmt: skip
        cmd = RemotingCommand(
            code=RequestCode.SEND_MESSAGE_V2, ext_fields=send_fields, body=b"raw", language="JAVA"
        )
        sent = await client.invoke(addr, cmd, 5_000)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        assert {"msgId", "queueId", "queueOffset"} <= set(sent.ext_fields)
        assert sent.ext_fields["queueId"] == "0"
        assert real_messages(broker) == []
        # No END_TRANSACTION: the broker checks back on our connection.
        await asyncio.wait_for(got_check.wait(), 10)
        check = checks[0]
        assert check.flag & FLAG_ONEWAY
        assert set(check.ext_fields) >= {
            "tranStateTableOffset", "commitLogOffset", "msgId", "transactionId", "offsetMsgId",
        }  # fmt: skip
        assert check.ext_fields["msgId"] == check.ext_fields["transactionId"] == "RAWKEY1"
        body = rec.decode_record(check.body)
        assert (body.topic, body.queue_id, body.body) == (TOPIC, 0, b"raw")
        assert str(body.physical_offset) == check.ext_fields["commitLogOffset"]
        end_fields = {
            "producerGroup": GROUP,
            "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
            "commitLogOffset": check.ext_fields["commitLogOffset"],
            "commitOrRollback": "8",
            "fromTransactionCheck": "true",
            "msgId": "RAWKEY1",
            "transactionId": check.ext_fields["transactionId"],
        }
        end = RemotingCommand(
            code=RequestCode.END_TRANSACTION, ext_fields=end_fields, language="JAVA"
        )
        await client.invoke_oneway(addr, end)
        await eventually(lambda: len(real_messages(broker)) == 1)
        (real,) = real_messages(broker)
        assert real.body == b"raw"
        assert pm.SysFlag.transaction_type(real.sys_flag) == pm.SysFlag.COMMIT
        listing = await client.invoke(addr, RemotingCommand(code=RequestCode.TIDEMQ_TX_LIST), 5_000)
        assert orjson.loads(listing.body)["inFlight"] == 0
    finally:
        await client.close()
