"""The producer's prober: asks brokers skipped after a failed send whether they answer again.

fault.py decides who is due a probe and what an answer means; this is the task that sends the
probes. It runs only while some broker is skipped for a failure (the tracker's `on_failure`
wakes it) and ends when none is, so a healthy producer has no timer for it. Each due broker gets
one probe (the producer passes a HEART_BEAT to the broker's master, which also re-registers the
producer with a broker that restarted); the probes of one round run concurrently, so a hung
broker delays no other broker's readmission. The client instance runs a second one for reads,
keyed by broker address (client/read_route.py): a consumer's master that stopped answering is
probed the same way, and its pulls return to it once it answers, however slowly it answered
(`charge_latency=False`: reads charge no latency).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidemq.clock import Clock
from tidemq.errors import QueueError

from .fault import PROBE_TIMEOUT_MS, FaultTracker

logger = logging.getLogger(__name__)

# probe(broker name, timeout ms): returns when the broker answered, raises ClientError or
# BrokerError when it did not.
Probe = Callable[[str, float], Awaitable[None]]


class BrokerProber:
    def __init__(
        self,
        faults: FaultTracker,
        probe: Probe,
        clock: Clock,
        *,
        rotation: str = "send",
        charge_latency: bool = True,
    ) -> None:
        self._faults = faults
        # Whether a probe's answer time is charged like a send of that latency (the send path:
        # a slow answer skips the broker per fault.py's table) or an answer is just an answer
        # (the read path, which charges no latency: read_route.py).
        self._charge_latency = charge_latency
        # Which rotation a readmitted broker returns to, for the log line ("send", "read").
        self._rotation = rotation
        self._probe = probe
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.readmitted = 0  # brokers let back in by a probe, for tests and stats

    def wake(self, _broker_name: str = "") -> None:
        """Start probing if not already (the FaultTracker's `on_failure`)."""
        if self._stopped or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fault-probe")

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            now = self._clock.monotonic_ms()
            wait_ms = self._faults.next_probe_in_ms(now)
            if wait_ms is None:
                return
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
                continue
            due = self._faults.probes_due(now)
            await asyncio.gather(*(self._probe_one(name) for name in due))

    async def _probe_one(self, broker_name: str) -> None:
        started = self._clock.monotonic_ms()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_MS / 1000):
                await self._probe(broker_name, PROBE_TIMEOUT_MS)
        except (QueueError, TimeoutError) as exc:
            # Any refusal or transport failure (a malformed answer included) is a failed probe;
            # the loop must outlive it, or a failed broker would never be readmitted.
            logger.debug("probe of broker %s: %s", broker_name, exc)
            return
        finished = self._clock.monotonic_ms()
        latency_ms = finished - started
        charged_ms = latency_ms if self._charge_latency else 0.0
        self._faults.record(broker_name, charged_ms, finished, failed=False)
        if self._faults.is_available(broker_name, finished):
            self.readmitted += 1
            logger.info(
                "broker %s answers again (probe %.0f ms): back in the %s rotation",
                broker_name,
                latency_ms,
                self._rotation,
            )
