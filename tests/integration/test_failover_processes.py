"""Automatic failover (issue 14) with real processes: etcd, a name server, three controller-mode
replicas of broker-a (testing/failover_group.py).

- kill -9 the master while a producer sends: another replica is published as master within
  seconds, the producer carries on without a restart, and every acknowledged message is read
  back from the new master; the old master restarts, cuts back whatever it had that the group
  never acknowledged, follows, and rejoins the in-sync set.
- A half message whose producer answered UNKNOW before the master died is checked back by the
  new master and committed exactly once.
- SIGSTOP the master past its lease: a successor is elected; after SIGCONT the old master steps
  down and follows instead of acknowledging anything.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Final

import pytest

from tidemq import Admin, Message, Producer, SendStatus
from tidemq.client.transaction import LocalTransactionState, TransactionProducer
from tidemq.errors import QueueError
from tidemq.testing import eventually_async
from tidemq.testing.failover_group import ControlledGroup, controlled_group
from tidemq.testing.processes import ServerProcess
from tidemq.testing.reading import pull_bodies

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.etcd]

TOPIC: Final = "FailoverTopic"
QUEUES: Final = 4
# Registration, metadata copy and elections on a loaded 2-core machine.
SETTLE_S: Final = 40.0
# A failed send is retried after this pause, as an application would (not a busy loop).
RETRY_PAUSE_S: Final = 0.02


async def _runtime(group: ControlledGroup, addr: str) -> dict[str, str]:
    try:
        async with Admin(group.namesrv_addr, timeout_ms=2_000) as admin:
            return await admin.broker_runtime_info(addr)
    except (QueueError, OSError):
        return {}


async def _in_sync(group: ControlledGroup, size: int) -> ServerProcess:
    """The published master, once its in-sync set has `size` replicas."""
    master = await group.master(SETTLE_S)

    async def full() -> bool:
        info = await _runtime(group, master.address)
        return len([i for i in info.get("syncStateSet", "").split(",") if i]) == size

    await eventually_async(full, SETTLE_S, what=f"an in-sync set of {size}")
    return master


async def _identical_logs(group: ControlledGroup) -> None:
    """Every replica reaches the same log end, then their commit logs are byte-identical: a
    returning master kept nothing the group did not acknowledge (truncation), and the others
    copied the rest."""

    async def same_end() -> bool:
        ends = {
            (await _runtime(group, replica.address)).get("commitLogMaxOffset")
            for replica in group.replicas
        }
        return len(ends) == 1 and None not in ends

    await eventually_async(same_end, SETTLE_S, what="every replica at one log end")
    logs = []
    for replica in group.replicas:
        assert replica.store_dir is not None
        files = sorted((replica.store_dir / "commitlog").iterdir())
        logs.append({path.name: path.read_bytes() for path in files})
    assert logs[0] == logs[1] == logs[2]


async def _topic(group: ControlledGroup, master: ServerProcess) -> None:
    async with Admin(group.namesrv_addr) as admin:
        await admin.create_topic(
            TOPIC, broker_addr=master.address, read_queue_nums=QUEUES, write_queue_nums=QUEUES
        )


class Sender:
    """Sends numbered messages one after another; remembers every acknowledged body."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.acked: set[bytes] = set()
        self.failed = 0
        self.ack_times: list[float] = []
        self._next = 0

    async def send_one(self) -> bool:
        body = b"f-%07d" % self._next
        self._next += 1
        try:
            result = await self.producer.send(Message(TOPIC, body))
        except QueueError:
            self.failed += 1
            return False
        if result.status is not SendStatus.SEND_OK:
            self.failed += 1
            return False
        self.acked.add(body)
        self.ack_times.append(time.monotonic())
        return True

    def first_ack_after(self, moment: float) -> float:
        """Seconds from `moment` to the first acknowledgement after it."""
        return min(t for t in self.ack_times if t > moment) - moment

    async def until_acked(self, count: int, timeout_s: float) -> None:
        goal = len(self.acked) + count
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < goal:
            assert time.monotonic() < deadline, f"{goal - len(self.acked)} sends not acked"
            if not await self.send_one():
                await asyncio.sleep(RETRY_PAUSE_S)


async def test_kill_master_loses_no_acknowledged_message(tmp_path: Path) -> None:
    async with controlled_group(tmp_path) as group:
        master = await _in_sync(group, 3)
        await _topic(group, master)
        async with Producer("PG-failover", group.namesrv_addr, send_timeout_ms=2_000) as p:
            sender = Sender(p)
            await sender.until_acked(300, SETTLE_S)
            killed_at = time.monotonic()
            master.kill()
            await sender.until_acked(300, SETTLE_S)
            failover_s = sender.first_ack_after(killed_at)
        successor = await group.master(SETTLE_S, not_=master)
        assert successor is not master
        read = await pull_bodies(group.namesrv_addr, TOPIC, "CG-failover-check")
        lost = sender.acked - read
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:3]}"
        print(f"failover: 600 acked, {sender.failed} failed sends, first ack {failover_s:.1f} s")
        await master.start()  # the old master returns: it must follow, not lead
        await _in_sync(group, 3)
        assert await group.published_master() is successor
        await _identical_logs(group)
        assert not (sender.acked - await pull_bodies(group.namesrv_addr, TOPIC, "CG-2"))


class _Unknown:
    """A local transaction that answers UNKNOW, then COMMIT to every check."""

    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        self.checks += 1
        return LocalTransactionState.COMMIT_MESSAGE


async def test_half_message_is_resolved_by_the_new_master(tmp_path: Path) -> None:
    settings = {"transactionCheckInterval": "500", "transactionTimeOut": "500"}
    async with controlled_group(tmp_path, settings=settings) as group:
        master = await _in_sync(group, 3)
        await _topic(group, master)
        listener = _Unknown()
        async with TransactionProducer("PG-tx", group.namesrv_addr, listener=listener) as p:
            result = await p.send_message_in_transaction(Message(TOPIC, b"half-1"))
            assert result.send_status is SendStatus.SEND_OK
            master.kill()
            await group.master(SETTLE_S, not_=master)

            async def committed() -> bool:
                try:
                    read = await pull_bodies(group.namesrv_addr, TOPIC, "CG-tx")
                except QueueError:  # the new master adopts the topic with the commit's record
                    return False
                return b"half-1" in read

            await eventually_async(committed, SETTLE_S, what="the half committed by a check")
        assert listener.checks >= 1
        read = await pull_bodies(group.namesrv_addr, TOPIC, "CG-tx-2")
        assert read == {b"half-1"}


async def test_paused_master_steps_down_after_its_lease(tmp_path: Path) -> None:
    async with controlled_group(tmp_path) as group:
        master = await _in_sync(group, 3)
        await _topic(group, master)
        async with Producer("PG-pause", group.namesrv_addr, send_timeout_ms=2_000) as p:
            sender = Sender(p)
            await sender.until_acked(100, SETTLE_S)
            master.pause()
            successor = await group.master(SETTLE_S, not_=master)
            await sender.until_acked(100, SETTLE_S)
            master.resume()

            async def follows() -> bool:
                info = await _runtime(group, master.address)
                return info.get("brokerRole") == "SLAVE" and info.get("haConnected") == "true"

            await eventually_async(follows, SETTLE_S, what="the old master following")
            await sender.until_acked(100, SETTLE_S)
        assert await group.published_master() is successor
        await _identical_logs(group)
        read = await pull_bodies(group.namesrv_addr, TOPIC, "CG-pause")
        assert not sender.acked - read
