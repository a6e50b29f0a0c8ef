"""TideMQ's own clients and CLI against a broker with aclEnable=true: accounts allowed through,
refused with the code and remark that say what is missing, a wrong secret and an unknown or absent
key refused at the signature. A real name server and broker on loopback, a real plain_acl.yml."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tidemq import (
    Admin,
    ConsumeFromWhere,
    Credentials,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
    TransactionProducer,
)
from tidemq.cli.main import main as cli_main
from tidemq.errors import BrokerError
from tidemq.protocol.codes import ResponseCode
from tidemq.testing import LocalCluster, eventually, local_cluster
from tidemq.testing.wait import eventually_async

ADMIN = Credentials("tidemq-admin", "admin-secret-1")
APP = Credentials("orders-app", "orders-secret-1")
WRONG = Credentials("orders-app", "not-the-secret")
UNKNOWN = Credentials("nobody-at-all", "whatever-secret")
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET

PLAIN_ACL = """\
accounts:
  - accessKey: tidemq-admin
    secretKey: admin-secret-1
    admin: true
  - accessKey: orders-app
    secretKey: orders-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB|SUB
      - Audit=SUB
    groupPerms:
      - orders-consumers=SUB
      - orders-tx=PUB
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    settings = {"aclEnable": "true", "aclFilePath": str(acl_file)}
    async with local_cluster(tmp_path / "cluster", broker_settings=settings) as running:
        async with Admin(running.namesrv_addr, credentials=ADMIN) as admin:
            for topic in ("Orders", "Audit"):
                await admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)

                async def routed(topic: str = topic) -> bool:
                    try:
                        await admin.topic_route(topic)
                    except BrokerError:
                        return False
                    return True

                await eventually_async(routed, what=f"a route for {topic}")
        yield running


def producer(cluster: LocalCluster, credentials: Credentials | None, **options: Any) -> Producer:
    return Producer("orders-producers", cluster.namesrv_addr, credentials=credentials, **options)


async def pull_all(cluster: LocalCluster, topic: str, credentials: Credentials) -> list[bytes]:
    bodies: list[bytes] = []
    async with PullConsumer("orders-consumers", cluster.namesrv_addr, credentials=credentials) as c:
        for queue in await c.fetch_subscribe_message_queues(topic):
            result = await c.pull(queue, "*", 0, 32)
            if result.status is PullStatus.FOUND:
                bodies += [m.body for m in result.messages]
    return sorted(bodies)


async def test_an_allowed_account_produces_and_consumes(cluster: LocalCluster) -> None:
    async with producer(cluster, APP) as p:
        results = [await p.send(Message("Orders", b"order-%d" % n)) for n in range(4)]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "orders-consumers",
        cluster.namesrv_addr,
        consume_from_where=FIRST,
        rebalance_interval_ms=200,
        credentials=APP,
    )
    consumer.subscribe("Orders", "*")
    consumer.register_listener(got.extend)
    await consumer.start()
    try:
        await eventually(lambda: len(got) == 4, what="four messages consumed")
    finally:
        await consumer.shutdown()
    assert sorted(m.body for m in got) == [b"order-%d" % n for n in range(4)]


async def test_a_topic_without_pub_is_refused_no_permission_naming_it(
    cluster: LocalCluster,
) -> None:
    async with producer(cluster, APP, retry_times=0) as p:
        with pytest.raises(BrokerError) as refused:
            await p.send(Message("Audit", b"not mine to write"))
    assert refused.value.response_code == ResponseCode.NO_PERMISSION
    assert type(refused.value).__name__ == "NoPermissionError"
    assert "No permission for topic:Audit" in refused.value.remark
    assert "orders-app" in refused.value.remark
    assert "PUB" in refused.value.remark
    assert await pull_all(cluster, "Audit", APP) == []  # nothing was stored


@pytest.mark.parametrize(
    ("credentials", "remark"),
    [
        (WRONG, "Check signature failed for accessKey=orders-app"),
        (UNKNOWN, "No acl config for nobody-at-all"),
        (None, "No accessKey is configured"),
    ],
    ids=["wrong-secret", "unknown-key", "unsigned"],
)
async def test_a_request_that_does_not_authenticate_is_refused(
    cluster: LocalCluster, credentials: Credentials | None, remark: str
) -> None:
    async with producer(cluster, credentials, retry_times=0) as p:
        with pytest.raises(BrokerError) as refused:
            await p.send(Message("Orders", b"forged"))
    assert refused.value.response_code == ResponseCode.SYSTEM_ERROR
    assert remark in refused.value.remark
    assert "not-the-secret" not in str(refused.value)
    assert await pull_all(cluster, "Orders", APP) == []


async def test_admin_codes_need_an_admin_account(cluster: LocalCluster) -> None:
    async with Admin(cluster.namesrv_addr, credentials=APP) as admin:
        with pytest.raises(BrokerError) as refused:
            await admin.create_topic("Payments")
    assert refused.value.response_code == ResponseCode.NO_PERMISSION
    assert "Need admin permission" in refused.value.remark
    assert "accessKey=orders-app" in refused.value.remark


async def test_a_push_consumer_of_a_group_it_may_not_use_gets_nothing(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with producer(cluster, APP) as p:
        await p.send(Message("Orders", b"for orders-consumers only"))
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "other-group",
        cluster.namesrv_addr,
        consume_from_where=FIRST,
        rebalance_interval_ms=200,
        credentials=APP,
    )
    consumer.subscribe("Orders", "*")
    consumer.register_listener(got.extend)
    caplog.set_level(logging.WARNING)
    await consumer.start()
    try:
        await eventually(
            lambda: "No permission for group:other-group" in caplog.text,
            what="the broker's refusal of other-group, logged by the client",
        )
    finally:
        await consumer.shutdown()
    assert got == []


class _Commit:
    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> Any:
        return LocalTransactionState.COMMIT_MESSAGE


async def test_transactions_with_credentials(cluster: LocalCluster) -> None:
    tx = TransactionProducer("orders-tx", cluster.namesrv_addr, listener=_Commit(), credentials=APP)
    async with tx:
        result = await tx.send_message_in_transaction(Message("Orders", b"committed"))
    assert result.send_result is not None
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

    async def committed() -> bool:
        return await pull_all(cluster, "Orders", APP) == [b"committed"]

    # END_TRANSACTION is oneway: the commit shows as the message becoming readable.
    await eventually_async(committed, what="the signed END_TRANSACTION applied")

    forged = TransactionProducer(
        "orders-tx", cluster.namesrv_addr, listener=_Commit(), credentials=WRONG, retry_times=0
    )
    async with forged:
        with pytest.raises(BrokerError) as refused:
            await forged.send_message_in_transaction(Message("Orders", b"forged half"))
    assert "Check signature failed for accessKey=orders-app" in refused.value.remark


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(cli_main, list(argv))


async def test_cli_send_and_consume_with_an_access_key(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TIDEMQ_ACCESS_KEY", raising=False)
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", APP.secret_key)
    ns = ["-n", cluster.namesrv_addr]
    assert (
        await cli("send", *ns, "-t", "Orders", "-b", "from-cli", "--access-key", "orders-app") == 0
    )
    assert "SEND_OK" in capsys.readouterr().out
    consume = ["consume", *ns, "-t", "Orders", "-g", "orders-consumers", "--count", "1"]
    assert await cli("--access-key", "orders-app", *consume) == 0
    assert "from-cli" in capsys.readouterr().out

    monkeypatch.delenv("TIDEMQ_SECRET_KEY")
    assert await cli("send", *ns, "-t", "Orders", "-b", "unsigned") == 1
    err = capsys.readouterr().err
    assert "SYSTEM_ERROR (1)" in err
    assert "No accessKey is configured" in err
    assert await cli(*consume, "--access-key", "orders-app", "--secret-key", "bad-secret") == 1
    err = capsys.readouterr().err
    assert "Check signature failed for accessKey=orders-app" in err
    assert "bad-secret" not in err
