"""The official C++ client against a replicated group (issue 13): the slave serves when the
master is gone, and producers move to the other group.

    namesrv ── broker-a master (SYNC_MASTER) ──HA──▶ broker-a slave (brokerId 1)
           └── broker-b master (ASYNC_MASTER, no slave)

One topic on both groups, one C++ push consumer and one C++ producer, all unmodified:
1. `before` messages are consumed, and the consumer's offsets reach the slave (its metadata copy
   from the master): these must never be delivered again.
2. The consumer is frozen (SIGSTOP); `during` messages are sent and acknowledged (on group a: by
   the slave too, SYNC_MASTER); broker-a's master is killed with SIGKILL; the consumer thaws.
3. `after` messages are sent: the producer must get them into group b (the slave refuses sends).
4. The consumer must receive every message of the three sets, group a's `during` share from the
   slave, and commit its offsets there. The only duplicates allowed are `during` messages.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_servers import (
    SMALL_SEGMENTS,
    TideMQServer,
    query_route,
    set_flags,
    spawn,
    stop_server,
    wait_for_port,
    wait_for_route,
)

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode
from tidemq.testing.processes import free_broker_port, free_port

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

QUEUES = 4
BATCH = 24  # messages in each of the three sets
HA_SECRET = "compat-replication-secret"
# Consumer start, rebalance and delivery; after the kill the C++ client needs its next route
# refresh (every 30 s) to drop the dead master and pull from the slave.
DELIVERY_TIMEOUT_S = 120.0
POLL_S = 0.2  # between two looks at a condition the servers do not announce
SEND_ATTEMPTS = 5  # an `after` send may first pick the dead master's queues


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[TideMQServer, dict[str, int]]]:
    """The three brokers and a name server as separate `tidemq` processes; the ports by role."""
    work_dir = tmp_path / "server"
    work_dir.mkdir()
    namesrv_port = free_port()
    ports = {"a0": free_broker_port(), "a1": free_broker_port(), "b0": free_broker_port()}
    namesrv = spawn(
        "namesrv",
        ["namesrv", "--port", str(namesrv_port), "--data-dir", str(work_dir / "namesrv")],
        work_dir,
    )
    server = TideMQServer(f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{ports['a0']}", [namesrv],
                          work_dir)  # fmt: skip
    roles = {
        "a0": {"brokerName": "broker-a", "brokerRole": "SYNC_MASTER", "haSecret": HA_SECRET},
        "a1": {"brokerName": "broker-a", "brokerRole": "SLAVE", "brokerId": "1",
               "haSecret": HA_SECRET},
        "b0": {"brokerName": "broker-b", "brokerRole": "ASYNC_MASTER"},
    }  # fmt: skip
    try:
        wait_for_port(namesrv_port, server)
        for key, settings in roles.items():
            broker = spawn(
                f"broker-{key}",
                ["broker", "--namesrv-addr", server.namesrv_addr, "--port", str(ports[key]),
                 "--data-dir", str(work_dir / key),
                 *set_flags({**SMALL_SEGMENTS, "brokerIP1": "127.0.0.1", **settings})],
                work_dir,
            )  # fmt: skip
            server.processes.append(broker)
            wait_for_port(ports[key], server)
        wait_for_route(server, "TBW102")
        yield server, ports
    finally:
        stop_server(server)


def _request(addr: str, code: int, fields: dict[str, str]) -> RemotingCommand:
    host, port = addr.rsplit(":", 1)
    request = RemotingCommand(code=code, opaque=7, ext_fields=fields, language="CPP")
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        sock.sendall(encode(request))
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection")
            for frame in decoder.feed(chunk):
                if frame.is_response and frame.opaque == 7:
                    return frame


def _route_ids(server: TideMQServer, topic: str) -> dict[str, set[int]]:
    response = query_route(server.namesrv_addr, topic)
    if response.code != ResponseCode.SUCCESS or not response.body:
        return {}
    route = json.loads(response.body)
    return {
        broker["brokerName"]: {int(i) for i in broker["brokerAddrs"]}
        for broker in route["brokerDatas"]
    }


def _wait(condition: Any, what: str, server: TideMQServer, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout_s}s\n{server.logs()}")
        time.sleep(POLL_S)


def _slave_offsets(addr: str, group: str, topic: str) -> int:
    """The sum over the queues of the consumer offsets the slave holds for `group`."""
    total = 0
    for queue_id in range(QUEUES):
        response = _request(
            addr,
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)},
        )
        if response.code == ResponseCode.SUCCESS:
            total += int(response.ext_fields.get("offset", 0))
    return total


def _send(producer: Any, topic: str, body: str) -> None:
    for _ in range(SEND_ATTEMPTS):
        event = producer.result(producer.request({"op": "send", "mode": "sync", "topic": topic,
                                                  "body": body}))  # fmt: skip
        if event["event"] == "sent" and event["status"] == 0:
            return
    pytest.fail(f"{body} not sent in {SEND_ATTEMPTS} attempts: {event}\n{producer.diagnostics()}")


@pytest.fixture
def tidemq(replicated: tuple[TideMQServer, dict[str, int]]) -> TideMQServer:
    """The server conftest's `cpp` fixture binds its C++ clients to: the replicated cluster."""
    return replicated[0]


def test_push_consumer_moves_to_the_slave_and_producer_to_the_other_group(
    replicated: tuple[TideMQServer, dict[str, int]], cpp: Any
) -> None:
    server, ports = replicated
    topic, group = "CppHaTopic", "CppHaGroup"
    server.create_topic(topic, QUEUES)
    _wait(lambda: _route_ids(server, topic).get("broker-a") == {0, 1}, "slave in route", server)
    consumer = cpp.push(group, topic)
    producer = cpp.producer()
    before = [f"before-{n}" for n in range(BATCH)]
    for body in before:
        _send(producer, topic, body)
    consumer.wait_for(_has(set(before)), DELIVERY_TIMEOUT_S, "the `before` messages")
    # Group a's share of `before` committed by the consumer (every 5 s) and copied to the slave.
    slave_addr = f"127.0.0.1:{ports['a1']}"
    master_a = next(p for p in server.processes if p.name == "broker-a0")
    a_share = _max_offsets(f"127.0.0.1:{ports['a0']}", topic)
    _wait(lambda: _slave_offsets(slave_addr, group, topic) >= a_share, "offsets on the slave",
          server)  # fmt: skip

    # The consumer is frozen while `during` is sent, so group a's share of it is still to be
    # consumed when its master dies: the consumer can only get it from the slave.
    consumer.process.send_signal(signal.SIGSTOP)
    during = [f"during-{n}" for n in range(BATCH)]
    for body in during:
        _send(producer, topic, body)
    a_total = _max_offsets(slave_addr, topic)  # SYNC_MASTER: acknowledged = on the slave
    assert a_total > a_share, "no `during` message went to group a"
    os.kill(master_a.process.pid, signal.SIGKILL)
    master_a.process.wait()
    consumer.process.send_signal(signal.SIGCONT)

    after = [f"after-{n}" for n in range(BATCH)]
    for body in after:
        _send(producer, topic, body)
    everything = set(before) | set(during) | set(after)
    consumer.wait_for(_has(everything), DELIVERY_TIMEOUT_S, "every message after the kill")
    # What the consumer took from the slave it committed there.
    _wait(lambda: _slave_offsets(slave_addr, group, topic) >= a_total, "commits on the slave",
          server)  # fmt: skip
    producer.stop()
    consumer.stop()

    counts = Counter(event["body"] for event in consumer.received())
    duplicates = {body: n for body, n in counts.items() if n > 1}
    print(f"duplicates after the switch to the slave: {len(duplicates)} {sorted(duplicates)}")
    assert set(counts) == everything
    # Offsets of `before` were on the slave before the kill: none comes again. Only `during`
    # messages may, each at most once more: the frozen consumer may hold a pull answer the
    # master sent, whose offsets it then commits to a master that is gone.
    assert all(body.startswith("during-") and n == 2 for body, n in duplicates.items())


def _max_offsets(addr: str, topic: str) -> int:
    """The sum of the topic's max queue offsets on one broker (its share of what was sent)."""
    total = 0
    for queue_id in range(QUEUES):
        response = _request(
            addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
        total += int(response.ext_fields["offset"])
    return total


def _has(bodies: set[str]) -> Any:
    def check(events: list[dict[str, Any]]) -> bool:
        return bodies <= {e["body"] for e in events if e["event"] == "received"}

    return check
