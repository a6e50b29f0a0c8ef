"""Connection caps: how many connections a server serves, in all and per remote address, and
the per-connection limits it gives each one.

    accepted ─▶ admit(connection): under both caps? ─▶ served (counted until it closes)
                                 └ over one ─▶ closed at once, before a byte is read, with one
                                   log line (rate-limited per server) naming the address and cap

Why both: the total bounds what the process holds (a descriptor, buffers and a few KiB of state
per connection), the per-address cap keeps one host (a runaway client restarting in a loop, a
scanner) from taking the whole total. Upstream's brokers have neither and rely on the operating
system's descriptor limit; a refused peer sees its connection closed, as upstream closes a
channel it will not serve, and its client reconnects later.

Defaults: 10,000 connections in all and 1,000 per address. A client instance (each producer or
consumer process) holds one connection per broker and name server, plus one on the VIP port for
Java 4.4/4.5 clients; thousands of client processes are a large deployment for one broker, and
a few hundred processes behind one NAT address or on one host stay under the per-address cap.
0 means no cap (the descriptor limit remains, remoting/acceptor.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from tidemq.remoting.connection import IN_FLIGHT_BYTES_MAX, Connection
from tidemq.remoting.log_limit import LogLimit

logger = logging.getLogger(__name__)

# maxConnections and maxConnectionsPerAddress (see the module docstring).
CONNECTIONS_MAX_DEFAULT: Final = 10_000
CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: Final = 1_000


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A server's caps and its connections' limits. 0 (or None) means no cap.

    Attributes:
        connections_max: connections served at once (maxConnections).
        connections_per_address_max: of those, from one remote address
            (maxConnectionsPerAddress).
        in_flight_bytes_max: body bytes of one connection's requests in flight before it reads
            no more (maxInFlightBytesPerConnection; remoting/turns.py).
        send_wait_ms_max: a send that waited this long in a connection's backlog is answered
            SYSTEM_BUSY (waitTimeMillsInSendQueue with brokerFastFailureEnable; turns.py).
    """

    connections_max: int = CONNECTIONS_MAX_DEFAULT
    connections_per_address_max: int = CONNECTIONS_PER_ADDRESS_MAX_DEFAULT
    in_flight_bytes_max: int = IN_FLIGHT_BYTES_MAX
    send_wait_ms_max: float | None = None

    def __post_init__(self) -> None:
        assert self.connections_max >= 0
        assert self.connections_per_address_max >= 0
        assert self.in_flight_bytes_max >= 0
        assert self.send_wait_ms_max is None or self.send_wait_ms_max >= 0


class ConnectionCaps:
    """Counts a server's connections, in all and by remote host, and refuses those over a cap."""

    __slots__ = ("_limits", "_log", "_name", "_per_address", "refused", "total")

    def __init__(self, limits: ConnectionLimits, log: LogLimit, *, name: str) -> None:
        self._limits = limits
        self._log = log
        self._name = name
        self._per_address: dict[str, int] = {}
        self.total = 0
        self.refused = 0

    def admit(self, connection: Connection) -> bool:
        """Count `connection` and return True, or log and return False (the caller closes it)."""
        host = connection.peer[0]
        from_host = self._per_address.get(host, 0)
        limits = self._limits
        if limits.connections_max and self.total >= limits.connections_max:
            why = f"{self.total} connections served, the limit (maxConnections)"
        elif limits.connections_per_address_max and (
            from_host >= limits.connections_per_address_max
        ):
            why = f"{from_host} connections from {host}, the limit (maxConnectionsPerAddress)"
        else:
            self.total += 1
            self._per_address[host] = from_host + 1
            return True
        self.refused += 1
        self._log.warning(
            "%s: closing a new connection from %s: %s", self._name, connection.peer_text, why
        )
        return False

    def release(self, connection: Connection) -> None:
        """An admitted connection closed."""
        host = connection.peer[0]
        self.total -= 1
        left = self._per_address.get(host, 0) - 1
        if left > 0:
            self._per_address[host] = left
        else:
            self._per_address.pop(host, None)

    def from_address(self, host: str) -> int:
        """Connections served from `host`."""
        return self._per_address.get(host, 0)
