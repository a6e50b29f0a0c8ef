"""The official C++ client across an automatic master switch (issue 14), without a restart.

    etcd ◀── leases, state CAS ──┐
    namesrv ◀── master as brokerId 0 ── broker-a-r1, broker-a-r2, broker-a-r3 (controller mode)
       ▲                                         ▲
       └── routes every 30 s ── C++ producer ────┘  C++ push consumer (clustering)

1. The topic is created on the published master; the C++ push consumer starts, the C++ producer
   sends a first batch and every message of it is acknowledged and consumed.
2. Once the in-sync set holds all three replicas (before that a kill elects nobody, by design)
   and right after the C++ producer's next periodic route refresh, the published master is
   killed with SIGKILL. Without that wait the kill comes within the clients' first 3 s, just
   before their first periodic refresh, and the C++ producer resumes after ~3 s, which says
   nothing about the 30 s period; right after a refresh is the worst case instead: a whole
   period without the new master's address (the C++ client does not refresh a route because
   sends to its broker fail).
3. The same C++ producer keeps sending, as an application would: a failed send is followed by
   the next one after a short pause, until a second batch is acknowledged. The C++ client learns
   the new master's address only from its route refresh (every 30 s), so this may take that long.
4. The same C++ consumer must receive every acknowledged message; duplicates are allowed, and
   counted and printed with the time from the kill to the producer's first acknowledgement.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from compat_servers import TideMQServer

from tidemq.client.admin import Admin
from tidemq.errors import QueueError
from tidemq.testing import eventually_async
from tidemq.testing.failover_group import ControlledGroup, controlled_group
from tidemq.testing.processes import ServerProcess

pytestmark = [pytest.mark.compat, pytest.mark.etcd, pytest.mark.timeout(420)]

TOPIC: Final = "CppFailoverTopic"
CONSUMER_GROUP: Final = "CppFailoverGroup"
QUEUES: Final = 4
BATCH: Final = 20  # acknowledged messages before the kill, and again after it
# Registration, metadata copy and elections on a loaded 2-core machine.
SETTLE_S: Final = 40.0
# The C++ client refreshes routes every 30 s: up to three refreshes for the new master.
RESUME_TIMEOUT_S: Final = 90.0
# Consumer start, rebalance and delivery; after the kill the C++ consumer also needs a route
# refresh before it pulls from the new master.
DELIVERY_TIMEOUT_S: Final = 120.0
# One C++ sync send: 3 attempts of at most 5 s (the driver's send timeout) and route lookups.
SEND_RESULT_TIMEOUT_S: Final = 40.0
# A failed send is followed by the next one after this pause, as an application would.
RETRY_PAUSE_S: Final = 0.2
# The C++ client's periodic route refresh (every 30 s, the first 3 s after start), as it logs it
# under $HOME/logs/rocketmq-cpp (librocketmq 2.0 in PyPI rocketmq 0.4.4).
ROUTE_REFRESH_LINE: Final = f"updateTopicRouteInfoFromNameServer start:{TOPIC}["
REFRESH_PERIOD_S: Final = 30.0


@dataclass
class _GroupServer(TideMQServer):
    """What conftest's C++ clients bind to (the name server) and quote when a wait fails."""

    group: ControlledGroup | None = None

    def logs(self) -> str:
        assert self.group is not None
        parts = [
            f"--- {server.name} (running {server.running}) log {server.log_path} ---\n"
            + server.log_tail()
            for server in [*self.group.namesrvs, *self.group.replicas]
        ]
        parts.append(f"--- etcd log {self.group.etcd.log_path} ---\n{self.group.etcd.log_tail()}")
        return "\n".join(parts)


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[ControlledGroup]:
    async with controlled_group(tmp_path / "group") as started:
        yield started


@pytest.fixture
def tidemq(group: ControlledGroup, tmp_path: Path) -> TideMQServer:
    """The server conftest's `cpp` fixture binds its C++ clients to: the controlled group."""
    return _GroupServer(group.namesrv_addr, "", [], tmp_path / "group", group=group)


async def _in_sync(group: ControlledGroup, size: int) -> ServerProcess:
    """The published master, once its in-sync set has `size` replicas."""
    master = await group.master(SETTLE_S)

    async def full() -> bool:
        try:
            async with Admin(group.namesrv_addr, timeout_ms=2_000) as admin:
                info = await admin.broker_runtime_info(master.address)
        except (QueueError, OSError):
            return False
        return len([i for i in info.get("syncStateSet", "").split(",") if i]) == size

    await eventually_async(full, SETTLE_S, what=f"an in-sync set of {size}")
    return master


@dataclass
class _CppSender:
    """Drives one C++ producer process: numbered sync sends, one after another (blocking: run
    in a thread). Remembers every acknowledged body, when it was acknowledged, and each failure."""

    producer: Any
    acked: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    sent: int = 0

    def send_one(self) -> bool:
        body = f"cpp-fo-{self.sent:05d}"
        self.sent += 1
        command = {"op": "send", "mode": "sync", "topic": TOPIC, "body": body}
        event = self.producer.result(self.producer.request(command), SEND_RESULT_TIMEOUT_S)
        if event["event"] == "sent" and event["status"] == 0:
            self.acked.append(body)
            self.ack_times.append(time.monotonic())
            return True
        self.failures.append(str(event.get("error") or f"status {event.get('status')}"))
        return False

    def until_acked(self, count: int, timeout_s: float) -> None:
        goal = len(self.acked) + count
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < goal:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{goal - len(self.acked)} of {count} sends not acknowledged in {timeout_s}s; "
                    f"{len(self.failures)} failed, last: {self.failures[-3:]}\n"
                    f"{self.producer.diagnostics()}"
                )
            if not self.send_one():
                time.sleep(RETRY_PAUSE_S)

    def first_ack_after(self, moment: float) -> float:
        return min(t for t in self.ack_times if t > moment) - moment


def _route_refreshes(client: Any) -> int:
    """How often the C++ client has asked the name server for TOPIC's route so far."""
    return sum(
        log.read_text(errors="replace").count(ROUTE_REFRESH_LINE)
        for log in (client.home / "logs" / "rocketmq-cpp").glob("*")
    )


async def _next_route_refresh(client: Any) -> None:
    """Returns right after the C++ client's next route refresh."""
    seen = _route_refreshes(client)

    async def refreshed() -> bool:
        return _route_refreshes(client) > seen

    await eventually_async(refreshed, REFRESH_PERIOD_S + SETTLE_S, what="a C++ route refresh")


def _has(bodies: set[str]) -> Any:
    def check(events: list[dict[str, Any]]) -> bool:
        return bodies <= {e["body"] for e in events if e["event"] == "received"}

    return check


async def test_cpp_producer_and_consumer_carry_on_across_a_master_switch(
    group: ControlledGroup, cpp: Any
) -> None:
    master = await group.master(SETTLE_S)
    async with Admin(group.namesrv_addr) as admin:
        await admin.create_topic(
            TOPIC, broker_addr=master.address, read_queue_nums=QUEUES, write_queue_nums=QUEUES
        )
    consumer = await asyncio.to_thread(cpp.push, CONSUMER_GROUP, TOPIC)
    sender = _CppSender(await asyncio.to_thread(cpp.producer))
    await asyncio.to_thread(sender.until_acked, BATCH, SETTLE_S)
    first = set(sender.acked)
    await asyncio.to_thread(consumer.wait_for, _has(first), DELIVERY_TIMEOUT_S, "the first batch")

    killed = await _in_sync(group, 3)
    assert killed is master, "the master changed before the kill"
    await _next_route_refresh(sender.producer)
    failures_before = len(sender.failures)
    killed_at = time.monotonic()
    killed.kill()
    resumed = asyncio.create_task(asyncio.to_thread(sender.until_acked, BATCH, RESUME_TIMEOUT_S))
    successor = await group.master(SETTLE_S, not_=killed)
    published_s = time.monotonic() - killed_at
    await resumed
    first_ack_s = sender.first_ack_after(killed_at)

    acked = set(sender.acked)
    await asyncio.to_thread(consumer.wait_for, _has(acked), DELIVERY_TIMEOUT_S, "every ack")
    await asyncio.to_thread(sender.producer.stop)
    await asyncio.to_thread(consumer.stop)

    counts = Counter(event["body"] for event in consumer.received())
    duplicates = {body: n for body, n in counts.items() if n > 1}
    unacked = sorted(set(counts) - acked)  # stored although its send reported a failure
    failed = sender.failures[failures_before:]
    print(
        f"\nC++ failover: {killed.name} killed, {successor.name} published after "
        f"{published_s:.1f} s; C++ producer's first ack after {first_ack_s:.1f} s; "
        f"{len(failed)} failed sends after the kill ({sorted(set(failed))[:3]}); "
        f"{len(acked)} acked, {sum(counts.values())} deliveries, "
        f"{len(duplicates)} duplicated {sorted(duplicates.items())}, "
        f"{len(unacked)} delivered unacked {unacked}"
    )
    assert successor is not killed
    assert not acked - set(counts), (
        f"acknowledged but never consumed: {sorted(acked - set(counts))}"
    )
