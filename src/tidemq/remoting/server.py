"""RemotingServer: accepts TCP connections on one or more ports and serves a HandlerTable.

The broker listens on listenPort and on listenPort-2 (RocketMQ's "VIP channel", still the default
target of Java clients 4.4/4.5), so one server binds a list of ports with the same handlers.
Idle connections (no bytes in either direction for `idle_timeout_ms`) are closed, as a Java server
does after 120 s; clients heartbeat every 30 s, so only dead peers are reaped. The same sweep
closes a connection whose frame has not completed within `frame_completion_timeout_ms`, and one
FrameBudget bounds the bytes incomplete frames hold across all connections (inbound.py).
Accepting is ours too (acceptor.py), so running out of descriptors is logged and survived alike
on asyncio's loop and uvloop. `limits` (caps.py) caps the connections served, in all and per
remote address (one over a cap is closed at once), and gives each connection its in-flight bytes
bound and its send-queue wait (turns.py).

With `tls` (security/tls.py) every port speaks TLS (enforcing) or TLS and plaintext by the first
byte (permissive); the context is built in the constructor, so a bad certificate or key fails
the start with the setting's name. A connection's `tls` and `peer_cert_subject` say how it came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Final

from tidemq.clock import Clock, SystemClock
from tidemq.limits import FRAME_SIZE_MAX
from tidemq.remoting.acceptor import Acceptor, AcceptTls, accept_tls, listen
from tidemq.remoting.caps import ConnectionCaps, ConnectionLimits
from tidemq.remoting.connection import TURN_BUDGET, Connection
from tidemq.remoting.handlers import HandlerTable, RequestHook
from tidemq.remoting.inbound import (
    FRAME_COMPLETION_TIMEOUT_MS,
    INCOMPLETE_FRAME_BYTES_MAX,
    FrameBudget,
    frame_bytes_held_max,
)
from tidemq.remoting.log_limit import LogLimit
from tidemq.security.tls import TlsServerSettings

logger = logging.getLogger(__name__)

# As a Java server's channel idle time; three missed client heartbeats and then some.
IDLE_TIMEOUT_MS_DEFAULT: Final = 120_000
# The sweep runs this many times per idle period (or frame completion timeout, if shorter), so a
# connection is closed at most a quarter period late.
_SWEEPS_PER_TIMEOUT: Final = 4
# How long `stop` lets its connections close cleanly (flush, TLS close_notify) before dropping
# the rest.
STOP_GRACE_MS: Final = 1_000

ConnectionListener = Callable[[Connection], None]


class RemotingServer:
    """Serve `handlers` on `host`:`port` (0 picks a free port) and on each of `extra_ports`.

    `turn_budget`: how much of one read a connection starts in the iteration that read it
    (None: all of it); see remoting/connection.py. `incomplete_frame_bytes_max` and
    `frame_completion_timeout_ms`: the limits on incomplete frames (remoting/inbound.py).
    """

    def __init__(
        self,
        handlers: HandlerTable,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        name: str = "remoting",
        frame_size_max: int = FRAME_SIZE_MAX,
        request_hook: RequestHook | None = None,
        idle_timeout_ms: int = IDLE_TIMEOUT_MS_DEFAULT,
        extra_ports: Sequence[int] = (),
        clock: Clock | None = None,
        turn_budget: int | None = TURN_BUDGET,
        incomplete_frame_bytes_max: int = INCOMPLETE_FRAME_BYTES_MAX,
        frame_completion_timeout_ms: int = FRAME_COMPLETION_TIMEOUT_MS,
        tls: TlsServerSettings | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        assert idle_timeout_ms > 0
        assert frame_completion_timeout_ms > 0
        # Below one maximal frame, a legitimate maximal frame could never be received.
        assert incomplete_frame_bytes_max >= frame_bytes_held_max(frame_size_max)
        self._handlers = handlers
        self._host = host
        self._port_requested = port
        self._extra_ports = tuple(extra_ports)
        self.name = name
        self._frame_size_max = frame_size_max
        self._request_hook = request_hook
        self._idle_timeout_ms = idle_timeout_ms
        self._turn_budget = turn_budget
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._frame_completion_timeout_ms = frame_completion_timeout_ms
        self.frame_budget = FrameBudget(incomplete_frame_bytes_max, LogLimit(logger, self._clock))
        # One limit per kind of trouble, so a storm of one kind does not hide the others.
        self._timeout_log = LogLimit(logger, self._clock)
        self._accept_log = LogLimit(logger, self._clock)
        self._limits = limits if limits is not None else ConnectionLimits()
        self.caps = ConnectionCaps(self._limits, LogLimit(logger, self._clock), name=name)
        self._tls = accept_tls(tls, LogLimit(logger, self._clock))
        self._acceptors: list[Acceptor] = []
        self._ports: list[int] = []
        self._connections: set[Connection] = set()
        self._open_listeners: list[ConnectionListener] = []
        self._close_listeners: list[ConnectionListener] = []
        self._idle_task: asyncio.Task[None] | None = None

    @property
    def ports(self) -> list[int]:
        """The bound ports, the main one first (real numbers after `start`, even for port 0)."""
        return list(self._ports)

    @property
    def port(self) -> int:
        """The main bound port."""
        assert self._ports, "server not started"
        return self._ports[0]

    @property
    def handlers(self) -> HandlerTable:
        """The table served: `handlers.codes()` are the request codes a peer may send."""
        return self._handlers

    @property
    def connections(self) -> set[Connection]:
        return set(self._connections)

    @property
    def pending_connections(self) -> int:
        """Accepted connections not yet served: sniffed or in their TLS handshake."""
        return sum(acceptor.pending for acceptor in self._acceptors)

    def add_connection_listener(
        self,
        on_open: ConnectionListener | None = None,
        on_close: ConnectionListener | None = None,
    ) -> None:
        """Call `on_open(connection)` for each accepted connection and `on_close` when it ends."""
        if on_open is not None:
            self._open_listeners.append(on_open)
        if on_close is not None:
            self._close_listeners.append(on_close)

    async def start(self) -> None:
        """Bind every port and start accepting.

        Raises:
            OSError: a port could not be bound (nothing stays bound).
        """
        assert not self._acceptors, "server already started"
        try:
            for port in (self._port_requested, *self._extra_ports):
                acceptor = Acceptor(
                    listen(self._host, port),
                    self._new_protocol,
                    name=self.name,
                    log=self._accept_log,
                    tls=self._tls,
                    per_address_max=self._limits.connections_per_address_max,
                    served_from=self.caps.from_address,
                )
                self._acceptors.append(acceptor)
                self._ports.append(acceptor.port)
        except OSError:
            await self._close_servers()
            raise
        for acceptor in self._acceptors:
            acceptor.start()
        loop = asyncio.get_running_loop()
        self._idle_task = loop.create_task(self._sweep(), name=f"{self.name}-sweep")
        logger.info(
            "%s listening on %s ports %s%s",
            self.name,
            self._host,
            self._ports,
            _tls_words(self._tls),
        )

    async def stop(self) -> None:
        """Stop accepting, close every connection and cancel the handlers still running.
        Connections not closed STOP_GRACE_MS after (a peer that never reads) are dropped."""
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
            self._idle_task = None
        await self._close_servers()
        connections = list(self._connections)
        for connection in connections:
            connection.close()
        if connections:
            # A peer that never reads holds a close (queued writes, TLS close_notify): drop
            # what has not closed after a short grace.
            closing = asyncio.gather(*(connection.wait_closed() for connection in connections))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(closing), STOP_GRACE_MS / 1000)
            for connection in connections:
                if not connection.closed:
                    connection.abort()
            await closing
        for connection in connections:
            await connection.cancel_tasks()
        if connections or self._ports:
            logger.info("%s stopped", self.name)

    async def _close_servers(self) -> None:
        acceptors, self._acceptors = self._acceptors, []
        for acceptor in acceptors:
            await acceptor.close()

    def _new_protocol(self) -> asyncio.Protocol:
        return Connection(
            self._handlers,
            clock=self._clock,
            frame_size_max=self._frame_size_max,
            frame_budget=self.frame_budget,
            request_hook=self._request_hook,
            read_while_blocked=False,
            turn_budget=self._turn_budget,
            on_open=self._on_open,
            on_close=self._on_close,
            in_flight_bytes_max=self._limits.in_flight_bytes_max or None,
            send_wait_ms_max=self._limits.send_wait_ms_max,
        )

    def _on_open(self, connection: Connection) -> None:
        if not self.caps.admit(connection):
            connection.abort()  # never served: _on_close ignores it
            return
        self._connections.add(connection)
        logger.debug("%s: connection from %s", self.name, connection.peer_text)
        for listener in self._open_listeners:
            try:
                listener(connection)
            except Exception:
                logger.exception("%s: connection-open listener failed", self.name)

    def _on_close(self, connection: Connection) -> None:
        if connection not in self._connections:
            return  # refused by a cap in _on_open
        self._connections.discard(connection)
        self.caps.release(connection)
        logger.debug("%s: connection from %s closed", self.name, connection.peer_text)
        for listener in self._close_listeners:
            try:
                listener(connection)
            except Exception:
                logger.exception("%s: connection-close listener failed", self.name)

    async def _sweep(self) -> None:
        timeout_ms = min(self._idle_timeout_ms, self._frame_completion_timeout_ms)
        interval_s = timeout_ms / _SWEEPS_PER_TIMEOUT / 1000
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self._clock.monotonic_ms()
            for connection in list(self._connections):
                self._sweep_one(connection, now_ms)

    def _sweep_one(self, connection: Connection, now_ms: float) -> None:
        """Close `connection` if it is idle, or if its current frame is overdue. A frame is not
        overdue while we stopped reading it (backpressure): the delay is ours, not the peer's."""
        since_ms = connection.incomplete_frame_since_ms
        overdue = since_ms is not None and now_ms - since_ms >= self._frame_completion_timeout_ms
        if overdue and not connection.reading_paused:
            assert since_ms is not None
            self._timeout_log.warning(
                "%s: closing %s: a frame incomplete for %d ms (limit %d ms)",
                self.name,
                connection.peer_text,
                now_ms - since_ms,
                self._frame_completion_timeout_ms,
            )
            connection.abort()
        elif now_ms - connection.last_activity_ms >= self._idle_timeout_ms:
            logger.info(
                "%s: closing %s, idle for %d ms",
                self.name,
                connection.peer_text,
                now_ms - connection.last_activity_ms,
            )
            connection.close()


def _tls_words(tls: AcceptTls | None) -> str:
    if tls is None:
        return ""
    return " (TLS and plaintext)" if tls.permissive else " (TLS only)"
