"""The issue's case with the official C++ client (rocketmq 0.4.4, librocketmq 1.2.3): a message
with a 1 MiB KEYS property (issue 15 item 4).

The C++ client puts keys and tags in the send header, so the header is over
FRAME_HEADER_SIZE_MAX. The broker used to close the connection on it: every attempt then waited
out its send timeout (5 s here) before the client tried again. Now the broker answers
MESSAGE_ILLEGAL naming the properties' size and their 32767-byte limit, and the connection stays.

What the application sees is the C++ client's own doing: its sync send catches every broker
error of an attempt, retries, and then throws "No route info of this topic"
(DefaultMQProducer::sendDefaultImpl in rocketmq-client-cpp 1.2.3, `catch (...)`), so the remark
reaches only the client's log ("processSendResponse error remark: ..."). A Java client throws
MQBrokerException with the remark (MESSAGE_ILLEGAL is not among its retried codes). The test
checks what the broker controls: the answer and its remark (in the client's log), that the
attempts are answered at once instead of timing out, and that the same client's next send works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

QUEUES = 4
SEND_TIMEOUT_S = 5.0  # cpp_driver.py's default --send-timeout-ms
BIG_KEYS = "k" * (1024 * 1024)


def cpp_log(producer: Any) -> str:
    return "\n".join(
        path.read_text(errors="replace")
        for path in sorted((producer.home / "logs" / "rocketmq-cpp").glob("*"))
    )


@pytest.mark.parametrize("size", [40_000, len(BIG_KEYS)], ids=["40k-keys", "1MiB-keys"])
def test_an_over_long_keys_property_is_refused_naming_the_limit(
    tidemq: Any, cpp: Any, unique_name: Callable[[str], str], size: int
) -> None:
    topic = unique_name("Limits")
    tidemq.create_topic(topic, QUEUES)
    producer = cpp.producer()
    producer.send(topic, "before")

    started = time.monotonic()
    event = producer.result(
        producer.request(
            {"op": "send", "mode": "sync", "topic": topic, "body": "big", "keys": "k" * size}
        ),
        timeout_s=60,
    )
    elapsed = time.monotonic() - started
    assert event["event"] == "error", event  # see the module docstring for its text
    # Every attempt was answered, none waited out the send timeout on a closed connection.
    assert elapsed < SEND_TIMEOUT_S, f"{elapsed:.1f} s: an attempt timed out\n{cpp_log(producer)}"
    log = cpp_log(producer)
    assert "error code:13" in log, log[-3000:]  # MESSAGE_ILLEGAL
    assert "exceed" in log, log[-3000:]
    assert "32767" in log, log[-3000:]

    after = producer.send(topic, "after")  # the same client and connection go on
    assert after["status"] == 0
    producer.stop()
    assert "closing connection from" not in tidemq.logs()
