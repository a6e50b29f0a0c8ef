"""PendingRequests: our requests on one connection that await the peer's answer, by opaque.

The peer answers with the request's opaque, in any order. This table gives out the opaques and
completes each waiter exactly once: with the answer, a RequestTimeoutError, or, when the
connection closes, a ConnectionClosedError. It is the connection's requester side, kept apart
from serving the peer's requests, which changes for other reasons (turns, backpressure).
"""

from __future__ import annotations

import logging
from typing import Final

from tidemq.errors import ConnectionClosedError, RequestTimeoutError
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.handlers import ResponseWaiter

logger = logging.getLogger("tidemq.remoting.connection")

# Opaques stay within a signed 32-bit int and non-negative, as the C++ client's do.
_OPAQUE_MASK: Final = 0x7FFFFFFF


class PendingRequests:
    """Waiters by opaque, and the next opaque to give out."""

    __slots__ = ("_next_opaque", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[int, ResponseWaiter] = {}
        self._next_opaque = 0

    def __len__(self) -> int:
        return len(self._waiters)

    def allocate(self) -> int:
        """The next opaque, skipping those still pending after a wrap (a request held for 2^31
        requests)."""
        opaque = self._next_opaque
        while opaque in self._waiters:
            opaque = (opaque + 1) & _OPAQUE_MASK
        self._next_opaque = (opaque + 1) & _OPAQUE_MASK
        return opaque

    def add(self, opaque: int, waiter: ResponseWaiter) -> None:
        self._waiters[opaque] = waiter

    def discard(self, opaque: int) -> None:
        """Forget `opaque` (its answer, if one comes, is dropped)."""
        self._waiters.pop(opaque, None)

    def answer(self, cmd: RemotingCommand, peer_text: str) -> None:
        """Complete the waiter of the response `cmd`; drop a response nobody waits for."""
        waiter = self._waiters.pop(cmd.opaque, None)
        if waiter is None or waiter.done():
            logger.debug(
                "dropping response code %d opaque %d from %s: no pending request",
                cmd.code,
                cmd.opaque,
                peer_text,
            )
            return
        waiter.set_result(cmd)

    def expire(self, opaque: int, message: str) -> None:
        """Fail the waiter of `opaque`, if still pending, with RequestTimeoutError(message)."""
        waiter = self._waiters.pop(opaque, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(RequestTimeoutError(message))

    def fail_all(self, peer_text: str) -> None:
        """The connection closed: fail every waiter with ConnectionClosedError."""
        waiters = list(self._waiters.values())
        self._waiters.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionClosedError(f"connection to {peer_text} closed"))
