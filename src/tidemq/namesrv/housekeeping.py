"""BrokerHousekeeping: every scan interval, drop brokers silent for longer than the expiry.

RocketMQ's namesrv scans every 10 s and closes the channel of each broker it drops, so a broker
that is alive but wedged reconnects and registers afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tidemq.clock import Clock
from tidemq.namesrv.route_table import DroppedBroker, RouteTable
from tidemq.remoting import Connection

logger = logging.getLogger(__name__)


class BrokerHousekeeping:
    """A service with start/stop that calls `RouteTable.expire` every `scan_interval_ms`."""

    name = "namesrv-housekeeping"

    def __init__(
        self, routes: RouteTable, clock: Clock, *, scan_interval_ms: int, broker_expiry_ms: int
    ) -> None:
        assert scan_interval_ms > 0
        self._routes = routes
        self._clock = clock
        self._scan_interval_ms = scan_interval_ms
        self._broker_expiry_ms = broker_expiry_ms
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        assert self._task is None, "already started"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)
        logger.debug("%s started", self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        logger.debug("%s stopped", self.name)

    def run_once(self) -> list[DroppedBroker]:
        """One scan: drop the silent brokers and close the connections they registered over."""
        dropped = self._routes.expire(self._clock.now_ms(), self._broker_expiry_ms)
        for broker in dropped:
            logger.warning(
                "broker %s (%s) silent for %d ms, dropped",
                broker.broker_addr,
                broker.broker_name,
                self._broker_expiry_ms,
            )
            if isinstance(broker.connection_key, Connection):
                broker.connection_key.close()
        return dropped

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._scan_interval_ms / 1000)
            try:
                self.run_once()
            except Exception:
                # A task boundary: one failed scan must not end expiry for good.
                logger.exception("%s: scan failed", self.name)
