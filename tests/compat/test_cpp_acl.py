"""The official C++ client (PyPI `rocketmq` 0.4.4) with `set_session_credentials` against
`tidemq dev --acl-file`: ACL on for the name server and the broker, the broker registering with
the file's admin account. The client is unmodified; where its signature and ours disagreed, the
client would be right.

Transactions are not covered here: the 0.4.4 wheel's C API has no transactional producer
(librocketmq.so exports no CreateTransactionProducer), so no unmodified C++ client can send one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_servers import (
    TideMQServer,
    dev_server,
    unique,
)

pytestmark = pytest.mark.compat

# Example keys, made up for this test.
APP_KEY = ("cppAppKey", "cppAppSecret-example")
ADMIN_KEY = ("cppAdminKey", "cppAdminSecret-example")
TOPIC = "AclCppTopic"
REFUSAL_WAIT_S = 20.0  # A C++ consumer's first heartbeat and pulls after it starts.
GROUP = "AclCppGroup"
# Producer groups are checked too (a heartbeat's producer group may not be DENY).
PRODUCER_GROUP = "AclCppProducers"

ACL_YAML = f"""\
accounts:
  - accessKey: {APP_KEY[0]}
    secretKey: {APP_KEY[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - {TOPIC}=PUB|SUB
      - ReadOnlyTopic=SUB
    groupPerms:
      - {GROUP}=SUB
      - {PRODUCER_GROUP}=PUB
  - accessKey: {ADMIN_KEY[0]}
    secretKey: {ADMIN_KEY[1]}
    admin: true
"""


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[TideMQServer]:
    work_dir = tmp_path / "server"
    work_dir.mkdir()
    acl_file = work_dir / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    # The broker registers signed with the file's admin account, and so do the tests' own
    # name-server queries.
    with dev_server(work_dir, {}, ["--acl-file", str(acl_file)], ADMIN_KEY) as server:
        yield server


@pytest.fixture
def tidemq(acl_server: TideMQServer) -> TideMQServer:
    """The server conftest's `cpp` fixture drives: the ACL one."""
    return acl_server


@pytest.fixture
def cpp_acl(cpp: Any) -> Any:
    """conftest's CppClients (killed at teardown), every driver signing with APP_KEY."""
    cpp.credentials = APP_KEY
    return cpp


def more_clients(cpp: Any, work_dir: Path, credentials: tuple[str, str]) -> Any:
    """Another CppClients on the same server, signing with `credentials` (the caller kills
    its clients)."""
    return type(cpp)(cpp.server, work_dir, credentials=credentials)


def test_cpp_producer_and_push_consumer_work_with_credentials(
    cpp_acl: Any, acl_server: TideMQServer
) -> None:
    producer = cpp_acl.producer(PRODUCER_GROUP)
    sent = [producer.send(TOPIC, f"acl-{i}") for i in range(5)]
    for event in sent:
        assert event["event"] == "sent", f"{event}\n{producer.diagnostics()}"
        assert event["status"] == 0
    consumer = cpp_acl.push(GROUP, TOPIC)
    consumer.wait_for(
        lambda events: (
            {e["body"] for e in events if e["event"] == "received"}
            >= {f"acl-{i}" for i in range(5)}
        ),
        30.0,
        "all five messages",
    )
    consumer.stop()
    producer.stop()
    assert "ACL refused" not in acl_server.logs()


def send_refused(producer: Any, topic: str) -> dict[str, Any]:
    """A sync send expected to fail: the driver's "error" event."""
    event: dict[str, Any] = producer.result(
        producer.request({"op": "send", "mode": "sync", "topic": topic, "body": "nope"})
    )
    assert event["event"] == "error", f"{event}\n{producer.diagnostics()}"
    return event


def test_cpp_producer_is_refused_a_topic_without_pub(
    cpp_acl: Any, acl_server: TideMQServer
) -> None:
    producer = cpp_acl.producer(PRODUCER_GROUP)
    send_refused(producer, "ReadOnlyTopic")
    producer.stop()
    assert "No permission for topic:ReadOnlyTopic: accessKey=cppAppKey needs PUB" in (
        acl_server.logs()
    )


def test_cpp_producer_with_a_wrong_secret_is_refused(
    cpp_acl: Any, acl_server: TideMQServer, tmp_path: Path
) -> None:
    clients = more_clients(cpp_acl, tmp_path / "cpp-wrong", (APP_KEY[0], "wrong-one"))
    try:
        producer = clients.producer(unique("PG"))
        send_refused(producer, TOPIC)
        producer.stop()
    finally:
        for client in clients.clients:
            client.kill()
    assert "Check signature failed for accessKey=cppAppKey" in acl_server.logs()


def test_cpp_push_consumer_with_a_wrong_secret_gets_nothing(
    cpp_acl: Any, acl_server: TideMQServer, tmp_path: Path
) -> None:
    wrong = more_clients(cpp_acl, tmp_path / "cpp-bad", (APP_KEY[0], "wrong-two"))
    try:
        producer = cpp_acl.producer(unique("PG"))
        assert producer.send(TOPIC, "secret-data")["status"] == 0
        consumer = wrong.push(GROUP, TOPIC)
        # Its heartbeats and pulls are answered with the refusal, never with messages.
        deadline = time.monotonic() + REFUSAL_WAIT_S
        while "Check signature failed for accessKey=cppAppKey" not in acl_server.logs():
            assert time.monotonic() < deadline, acl_server.logs()
            time.sleep(0.1)
        assert consumer.received() == []
        consumer.stop()
        producer.stop()
    finally:
        for client in wrong.clients:
            client.kill()
