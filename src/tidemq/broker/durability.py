"""Durability: when a stored message may be acknowledged, and with which code.

    stored at [.., end) ─┬▶ flush (FlushService) ─────────────────┐
                         │  SYNC_FLUSH: after the fsync round     │ not in time: FLUSH_DISK_TIMEOUT
                         │  ASYNC_FLUSH: at once                  │
                         └▶ SYNC_MASTER: a slave acked >= end ────┤ FLUSH_SLAVE_TIMEOUT after
                            (HAMaster.on_acked)                   │   syncFlushTimeout, or
                            other roles: at once                  │ SLAVE_NOT_AVAILABLE at once
                          ─▶ both in: SUCCESS                     │   (none connected / in sync)

SYNC_FLUSH + SYNC_MASTER start both waits at once and answer when both are in, so a send waits
syncFlushTimeout at most, not once for the flush and once more for the slave (RocketMQ 4.x's
handleDiskFlush then handleHA did that). The flush's failure takes precedence: a
FLUSH_DISK_TIMEOUT answers at once, whatever the slave says; a slave's code answers once the
flush is in. In every error case the message *is* stored on this broker: the code tells the
producer what was not achieved (the transactional producer rolls back on FLUSH_SLAVE_TIMEOUT and
SLAVE_NOT_AVAILABLE).

A waiter is a callback `(code, remark)`, called on the event loop: a group of sends stored
together waits as one callback (send_coalesce.py), with no task or future. `wait_durable` is the
awaitable form for handlers that await. `waits` is False for ASYNC_FLUSH + ASYNC_MASTER (or
SLAVE), the common case: then a handler answers SUCCESS without calling anything here (one
attribute read on the hot path).

Controller mode (`group=True`, issue 14): the slave's part is the sync set's acknowledgement
(HAMaster.set_sync_set: every member has it; the master alone: at once), so `waits` is always
True. And an answer is fenced: a master whose etcd lease may have expired (`fence()` False at
answer time) may already have a successor that never got the message, so what would be SUCCESS
is SERVICE_NOT_AVAILABLE "master lease lost: not acknowledged" instead (the message is stored
here; the producer must not count it as acknowledged). The fence is read when the answer is
given, not when the wait starts: a lease lost while a send waited for its acks fences it too.

    SUCCESS ─▶ fence() ─┬ True ─▶ SUCCESS
                        └ False (or raised) ─▶ SERVICE_NOT_AVAILABLE (lease lost)
    any other code ─────▶ as it is
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from tidemq.broker.flush import FlushService
from tidemq.protocol.codes import ResponseCode

log = logging.getLogger(__name__)

# Called once with the answer's response code and remark ("" with SUCCESS).
DurableCallback = Callable[[int, str], None]
# `Durability.wait_durable` as the handlers that await take it: (code, remark) for an end offset.
WaitDurable = Callable[[int], Awaitable[tuple[int, str]]]
# Controller mode: whether this master's lease still holds (LeaseKeeper.valid).
Fence = Callable[[], bool]

LEASE_LOST_REMARK: Final = "master lease lost: not acknowledged"


class AckSource(Protocol):
    """What Durability needs of the HA master (broker/ha/master.py, HAMaster)."""

    def on_acked(self, end: int, callback: Callable[[int], None]) -> None:
        """Call back SUCCESS once an in-sync slave has the log up to `end`, else
        SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT."""
        ...


_SUCCESS: Final = int(ResponseCode.SUCCESS)
_FENCED: Final = int(ResponseCode.SERVICE_NOT_AVAILABLE)


def flush_timeout_remark(sync_flush_timeout_ms: int) -> str:
    """The remark of a FLUSH_DISK_TIMEOUT answer to a send (coalesced or not)."""
    return f"stored, but not flushed within {sync_flush_timeout_ms} ms"


def slave_remarks(slave_timeout_ms: int) -> dict[int, str]:
    """The remarks of the SYNC_MASTER answers other than SUCCESS, by code."""
    return {
        ResponseCode.FLUSH_SLAVE_TIMEOUT: (
            f"stored on the master, but no slave acknowledged it within {slave_timeout_ms} ms"
        ),
        ResponseCode.SLAVE_NOT_AVAILABLE: (
            "stored on the master, but no slave is in sync (none connected, or every one is "
            "more than haMaxGapNotInSync behind)"
        ),
    }


def group_remarks(slave_timeout_ms: int) -> dict[int, str]:
    """The remarks of a controller-mode master's answers other than SUCCESS, by code."""
    return {
        ResponseCode.FLUSH_SLAVE_TIMEOUT: (
            "stored on the master, but not every replica of the sync set acknowledged it "
            f"within {slave_timeout_ms} ms"
        ),
        ResponseCode.SLAVE_NOT_AVAILABLE: (
            "stored on the master, but it stopped before the sync set acknowledged it"
        ),
    }


class Durability:
    """The flush and (SYNC_MASTER) the slave's acknowledgement; one answer per waiter."""

    __slots__ = (
        "_fence",
        "_flush",
        "_flush_remark",
        "_ha",
        "_slave_remarks",
        "_sync_master",
        "waits",
    )

    def __init__(
        self,
        flush: FlushService,
        ha: AckSource | None,
        sync_master: bool,
        *,
        sync_flush_timeout_ms: int = 5_000,
        group: bool = False,
        fence: Fence | None = None,
    ) -> None:
        """`ha` is None when no HA master runs (then a SYNC_MASTER answers SLAVE_NOT_AVAILABLE,
        as with no slave connected). The slave's timeout is syncFlushTimeout, as in 4.x.
        `group`: controller mode, `ha` acknowledges by the sync set's rule (required then);
        `fence`: SUCCESS only while it returns True (module doc)."""
        if group and ha is None:
            raise ValueError("controller mode acknowledges through the HA master: none given")
        self._flush = flush
        self._ha = ha
        self._sync_master = sync_master or group
        self._fence = fence
        self._flush_remark = flush_timeout_remark(sync_flush_timeout_ms)
        remarks = group_remarks if group else slave_remarks
        self._slave_remarks = remarks(sync_flush_timeout_ms)
        # Whether an answer waits for anything: read by the send paths before calling in
        # (a fenced answer is never given without asking: the fast path would skip the fence).
        self.waits: bool = flush.sync or self._sync_master or fence is not None

    def on_durable(self, end: int, callback: DurableCallback) -> None:
        """Call `callback(code, remark)` once the log up to `end` is as durable as the role
        promises (see the module doc). Called on the event loop."""
        if self._fence is not None:
            callback = _fenced(callback, self._fence)
        if not self.waits:
            _call(callback, _SUCCESS, "")
            return
        if not self._sync_master:
            self._flush.on_flushed(end, lambda flushed: self._flushed(flushed, callback))
            return
        if not self._flush.sync:
            self._on_acked(end, callback)
            return
        both = _BothWaits(callback, self._flush_remark)
        self._flush.on_flushed(end, both.flushed)
        if not both.done:  # a flush failure already answered: the slave is not asked
            self._on_acked(end, both.acked)

    def _flushed(self, flushed: bool, callback: DurableCallback) -> None:
        if flushed:
            _call(callback, _SUCCESS, "")
        else:
            _call(callback, ResponseCode.FLUSH_DISK_TIMEOUT, self._flush_remark)

    def _on_acked(self, end: int, callback: DurableCallback) -> None:
        """The slave's answer as (code, remark); SLAVE_NOT_AVAILABLE without an HA master."""
        remarks = self._slave_remarks
        if self._ha is None:
            code = ResponseCode.SLAVE_NOT_AVAILABLE
            _call(callback, code, remarks[code])
            return
        self._ha.on_acked(end, lambda code: _call(callback, code, remarks.get(code, "")))

    async def wait_durable(self, end: int) -> tuple[int, str]:
        """The awaitable form of `on_durable`: (code, remark)."""
        if not self.waits:
            return _SUCCESS, ""
        future: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

        def release(code: int, remark: str) -> None:
            if not future.done():
                future.set_result((code, remark))

        self.on_durable(end, release)
        return await future


class _BothWaits:
    """SYNC_FLUSH + SYNC_MASTER: the flush and the slave's ack, waited at once; one answer."""

    __slots__ = ("_ack", "_callback", "_flush_remark", "_flushed", "done")

    def __init__(self, callback: DurableCallback, flush_remark: str) -> None:
        self._callback = callback
        self._flush_remark = flush_remark
        self._flushed = False
        self._ack: tuple[int, str] | None = None
        self.done = False

    def flushed(self, flushed: bool) -> None:
        if self.done:
            return
        if not flushed:  # takes precedence over any slave code, in or to come
            self._answer(ResponseCode.FLUSH_DISK_TIMEOUT, self._flush_remark)
            return
        self._flushed = True
        if self._ack is not None:
            self._answer(*self._ack)

    def acked(self, code: int, remark: str) -> None:
        if self.done:
            return
        self._ack = (code, remark)
        if self._flushed:
            self._answer(code, remark)

    def _answer(self, code: int, remark: str) -> None:
        self.done = True
        _call(self._callback, code, remark)


def _fenced(callback: DurableCallback, fence: Fence) -> DurableCallback:
    """`callback` with each SUCCESS checked against the lease when it is given."""

    def answer(code: int, remark: str) -> None:
        if code == _SUCCESS:
            try:
                holds = fence()
            except Exception:  # a fence that cannot tell is no lease
                log.exception("lease fence %r failed: not acknowledged", fence)
                holds = False
            if not holds:
                code, remark = _FENCED, LEASE_LOST_REMARK
        callback(code, remark)

    return answer


def _call(callback: DurableCallback, code: int, remark: str) -> None:
    # A waiter's failure is its own (it answers requests): the others are still answered.
    try:
        callback(code, remark)
    except Exception:
        log.exception("durability waiter %r failed", callback)
