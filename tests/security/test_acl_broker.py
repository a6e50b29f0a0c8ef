"""A broker with aclEnable, spoken to over real TCP by our raw RemotingClient with signed
commands (and by our Producer and PushConsumer with credentials): allowed, refused for each
reason, revoked by an edit of plain_acl.yml, and the settings that go with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from acl_samples import ACL_YAML, ADMIN, CONSUMER, PRODUCER, STRANGER, send_command, write_acl

from tidemq import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.broker.app import BrokerApp
from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.security.acl import ACL_RELOAD_INTERVAL_MS
from tidemq.security.signing import Credentials, sign
from tidemq.testing.cluster import LocalCluster, local_cluster
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration

TIMEOUT_MS = 5_000


def inner(credentials: Credentials) -> str:
    return json.dumps({"accessKey": credentials.access_key, "secretKey": credentials.secret_key})


@pytest.fixture
def acl_path(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return path


@pytest.fixture
async def cluster(tmp_path: Path, acl_path: Path) -> AsyncIterator[LocalCluster]:
    settings = {
        "aclEnable": "true",
        "aclFilePath": str(acl_path),
        "innerClientAuthenticationCredentials": inner(ADMIN),
        # Check-backs come fast (the transaction test waits for one).
        "transactionCheckInterval": "100",
        "transactionTimeOut": "300",
    }
    async with local_cluster(tmp_path / "cluster", broker_settings=settings) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    remoting = RemotingClient()
    yield remoting
    await remoting.close()


async def call(
    client: RemotingClient,
    cluster: LocalCluster,
    cmd: RemotingCommand,
    credentials: Credentials | None,
) -> RemotingCommand:
    if credentials is not None:
        sign(cmd, credentials)
    return await client.invoke(cluster.broker_addr, cmd, TIMEOUT_MS)


async def test_a_signed_send_with_pub_is_stored(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    answer = await call(client, cluster, send_command("TopicA"), PRODUCER)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert cluster.brokers[0].store.max_offset("TopicA", 0) == 1


@pytest.mark.parametrize(
    ("credentials", "code", "remark"),
    [
        (None, ResponseCode.SYSTEM_ERROR, "No accessKey is configured"),
        (STRANGER, ResponseCode.SYSTEM_ERROR, "No acl config for strangerAK"),
        (
            Credentials(PRODUCER.access_key, "not-the-secret"),
            ResponseCode.SYSTEM_ERROR,
            "Check signature failed for accessKey=producerAK",
        ),
        (
            PRODUCER,
            ResponseCode.NO_PERMISSION,
            "No permission for topic:TopicC: accessKey=producerAK needs PUB",
        ),
    ],
)
async def test_refused_sends_are_answered_and_store_nothing(
    cluster: LocalCluster,
    client: RemotingClient,
    credentials: Credentials | None,
    code: ResponseCode,
    remark: str,
) -> None:
    answer = await call(client, cluster, send_command("TopicC"), credentials)
    assert (answer.code, answer.remark) == (code, remark)
    assert cluster.brokers[0].store.max_offset("TopicC", 0) == 0
    # The connection stays up: the next, allowed request on it is served.
    answer = await call(client, cluster, send_command("TopicB"), PRODUCER)
    assert answer.code == ResponseCode.SUCCESS


async def test_an_edit_of_the_file_revokes_a_key(
    cluster: LocalCluster, client: RemotingClient, acl_path: Path
) -> None:
    answer = await call(client, cluster, send_command("TopicA"), PRODUCER)
    assert answer.code == ResponseCode.SUCCESS
    acl = cluster.brokers[0].acl
    assert acl is not None
    write_acl(
        acl_path, ACL_YAML.replace(f"accessKey: {PRODUCER.access_key}", "accessKey: renamed01")
    )
    # The reload service polls every ACL_RELOAD_INTERVAL_MS.
    await eventually(lambda: acl.watcher.reloads == 1, 10 * ACL_RELOAD_INTERVAL_MS / 1000)
    answer = await call(client, cluster, send_command("TopicA"), PRODUCER)
    assert (answer.code, answer.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"No acl config for {PRODUCER.access_key}",
    )
    renamed = Credentials("renamed01", PRODUCER.secret_key)
    answer = await call(client, cluster, send_command("TopicA"), renamed)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    # A broken edit keeps the table in force: the renamed key still works, the old one not.
    write_acl(acl_path, "accounts: [")
    await eventually(lambda: acl.watcher.last_error is not None, 10 * ACL_RELOAD_INTERVAL_MS / 1000)
    answer = await call(client, cluster, send_command("TopicA"), renamed)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    answer = await call(client, cluster, send_command("TopicA"), PRODUCER)
    assert (answer.code, answer.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"No acl config for {PRODUCER.access_key}",
    )


async def test_admin_codes_need_an_admin_account(
    cluster: LocalCluster, client: RemotingClient
) -> None:
    fields = {
        "topic": "Created",
        "defaultTopic": "TBW102",
        "readQueueNums": "2",
        "writeQueueNums": "2",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    create = RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=dict(fields))
    answer = await call(client, cluster, create, PRODUCER)
    assert answer.code == ResponseCode.NO_PERMISSION
    assert answer.remark == (
        "Need admin permission for request code=17, but accessKey=producerAK is not"
    )
    assert "Created" not in cluster.brokers[0].topics.names()
    create = RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=dict(fields))
    answer = await call(client, cluster, create, ADMIN)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert "Created" in cluster.brokers[0].topics.names()


async def test_broker_config_shows_no_secret(cluster: LocalCluster, client: RemotingClient) -> None:
    answer = await call(
        client, cluster, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG), CONSUMER
    )
    assert answer.code == ResponseCode.SUCCESS
    text = answer.body.decode()
    assert "innerClientAuthenticationCredentials=<redacted>" in text
    assert ADMIN.secret_key not in text
    assert ADMIN.secret_key not in render_config(cluster.brokers[0].config)
    assert ADMIN.secret_key not in repr(cluster.brokers[0].config)


async def test_our_clients_produce_and_consume_with_credentials(cluster: LocalCluster) -> None:
    got: list[bytes] = []
    async with Producer("GroupA", cluster.namesrv_addr, credentials=PRODUCER) as producer:
        for i in range(3):
            result = await producer.send(Message("TopicB", f"m{i}".encode()))
            assert result.msg_id
        consumer = PushConsumer(
            "GroupA",
            cluster.namesrv_addr,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            credentials=PRODUCER,
        )
        consumer.subscribe("TopicB")
        consumer.register_listener(lambda msgs: got.extend(m.body for m in msgs))
        await consumer.start()
        try:
            await eventually(lambda: len(set(got)) == 3)
        finally:
            await consumer.shutdown()
    assert sorted(set(got)) == [b"m0", b"m1", b"m2"]


async def test_our_producer_is_refused_with_a_wrong_secret(cluster: LocalCluster) -> None:
    wrong = Credentials(PRODUCER.access_key, "not-the-secret")
    async with Producer("GroupA", cluster.namesrv_addr, credentials=wrong, retry_times=0) as p:
        with pytest.raises(Exception, match="Check signature failed"):
            await p.send(Message("TopicB", b"x"))


# -- settings -------------------------------------------------------------------------------


def test_acl_file_defaults_to_beside_broker_conf(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("aclEnable=true\n")
    assert load_broker_config(conf).acl_file_path == tmp_path / "plain_acl.yml"
    with pytest.raises(ConfigError, match="aclFilePath"):
        BrokerConfig(acl_enable=True)


def test_a_slave_with_acl_needs_inner_credentials() -> None:
    with pytest.raises(ConfigError, match="innerClientAuthenticationCredentials"):
        BrokerConfig(
            acl_enable=True,
            acl_file_path=Path("acl.yml"),
            broker_role="SLAVE",
            broker_id=1,
            ha_secret="s" * 16,
        )


@pytest.mark.parametrize(
    "text", ["nope", "[1]", '{"accessKey": "a"}', '{"accessKey": 1, "secretKey": "x"}']
)
def test_bad_inner_credentials_are_refused_without_quoting_them(text: str) -> None:
    with pytest.raises(ConfigError, match="innerClientAuthenticationCredentials") as caught:
        BrokerConfig(inner_client_authentication_credentials=text)
    assert text not in str(caught.value)


def test_a_bad_acl_file_stops_the_broker_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - accessKey: short\n")
    config = BrokerConfig(
        acl_enable=True, acl_file_path=path, store_path_root_dir=tmp_path / "store"
    )
    with pytest.raises(ConfigError, match="line 2"):
        BrokerApp(config, SystemClock())


async def test_a_slave_copies_its_acl_master_with_inner_credentials(
    tmp_path: Path, acl_path: Path
) -> None:
    settings = {
        "aclEnable": "true",
        "aclFilePath": str(acl_path),
        "innerClientAuthenticationCredentials": inner(ADMIN),
    }
    async with local_cluster(tmp_path / "ha", broker_settings=settings, slaves=1) as running:
        master, slave = running.brokers[0], running.slaves[0][0]
        remoting = RemotingClient()
        try:
            create = RemotingCommand(
                code=RequestCode.UPDATE_AND_CREATE_TOPIC,
                ext_fields={
                    "topic": "Replicated",
                    "defaultTopic": "TBW102",
                    "readQueueNums": "2",
                    "writeQueueNums": "2",
                    "perm": "6",
                    "topicFilterType": "SINGLE_TAG",
                    "topicSysFlag": "0",
                    "order": "false",
                },
            )
            sign(create, ADMIN)
            answer = await remoting.invoke(master.address, create, TIMEOUT_MS)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        finally:
            await remoting.close()
        # The slave's GET_ALL_TOPIC_CONFIG (an admin code) is signed with the inner account.
        await eventually(lambda: "Replicated" in slave.topics.names())


class CommitOnCheck:
    """Leaves the local transaction UNKNOW; answers the broker's check-back COMMIT."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message.msg_id)
        return LocalTransactionState.COMMIT_MESSAGE


def committed(broker: BrokerApp, topic: str) -> int:
    return sum(broker.store.max_offset(topic, queue_id) for queue_id in range(8))


async def test_our_transaction_producer_commits_directly_and_on_check_back(
    cluster: LocalCluster,
) -> None:
    broker = cluster.brokers[0]
    listener = CommitOnCheck()
    async with TransactionProducer(
        "GroupA", cluster.namesrv_addr, listener=listener, credentials=PRODUCER
    ) as producer:
        # Half (SEND_MESSAGE_V2, PUB on TopicB) then END_TRANSACTION, both signed.
        half = await producer.send_half(Message("TopicB", b"direct"))
        await producer.end_transaction(half, LocalTransactionState.COMMIT_MESSAGE)
        await eventually(lambda: committed(broker, "TopicB") == 1)
        # UNKNOW: the broker checks back (its request to us is not ours to sign), and our
        # answer, a oneway END_TRANSACTION, is signed and accepted.
        result = await producer.send_message_in_transaction(Message("TopicB", b"checked"))
        assert result.local_transaction_state is LocalTransactionState.UNKNOW
        await eventually(lambda: committed(broker, "TopicB") == 2)
    assert listener.checked
