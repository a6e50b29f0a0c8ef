"""LeaseKeeper: one etcd lease kept alive, and the deadline until which its holder may act.

    grant ──> keep-alive every TTL/4 ──> ... ──> no renewal by valid_until, or etcd: "no lease"
      ^         valid_until = sent + TTL - margin                     │
      │                                                               v
      └──── on_new_lease() <── grant a NEW lease <── revoke old <── on_lost() (once)

The fencing argument (ARCHITECTURE.md): etcd expires a lease no earlier than TTL after it
RECEIVED the last keep-alive it answered, and it received that request after we SENT it. So
`sent + TTL` is no later than etcd's expiry, and a successor, which needs our alive key gone
(the lease expired), cannot be elected before our `valid_until` (that minus a margin for clock
rate differences and scheduling) has passed. A master acknowledges nothing once `valid()` is
false. Only successful keep-alives move the deadline; a failed or slow one leaves it where it is.

After a loss the keeper never reuses the old lease, even if etcd still holds it: the member has
already fenced itself on `on_lost`, and a fresh lease gives it a fresh start (it re-puts its
alive key in `on_new_lease`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final

from tidemq.clock import Clock
from tidemq.controller.etcd import EtcdSession
from tidemq.controller.state import EtcdUnavailable

log = logging.getLogger(__name__)

MARGIN_S_MIN: Final = 0.25
# After a failed keep-alive (etcd moved, a blip), the next try comes this soon, not a tick later.
RETRY_S: Final = 0.1
GRANT_BACKOFF_S_MIN: Final = 0.1
GRANT_BACKOFF_S_MAX: Final = 1.0


def lease_margin_s(ttl_s: float) -> float:
    return max(MARGIN_S_MIN, ttl_s / 5)


class LeaseKeeper:
    """Keeps a lease of `ttl_s` seconds alive on `session`; `valid()` says whether its holder may
    still act as master."""

    def __init__(
        self,
        session: EtcdSession,
        ttl_s: int,
        clock: Clock,
        *,
        on_lost: Callable[[], None] | None = None,
        on_new_lease: Callable[[int], None] | None = None,
    ) -> None:
        assert ttl_s >= 1
        self.session = session
        self.ttl_s = ttl_s
        self.clock = clock
        self.on_lost = on_lost
        self.on_new_lease = on_new_lease
        self.lease_id: int | None = None
        # Monotonic ms; meaningful only while lease_id is set.
        self.valid_until_ms = 0.0
        self._sent_ms = 0.0
        self.losses = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 4

    @property
    def margin_s(self) -> float:
        return lease_margin_s(self.ttl_s)

    def valid(self) -> bool:
        """True while the holder may act on the lease (as master: acknowledge)."""
        return self.lease_id is not None and self.clock.monotonic_ms() < self.valid_until_ms

    def start(self) -> None:
        """Start granting and renewing in the background; on_new_lease reports each grant."""
        assert self._task is None
        self._task = asyncio.create_task(self._run(), name="lease-keeper")

    async def stop(self, *, revoke: bool) -> None:
        """Stop renewing. revoke=True also revokes the lease so its keys go now (a clean stop);
        False leaves it to expire (as a crash would)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease_id, self.lease_id = self.lease_id, None
        if revoke and lease_id is not None:
            try:
                await self.session.revoke(lease_id)
            except EtcdUnavailable as e:
                log.warning("lease %x not revoked at stop (it will expire): %s", lease_id, e)

    async def _run(self) -> None:
        while True:
            if self.lease_id is None:
                await self._grant()
                continue
            if self.clock.monotonic_ms() >= self.valid_until_ms:
                await self._lose("no keep-alive succeeded in time")
                continue
            if not await self._renew():
                continue
            next_ms = min(self._sent_ms + self.interval_s * 1000, self.valid_until_ms)
            await asyncio.sleep(max(0.0, next_ms - self.clock.monotonic_ms()) / 1000)

    async def _grant(self) -> None:
        backoff_s = GRANT_BACKOFF_S_MIN
        while True:
            sent_ms = self.clock.monotonic_ms()
            try:
                lease_id = await self.session.grant_lease(self.ttl_s)
            except EtcdUnavailable as e:
                log.info("lease grant failed (retrying in %.2f s): %s", backoff_s, e)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, GRANT_BACKOFF_S_MAX)
                continue
            self.lease_id = lease_id
            self._set_valid(sent_ms)
            log.info("lease %x granted (ttl %d s)", lease_id, self.ttl_s)
            if self.on_new_lease is not None:
                self.on_new_lease(lease_id)
            return

    def _set_valid(self, sent_ms: float) -> None:
        self._sent_ms = sent_ms
        self.valid_until_ms = sent_ms + (self.ttl_s - self.margin_s) * 1000

    async def _renew(self) -> bool:
        """One keep-alive, cut off at valid_until (an answer after it is too late to use).
        True when it succeeded."""
        lease_id = self.lease_id
        assert lease_id is not None
        sent_ms = self.clock.monotonic_ms()
        left_s = (self.valid_until_ms - sent_ms) / 1000
        try:
            async with asyncio.timeout(max(left_s, 0.0)):
                remaining = await self.session.keep_alive_once(lease_id)
        except TimeoutError:
            await self._lose("keep-alive unanswered until the lease's deadline")
            return False
        except EtcdUnavailable as e:
            log.info("lease %x keep-alive failed: %s", lease_id, e)
            await asyncio.sleep(min(RETRY_S, self.interval_s))
            return False
        if remaining is None:
            await self._lose("etcd no longer holds the lease")
            return False
        self._set_valid(sent_ms)
        return True

    async def _lose(self, why: str) -> None:
        lease_id, self.lease_id = self.lease_id, None
        self.losses += 1
        log.warning("lease %x lost: %s", lease_id or 0, why)
        if self.on_lost is not None:
            self.on_lost()
        if lease_id is not None:
            # Our keys go now rather than at etcd's expiry: a successor need not wait for it.
            with contextlib.suppress(EtcdUnavailable):
                await self.session.revoke(lease_id)
