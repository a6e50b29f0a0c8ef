"""A broker that restarts gets its share of an existing producer's sends again within seconds
(issue 19 item 4), with real processes: kill -9 a broker under load, restart it.

The producer skips a broker after a failed send (client/fault.py: 600 s for a failure, as
upstream); while skipped it is probed every second, and the first probe it answers readmits it
(and refreshes the routes, in case the name servers dropped it meanwhile).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Final

import pytest

from tidemq.client.admin import Admin
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.errors import TopicNotExistError
from tidemq.testing import eventually, eventually_async
from tidemq.testing.processes import ProcessCluster, ServerProcess, process_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

logger = logging.getLogger(__name__)

TOPIC: Final = "BrokerRejoinTopic"
QUEUES_PER_BROKER: Final = 4
# The probe interval (1 s) plus a probe, the route refresh after it (0.5 s) and a loaded
# machine's scheduling: "a few seconds", against 600 s before.
BACK_IN_ROTATION_WITHIN_S: Final = 5.0
# Sends after the rejoin that must all succeed, and of which the rejoined broker must get some.
SENDS_AFTER_REJOIN: Final = 150
# Sends in flight at once (a producer under load: several fail at once when a broker dies).
WINDOW: Final = 8


async def _topic_on_every_broker(pc: ProcessCluster) -> None:
    async with Admin(pc.namesrv_addr) as admin:

        async def all_registered() -> bool:
            return len(await admin.master_addresses()) == len(pc.brokers)

        await eventually_async(all_registered, 30.0)
        await admin.create_topic(
            TOPIC, read_queue_nums=QUEUES_PER_BROKER, write_queue_nums=QUEUES_PER_BROKER
        )

        async def route_spans_all() -> bool:
            # The brokers register the new topic with the name server on their own schedule.
            try:
                route = await admin.instance.fetch_route(TOPIC)
            except TopicNotExistError:
                return False
            return len(route.broker_datas) == len(pc.brokers)

        await eventually_async(route_spans_all, 30.0)


class _Load:
    """WINDOW tasks sending to TOPIC without pause, counting results per broker."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.counts: collections.Counter[str] = collections.Counter()
        self.failures: list[BaseException] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._send()) for _ in range(WINDOW)]

    async def _send(self) -> None:
        index = 0
        while not self._stop.is_set():
            index += 1
            try:
                result = await self.producer.send(Message(TOPIC, f"m{index}".encode()))
            except Exception as exc:
                self.failures.append(exc)
                await asyncio.sleep(0.01)
            else:
                self.counts[result.message_queue.broker_name] += 1

    async def more_sends(self, count: int) -> collections.Counter[str]:
        """Wait for `count` more successful sends; what each broker got of them."""
        start = self.counts.copy()
        await eventually(lambda: self.counts.total() >= start.total() + count, 30.0)
        return self.counts - start

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _kill_under_load(load: _Load, victim: ServerProcess) -> None:
    faults, now_ms = load.producer.faults, load.producer.instance.clock.monotonic_ms
    await eventually(lambda: load.counts[victim.name] >= 20, 30.0)
    victim.kill()
    # A failed send to it puts it out of the rotation (600 s, as upstream) ...
    await eventually(lambda: not faults.is_available(victim.name, now_ms()))
    # ... and the producer keeps sending to the others while it is down.
    assert (await load.more_sends(100))[victim.name] == 0


async def _restart_and_measure(load: _Load, victim: ServerProcess) -> None:
    await victim.start()
    loop = asyncio.get_running_loop()
    accepting_at = loop.time()
    at_restart = load.counts[victim.name]
    failures_at_restart = len(load.failures)
    await eventually(
        lambda: load.counts[victim.name] > at_restart,
        BACK_IN_ROTATION_WITHIN_S,
        what=f"a send to the restarted {victim.name}",
    )
    logger.warning("restarted broker got sends again after %.2f s", loop.time() - accepting_at)
    after = await load.more_sends(SENDS_AFTER_REJOIN)
    assert load.failures[failures_at_restart:] == []
    # Round-robin again: the rejoined broker takes its share (a third or a half).
    assert after[victim.name] >= after.total() // 6, after


async def test_killed_broker_gets_sends_again_soon_after_restart(tmp_path: Path) -> None:
    async with process_cluster(tmp_path, namesrvs=1, brokers=3) as pc:
        await _topic_on_every_broker(pc)
        async with Producer("RejoinPG", pc.namesrv_addr, topics=[TOPIC]) as producer:
            load = _Load(producer)
            try:
                await _kill_under_load(load, pc.brokers[2])
                await _restart_and_measure(load, pc.brokers[2])
            finally:
                await load.stop()
            logger.warning("sends failed in all: %d", len(load.failures))


async def test_broker_dropped_from_the_route_while_down_comes_back(tmp_path: Path) -> None:
    async with process_cluster(tmp_path, namesrvs=1, brokers=2) as pc:
        await _topic_on_every_broker(pc)
        victim = pc.brokers[1]
        async with Producer("RejoinPG", pc.namesrv_addr, topics=[TOPIC]) as producer:
            load = _Load(producer)
            try:
                await _kill_under_load(load, victim)

                # The name server dropped it (its connection closed), and the producer's
                # route refresh (every 30 s) happened while it was down.
                async def route_without_victim() -> bool:
                    route = await producer.instance.fetch_route(TOPIC)
                    return victim.name not in {b.broker_name for b in route.broker_datas}

                await eventually_async(route_without_victim, 10.0)
                await _restart_and_measure(load, victim)
            finally:
                await load.stop()
