"""A pull consumer's offsets that only a slave took, sent to the master until it has them.

An offset commit goes to the master whenever the route lists it and lands on a slave only when
that request fails, or while the route lists no master (read_route.py). A slave's copy does not
last: its periodic copy of the master's offsets replaces it with the master's older value about
a second after the master is back. The push consumer commits such a queue again every round
(assignment.py); a pull consumer commits only when its caller says so. So `SlaveOffsets` keeps
each queue's offset that landed on a slave, and a task sends it to the master every
RESEND_INTERVAL_MS until the master has taken it or a later commit of that queue replaced it:

    commit(mq, o) ─▶ master stored it ─▶ done (an older pending value of mq is forgotten)
                 └─▶ a slave stored it ─▶ pending[mq] = o ─▶ every RESEND_INTERVAL_MS: o to the
                                          master only ─▶ taken: forgotten

Commits of one queue (the caller's and the re-sends) are serialized by a lock per queue, so a
re-send of an older value never reaches the master after a newer commit. `close` (the consumer's
shutdown) tries the master once more for what is still pending and logs what it could not send.
The task runs only while something is pending.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from tidemq.errors import BrokerError, ClientError
from tidemq.protocol.bodies import MessageQueue

from . import api
from .instance import ClientInstance

logger = logging.getLogger(__name__)

# How often an offset only a slave holds is sent to the master again: about the time the
# slave keeps it once the master is back (the slave's metadata sync then replaces it).
RESEND_INTERVAL_MS: Final = 1_000
# The deadline of each such send: a master that answers does so in milliseconds, and a hung one
# must not hold the queue's next commit for a full request timeout.
RESEND_TIMEOUT_MS: Final = 1_000


class SlaveOffsets:
    """Commits of one consumer group, with the offsets only a slave took re-sent (module doc)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        self._instance = instance
        self._group = group
        self._pending: dict[MessageQueue, int] = {}
        self._locks: dict[MessageQueue, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def pending(self) -> dict[MessageQueue, int]:
        """The offsets stored in a slave that the master has not taken yet."""
        return dict(self._pending)

    def _lock(self, mq: MessageQueue) -> asyncio.Lock:
        lock = self._locks.get(mq)
        if lock is None:
            lock = self._locks[mq] = asyncio.Lock()
        return lock

    async def commit(self, mq: MessageQueue, offset: int) -> bool:
        """Store `offset` (api.update_consumer_offset): True when the master took it, False
        when only a slave did (then it is sent to the master until it takes it).

        Raises:
            ClientError: no broker of the group answered.
            BrokerError: the broker answered with an error code.
        """
        async with self._lock(mq):
            target = await api.update_consumer_offset(self._instance, self._group, mq, offset)
            if not target.is_slave:
                self._pending.pop(mq, None)
                return True
            self._pending[mq] = offset
        logger.warning(
            "%s: offset %s=%d stored in slave %s only: sent to the master until it takes it",
            self._group,
            mq,
            offset,
            target.addr,
        )
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(
                self._resend_loop(), name=f"slave-offsets-{self._group}"
            )
        return False

    async def _resend_loop(self) -> None:
        while self._pending:
            await asyncio.sleep(RESEND_INTERVAL_MS / 1000)
            await asyncio.gather(*(self._resend(mq) for mq in sorted(self._pending)))

    async def _resend(self, mq: MessageQueue) -> bool:
        """Send `mq`'s pending offset to the master; whether nothing is pending for it now."""
        async with self._lock(mq):
            offset = self._pending.get(mq)
            if offset is None:
                return True
            try:
                taken = await api.commit_on_master(
                    self._instance, self._group, mq, offset, RESEND_TIMEOUT_MS
                )
            except (BrokerError, ClientError) as exc:
                logger.debug("%s: offset %s=%d to the master: %s", self._group, mq, offset, exc)
                return False
            if not taken:
                return False
            del self._pending[mq]  # under the lock: no newer commit replaced it meanwhile
        logger.info("%s: offset %s=%d reached the master", self._group, mq, offset)
        return True

    async def close(self) -> None:
        """Stop the re-sends after one last try on the master for what is pending."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not self._pending:
            return
        mqs = sorted(self._pending)
        sent = await asyncio.gather(*(self._resend(mq) for mq in mqs))
        if missing := [mq for mq, ok in zip(mqs, sent, strict=True) if not ok]:
            logger.warning(
                "%s: the master has not taken the offsets of %s (stored in a slave only)",
                self._group,
                ", ".join(f"{mq}={self._pending[mq]}" for mq in missing),
            )
