"""The npm ali-ons client (3.12.0, pinned in tests/compat/js) against TideMQ.

ali-ons raises on a topic the name server does not know (it has no TBW102 fallback), so each
test creates its topic first with `tidemq topic create`. The client runs in node processes
driven by tests/compat/js/ons_driver.js; see that file for how it is pointed at a plain name
server without Aliyun credentials.

The consumer is a new group with ali-ons' default CONSUME_FROM_LAST_OFFSET: it sees messages
produced before it started only because the broker answers QUERY_CONSUMER_OFFSET for a new group
with 0 while the queue still starts at 0 (remoting.md §12.11).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

NODE_PRODUCE_TIMEOUT_S = 60.0  # Node start-up, route lookup, one send after another.
NODE_CONSUME_TIMEOUT_S = 90.0  # Start, heartbeat, rebalance, pulls, then a clean close.
CONSUME_WAIT_MS = 60_000  # Inside the consumer: messages must all arrive within this.


def run_node(js_dir: Path, args: list[str], timeout_s: float, server: Any) -> list[dict[str, Any]]:
    """Runs ons_driver.js to completion; fails with its output unless it exits 0."""
    try:
        result = subprocess.run(
            ["node", str(js_dir / "ons_driver.js"), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=js_dir,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"node {args[0]} timed out\nstdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}\n"
                    f"{server.logs()}")  # fmt: skip
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0:
        pytest.fail(
            f"node {args[0]} exited {result.returncode}\nstdout:\n{result.stdout}\n"
            f"stderr:\n{result.stderr[-6000:]}\n{server.logs()}"
        )
    return events


@pytest.mark.parametrize("tidemq", ["dev", "split"], indirect=True)
def test_ali_ons_produces_and_push_consumer_receives(
    tidemq: Any, node_ons: Path, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("OnsTopic")
    tidemq.create_topic(topic, queues=4)
    count = 12

    sent = run_node(
        node_ons,
        ["produce", "--namesrv", tidemq.namesrv_addr, "--group", unique_name("OnsPG"),
         "--topic", topic, "--count", str(count), "--tags", "TagA", "--prefix", "ons"],
        NODE_PRODUCE_TIMEOUT_S,
        tidemq,
    )  # fmt: skip
    results = [event for event in sent if event["event"] == "sent"]
    names = [f"ons-{i}" for i in range(count)]
    assert [event["body"] for event in results] == names
    assert {event["sendStatus"] for event in results} == {"SEND_OK"}
    assert all(event["msgId"] for event in results)
    assert len({event["queueId"] for event in results}) > 1  # Round-robin over the queues.

    consumed = run_node(
        node_ons,
        ["consume", "--namesrv", tidemq.namesrv_addr, "--group", unique_name("OnsCG"),
         "--topic", topic, "--expect", str(count), "--timeout-ms", str(CONSUME_WAIT_MS)],
        NODE_CONSUME_TIMEOUT_S,
        tidemq,
    )  # fmt: skip
    received = [event for event in consumed if event["event"] == "received"]
    assert Counter(event["body"] for event in received) == Counter(names)
    assert {event["tags"] for event in received} == {"TagA"}
    assert sorted(event["keys"] for event in received) == sorted(f"key-{i}" for i in range(count))
    # ali-ons hands response-header fields through as the strings they are on the wire.
    sent_at = {(int(event["queueId"]), int(event["queueOffset"])) for event in results}
    assert {(int(event["queueId"]), int(event["queueOffset"])) for event in received} == sent_at
    errors = [event for event in consumed if event["event"] == "error"]
    assert errors == []
