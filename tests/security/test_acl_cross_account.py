"""Account against account on a live ACL broker (real TCP, our raw RemotingClient and our
clients with credentials): what one account may not do to another's data (view, send back,
commit or roll back, end a sink batch, lock, read system topics or figures), beside the
allowed counterparts; and the table that every code the broker serves is covered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from acl_samples import send_command

from tidemq import Message
from tidemq.broker.app import BrokerApp
from tidemq.client.transaction import HalfSend, LocalTransactionState, TransactionProducer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_tx import end_transaction_fields
from tidemq.protocol.message import SPARK_TXN, SysFlag
from tidemq.protocol.message_id import physical_offset_of
from tidemq.protocol.names import RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC_XXXX
from tidemq.remoting.client import RemotingClient
from tidemq.security.resources import (
    BROKER_ADMIN_CODES,
    BROKER_RESOURCES,
    HANDLER_CHECKED,
    SIGNATURE_ONLY,
)
from tidemq.security.signing import Credentials, sign
from tidemq.testing.cluster import LocalCluster, local_cluster
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration

TIMEOUT_MS = 5_000
ADMIN = Credentials("adminAK01", "adminSK-example")
OWNER = Credentials("ownerAK01", "ownerSK-example")
# Signs and owns a topic and groups of its own, none of OWNER's.
THIEF = Credentials("thiefAK01", "thiefSK-example")
# PUB|SUB by default on every topic and group: still no system topic.
BROAD = Credentials("broadAK01", "broadSK-example")

ACL_YAML = f"""\
accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: {OWNER.access_key}
    secretKey: {OWNER.secret_key}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Secret=PUB|SUB
      - Other=PUB|SUB
    groupPerms:
      - OwnerG=SUB
      - OwnerPG=PUB
  - accessKey: {THIEF.access_key}
    secretKey: {THIEF.secret_key}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Mine=PUB|SUB
    groupPerms:
      - ThiefG=SUB
      - ThiefPG=PUB
      - OwnerPG=PUB
  - accessKey: {BROAD.access_key}
    secretKey: {BROAD.secret_key}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    inner = json.dumps({"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key})
    settings = {
        "aclEnable": "true",
        "aclFilePath": str(acl_path),
        "innerClientAuthenticationCredentials": inner,
        # No check-back during a test: the transactions stay as the test leaves them.
        "transactionTimeOut": "600000",
    }
    async with local_cluster(tmp_path / "cluster", broker_settings=settings) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    remoting = RemotingClient()
    yield remoting
    await remoting.close()


async def call(
    client: RemotingClient, cluster: LocalCluster, cmd: RemotingCommand, credentials: Credentials
) -> RemotingCommand:
    sign(cmd, credentials)
    return await client.invoke(cluster.broker_addr, cmd, TIMEOUT_MS)


def command(code: int, body: bytes = b"", **fields: str) -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields=dict(fields), body=body)


def refused(answer: RemotingCommand, *hidden: str) -> None:
    """NO_PERMISSION, with no body, and a remark naming none of `hidden`."""
    assert answer.code == ResponseCode.NO_PERMISSION, (answer.code, answer.remark)
    assert not answer.body
    for text in hidden:
        assert text not in (answer.remark or "")


async def stored_offset(client: RemotingClient, cluster: LocalCluster, body: bytes) -> int:
    """OWNER sends `body` to Secret; the record's commit-log offset."""
    answer = await call(client, cluster, send_command("Secret", body), OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return physical_offset_of(answer.ext_fields["msgId"])


# -- every code is covered ------------------------------------------------------------------


async def test_every_code_the_broker_serves_is_admin_resource_checked_or_listed(
    cluster: LocalCluster,
) -> None:
    served = cluster.brokers[0].server.handlers.codes()
    assert RequestCode.VIEW_MESSAGE_BY_ID in served  # the table is the broker's own
    uncovered = [
        RequestCode(code).name
        for code in served
        if code not in BROKER_ADMIN_CODES
        and code not in BROKER_RESOURCES
        and code not in HANDLER_CHECKED
        and code not in SIGNATURE_ONLY
    ]
    assert uncovered == []


# -- messages of another account ------------------------------------------------------------


async def test_view_by_offset_needs_sub_on_the_records_topic(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    offset = await stored_offset(client, cluster, b"TOP-SECRET-BODY")
    view = command(RequestCode.VIEW_MESSAGE_BY_ID, offset=str(offset))
    refused(await call(client, cluster, view, THIEF), "Secret")
    view = command(RequestCode.VIEW_MESSAGE_BY_ID, offset=str(offset))
    answer = await call(client, cluster, view, OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert b"TOP-SECRET-BODY" in answer.body


async def test_send_back_needs_sub_on_the_stored_messages_topic(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    broker = cluster.brokers[0]
    offset = await stored_offset(client, cluster, b"TOP-SECRET-BODY")

    def send_back(group: str, origin_topic: str) -> RemotingCommand:
        return command(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            offset=str(offset),
            group=group,
            delayLevel="-1",
            originTopic=origin_topic,
        )

    # THIEF names its own topic and group: the message is still OWNER's.
    refused(await call(client, cluster, send_back("ThiefG", "Mine"), THIEF), "Secret")
    assert broker.store.max_offset("%DLQ%ThiefG", 0) == 0
    # OWNER may, but not under another topic than the message's.
    answer = await call(client, cluster, send_back("OwnerG", "Other"), OWNER)
    refused(answer)
    answer = await call(client, cluster, send_back("OwnerG", "Secret"), OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert broker.store.max_offset("%DLQ%OwnerG", 0) == 1


def end_fields(group: str, half: HalfSend, commit_or_rollback: int) -> dict[str, str]:
    send = half.send_result
    assert send is not None
    return end_transaction_fields(
        group,
        send.queue_offset,
        physical_offset_of(send.offset_msg_id),
        commit_or_rollback,
        half.msg_id,
        None,
    )


def committed(broker: BrokerApp, topic: str) -> int:
    return sum(broker.store.max_offset(topic, queue_id) for queue_id in range(8))


async def test_end_transaction_needs_pub_on_the_halfs_real_topic(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    broker = cluster.brokers[0]
    async with TransactionProducer(
        "OwnerPG", cluster.namesrv_addr, listener=None, credentials=OWNER
    ) as producer:
        half = await producer.send_half(Message("Secret", b"pending"))
        assert half.send_result is not None
        for group in ("OwnerPG", "ThiefPG"):
            for decision in (SysFlag.COMMIT, SysFlag.ROLLBACK):
                end = RemotingCommand(
                    code=RequestCode.END_TRANSACTION,
                    ext_fields=end_fields(group, half, decision),
                )
                # The same refusal whatever the group: it tells no producer group and no topic.
                answer = await call(client, cluster, end, THIEF)
                assert (answer.code, answer.remark) == (
                    ResponseCode.NO_PERMISSION,
                    "No permission for the transaction's topic: accessKey=thiefAK01 needs PUB",
                )
        assert broker.transactions.ledger.in_flight == 1
        await producer.end_transaction(half, LocalTransactionState.COMMIT_MESSAGE)
        await eventually(lambda: committed(broker, "Secret") == 1)


async def test_end_batch_needs_pub_on_the_batchs_halves(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    broker = cluster.brokers[0]
    async with TransactionProducer(
        "OwnerPG", cluster.namesrv_addr, listener=None, credentials=OWNER
    ) as producer:
        half = await producer.send_half(
            Message("Secret", b"sink row", properties={SPARK_TXN: "sinkA/1/0/0"})
        )
        assert half.send_result is not None
    await eventually(lambda: broker.sink_batches.index.pending("sinkA", 1) != {})

    def end_batch(decision: int) -> RemotingCommand:
        return command(
            RequestCode.TIDEMQ_END_BATCH,
            json.dumps({"txns": ["0/0"]}).encode(),
            sinkId="sinkA",
            batchId="1",
            commitOrRollback=str(decision),
        )

    for decision in (SysFlag.COMMIT, SysFlag.ROLLBACK):
        refused(await call(client, cluster, end_batch(decision), THIEF), "Secret")
    assert broker.sink_batches.lookup("sinkA", 1) is None  # nothing recorded
    assert broker.sink_batches.index.pending("sinkA", 1) != {}
    answer = await call(client, cluster, end_batch(SysFlag.COMMIT), OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert answer.ext_fields["committed"] == "1"
    assert committed(broker, "Secret") == 1


async def test_lock_and_unlock_need_sub_on_the_bodys_group(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    broker_name = cluster.brokers[0].config.broker_name

    def body(group: str) -> bytes:
        mq = {"topic": "Secret", "brokerName": broker_name, "queueId": 0}
        return json.dumps({"consumerGroup": group, "clientId": "c1", "mqSet": [mq]}).encode()

    for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        refused(await call(client, cluster, command(code, body("OwnerG")), THIEF))
    answer = await call(client, cluster, command(RequestCode.LOCK_BATCH_MQ, body("OwnerG")), OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert b"Secret" in answer.body


# -- system topics, figures -----------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd",
    [
        command(RequestCode.GET_MAX_OFFSET, topic=RMQ_SYS_TRANS_HALF_TOPIC, queueId="0"),
        command(RequestCode.GET_MIN_OFFSET, topic=SCHEDULE_TOPIC_XXXX, queueId="0"),
        command(
            RequestCode.PULL_MESSAGE,
            topic=RMQ_SYS_TRANS_HALF_TOPIC,
            consumerGroup="AnyG",
            queueId="0",
            queueOffset="0",
            maxMsgNums="32",
            sysFlag="0",
            commitOffset="0",
            suspendTimeoutMillis="0",
            subVersion="0",
        ),
        send_command("%DLQ%OwnerG"),
        send_command(SCHEDULE_TOPIC_XXXX),
    ],
    ids=["max-offset-half", "min-offset-schedule", "pull-half", "send-dlq", "send-schedule"],
)
async def test_system_topics_are_not_under_default_permissions(
    cluster: LocalCluster, client: RemotingClient, cmd: RemotingCommand
) -> None:
    refused(await call(client, cluster, cmd, BROAD))


async def test_an_admin_reads_system_topics(cluster: LocalCluster, client: RemotingClient) -> None:
    cmd = command(RequestCode.GET_MAX_OFFSET, topic=RMQ_SYS_TRANS_HALF_TOPIC, queueId="0")
    answer = await call(client, cluster, cmd, ADMIN)
    assert answer.code == ResponseCode.SUCCESS, answer.remark


@pytest.mark.parametrize(
    "cmd",
    [
        command(RequestCode.GET_MAX_OFFSET, topic="Secret", queueId="0"),
        command(RequestCode.GET_MIN_OFFSET, topic="Secret", queueId="0"),
        command(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic="Secret", queueId="0", timestamp="0"),
        command(RequestCode.GET_EARLIEST_MSG_STORETIME, topic="Secret", queueId="0"),
        command(RequestCode.GET_TOPIC_STATS_INFO, topic="Secret"),
        command(RequestCode.GET_CONSUME_STATS, consumerGroup="OwnerG"),
        command(RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup="OwnerG"),
        command(RequestCode.TIDEMQ_TX_STATS),
        send_command("%RETRY%OwnerG"),
    ],
    ids=lambda cmd: RequestCode(cmd.code).name + ":" + cmd.ext_fields.get("b", ""),
)
async def test_another_accounts_figures_are_refused(
    cluster: LocalCluster, client: RemotingClient, cmd: RemotingCommand
) -> None:
    refused(await call(client, cluster, cmd, THIEF))


async def test_an_owner_reads_its_own_figures(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    await stored_offset(client, cluster, b"x")
    cmd = command(RequestCode.GET_MAX_OFFSET, topic="Secret", queueId="0")
    answer = await call(client, cluster, cmd, OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert answer.ext_fields["offset"] == "1"


async def test_a_send_to_a_retry_topic_needs_sub_on_the_group(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    # OWNER has SUB (not PUB) on OwnerG: a consumer's retry, as upstream 4.9.
    answer = await call(client, cluster, send_command("%RETRY%OwnerG"), OWNER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark


# -- check-back -----------------------------------------------------------------------------


async def test_check_back_goes_only_to_producers_with_pub_on_the_topic(
    cluster: LocalCluster,
) -> None:
    broker = cluster.brokers[0]
    # THIEF may use the producer group OwnerPG (PUB), but not the topic Secret.
    async with (
        TransactionProducer(
            "OwnerPG", cluster.namesrv_addr, listener=None, credentials=THIEF
        ) as thief,
        TransactionProducer(
            "OwnerPG", cluster.namesrv_addr, listener=None, credentials=OWNER
        ) as owner,
    ):
        await thief.send_half(Message("Mine", b"m"))
        await owner.send_half(Message("Secret", b"s"))
        await eventually(lambda: len(broker.clients.producer_channels("OwnerPG")) == 2)
        keys = {c.access_key for c in broker.clients.producer_channels("OwnerPG")}
        assert keys == {THIEF.access_key, OWNER.access_key}
        to_secret = broker._check_back_producers("OwnerPG", "Secret")
        to_mine = broker._check_back_producers("OwnerPG", "Mine")
    assert len(to_secret) == 1
    assert len(to_mine) == 1
    assert to_secret != to_mine
