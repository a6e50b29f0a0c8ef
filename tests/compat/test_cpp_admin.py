"""Admin operations against the official C++ client (PyPI rocketmq==0.4.4): the broker relays
GET_CONSUMER_RUNNING_INFO to a C++ push consumer and returns its answer, and an offset reset
reaches it in the list form it decodes (RESET_CONSUMER_CLIENT_OFFSET, remoting.md §4.13).

librocketmq 1.2.3 decodes the reset and sets the offsets, but then never resumes the dropped
queues (its rebalance spins on "has unfinished pullMsgEvent") and the process later dies with
boost::thread_interrupted: a client bug, so the test checks what the client logs it decoded
and kills it rather than waiting for re-delivery.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tidemq import Admin
from tidemq.protocol.bodies_admin import ConsumerRunningInfo
from tidemq.testing import eventually_async

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

DELIVERY_TIMEOUT_S = 60.0


def received(events: list[dict[str, Any]]) -> list[str]:
    return [event["body"] for event in events if event["event"] == "received"]


async def running_info_and_reset(
    namesrv: str, group: str, topic: str
) -> tuple[str, ConsumerRunningInfo]:
    async with Admin(namesrv) as admin:
        connections = await admin.consumer_connections(group)
        (connection,) = connections.connection_set
        assert connection.language == "CPP"
        info = await admin.consumer_running_info(group, connection.client_id)

        async def committed() -> bool:
            stats = await admin.consume_stats(group, topic)
            return any(o.consumer_offset > 0 for o in stats.offset_table.values())

        # A reset needs the group to have committed (as upstream: "consumer group not exist"
        # otherwise); the C++ client commits every 5 s.
        await eventually_async(committed, 30.0, what=f"{group} committed an offset")
        await admin.reset_offset_by_timestamp(group, topic, 0)
        return connection.client_id, info


def test_cpp_consumer_answers_running_info_and_follows_a_reset(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppAdmin")
    group = unique_name("CG")
    names = [f"admin-{i}" for i in range(8)]
    producer = cpp.producer()
    for name in names:
        producer.send(topic, name)
    producer.stop()
    consumer = cpp.push(group, topic)
    consumer.wait_for(lambda ev: Counter(received(ev)) == Counter(names), DELIVERY_TIMEOUT_S, "all")

    client_id, info = asyncio.run(running_info_and_reset(cpp.server.namesrv_addr, group, topic))
    assert client_id
    assert any(sub.topic == topic for sub in info.subscription_set)

    # The C++ client logs each queue of the ResetOffsetBody it decoded (list form).
    logs = consumer.home / "logs" / "rocketmq-cpp"
    wanted = [f"queueID:{q}, topic:{topic}, offset:0" for q in range(4)]

    def decoded() -> bool:
        text = "".join(p.read_text(errors="replace") for p in logs.glob("*.log*"))
        return all(line in text for line in wanted)

    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while not decoded():
        assert time.monotonic() < deadline, "the C++ client never decoded the reset"
        time.sleep(0.1)
    consumer.kill()
