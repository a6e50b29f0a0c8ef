"""RemotingClient: one connection per "host:port", opened lazily and reopened after a close.

RocketMQ clients keep a single socket per broker and per name server and multiplex every request
over it; so does this pool. Concurrent first calls to an address share one connect attempt. The
client's own HandlerTable serves requests the server sends over these connections
(CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO).

With a `signer` (tidemq.security.signing.sign bound to an account's Credentials), every request
sent over the pool's connections is signed as it leaves; the answers we give the server are not.

With `ssl` (an ssl.SSLContext, security/tls.py's client_context) every connection is TLS; the
server's certificate is checked against the host of the address dialled (an IP address needs an
IP subjectAltName) unless `server_hostname` names the host to check instead. A handshake that
fails (an untrusted certificate, a server without TLS) is a ConnectFailedError saying why.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from typing import Final

from tidemq.clock import Clock, SystemClock
from tidemq.errors import ClientClosedError, ConnectFailedError, ConnectionClosedError
from tidemq.limits import FRAME_SIZE_MAX
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.address import parse_address
from tidemq.remoting.connection import Connection, Signer
from tidemq.remoting.handlers import HandlerTable

logger = logging.getLogger(__name__)

# As RocketMQ's connectTimeoutMillis.
CONNECT_TIMEOUT_MS_DEFAULT: Final = 3_000


class RemotingClient:
    """A pool of Connections keyed by address; the transport under producers and consumers."""

    def __init__(
        self,
        handlers: HandlerTable | None = None,
        *,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS_DEFAULT,
        frame_size_max: int = FRAME_SIZE_MAX,
        clock: Clock | None = None,
        signer: Signer | None = None,
        ssl: ssl_module.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self._handlers = handlers if handlers is not None else HandlerTable()
        self._ssl = ssl
        self._server_hostname = server_hostname
        # Applied to every request our connections send (the ACL signature); not to answers.
        self._signer = signer
        self._connect_timeout_ms = connect_timeout_ms
        self._frame_size_max = frame_size_max
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._closed = False

    @property
    def connections(self) -> dict[str, Connection]:
        """The open connections by address."""
        return {addr: c for addr, c in self._connections.items() if not c.closed}

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: float) -> RemotingCommand:
        """Send a request to `addr` and await the response.

        Raises:
            RequestTimeoutError: no response in `timeout_ms` (the connection stays open).
            ConnectionClosedError: could not connect, or the connection closed first.
            ClientClosedError: this client was closed.
        """
        connection = await self.connection(addr)
        return await connection.request(cmd, timeout_ms)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        """Send a oneway request to `addr` (no response is expected).

        Raises:
            ConnectionClosedError: could not connect, or the connection is closed.
            ClientClosedError: this client was closed.
        """
        connection = await self.connection(addr)
        await connection.oneway(cmd)

    def ready_connection(self, addr: str) -> Connection | None:
        """The open connection to `addr` if it takes writes now (not paused), else None: the
        synchronous half of `connection`, for callers with a coroutine path to fall back to."""
        connection = self._connections.get(addr)
        if connection is None or connection.closed or connection.writing_paused or self._closed:
            return None
        return connection

    async def connection(self, addr: str) -> Connection:
        """The open connection to `addr`, connecting first if there is none.

        Raises:
            ConnectionClosedError: the connect failed or timed out.
            ClientClosedError: this client was closed.
        """
        if self._closed:
            raise ClientClosedError("remoting client is closed")
        existing = self._connections.get(addr)
        if existing is not None and not existing.closed:
            return existing
        attempt = self._connecting.get(addr)
        if attempt is None:
            attempt = asyncio.ensure_future(self._connect(addr))
            self._connecting[addr] = attempt
            attempt.add_done_callback(lambda _: self._connecting.pop(addr, None))
        # Shielded: one caller giving up (its own timeout) must not cancel the shared attempt.
        return await asyncio.shield(attempt)

    async def close(self) -> None:
        """Close every connection and cancel handlers still running on them. Idempotent."""
        self._closed = True
        for attempt in list(self._connecting.values()):
            attempt.cancel()
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.close()
        for connection in connections:
            await connection.wait_closed()
            await connection.cancel_tasks()

    async def _connect(self, addr: str) -> Connection:
        try:
            host, port = parse_address(addr)
        except ValueError as exc:
            raise ConnectionClosedError(str(exc)) from None
        loop = asyncio.get_running_loop()
        connection = Connection(
            self._handlers,
            clock=self._clock,
            frame_size_max=self._frame_size_max,
            signer=self._signer,
        )
        try:
            async with asyncio.timeout(self._connect_timeout_ms / 1000):
                if self._ssl is None:
                    await loop.create_connection(lambda: connection, host, port)
                else:
                    await loop.create_connection(
                        lambda: connection,
                        host,
                        port,
                        ssl=self._ssl,
                        server_hostname=self._server_hostname or host,
                        ssl_handshake_timeout=self._connect_timeout_ms / 1000,
                    )
        except TimeoutError:
            raise ConnectFailedError(
                f"connect to {addr} timed out after {self._connect_timeout_ms} ms"
            ) from None
        except ssl_module.SSLCertVerificationError as exc:
            raise ConnectFailedError(
                f"TLS connect to {addr} failed: the server's certificate did not verify: "
                f"{exc.verify_message or exc}"
            ) from None
        except ssl_module.SSLError as exc:
            raise ConnectFailedError(f"TLS connect to {addr} failed: {exc}") from None
        except OSError as exc:
            tls = "TLS " if self._ssl is not None else ""
            raise ConnectFailedError(f"{tls}connect to {addr} failed: {exc}") from None
        if self._closed:
            connection.close()
            raise ClientClosedError("remoting client is closed")
        self._connections[addr] = connection
        connection.add_close_listener(lambda closed: self._forget(addr, closed))
        logger.debug("connected to %s", addr)
        return connection

    def _forget(self, addr: str, connection: Connection) -> None:
        if self._connections.get(addr) is connection:
            del self._connections[addr]
