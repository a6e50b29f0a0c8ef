"""Acceptor: the accept loop of one listening socket, ours rather than the event loop's, so that a
full descriptor table is reported and survived the same way on every loop.

Out of file descriptors (EMFILE, or ENFILE system-wide), accept() fails while new connections
wait in the kernel's listen backlog. The two loops we run on handle that badly, in opposite ways:

    asyncio  logs a traceback per failed accept (hundreds a second) and retries after 1 s
    uvloop   (libuv) accepts each waiting connection with a reserved descriptor and closes it at
             once, saying nothing: clients see resets, the operator sees a broker that "stops
             accepting" with an empty log

Here a failed accept logs one line (rate-limited per server, log_limit.py) naming the error and
the descriptor limit, stops watching the socket for ACCEPT_RETRY_DELAY_MS, and tries again; the
waiting connections stay in the backlog and are accepted once descriptors are free again.
An error of the one connection being accepted (ECONNABORTED, EPROTO, ...) only drops that
connection: accepting goes on at once. Watching the socket needs `loop.add_reader`, so servers
run on POSIX loops (asyncio's selector loop, uvloop); the broker's store is POSIX-only anyway.

TLS (security/tls.py): with an `AcceptTls`, each accepted connection is wrapped before it is
handed over, `connect_accepted_socket(..., ssl=...)` on both loops. In permissive mode the
acceptor first waits for the connection's first byte and peeks at it (MSG_PEEK: the byte stays
for whoever reads next): 0x16, a TLS handshake record, means TLS; anything else is a plaintext
remoting frame. Waiting and handshaking together are bounded by the handshake timeout (one
deadline from the accept), so a socket that says nothing is closed then, not held forever; those
connections are `pending` meanwhile. Pending connections count against the per-address cap with
the ones served from that address (caps.py: a newcomer over it is closed at once), and there are
at most TLS_PENDING_MAX per port: beyond it a newcomer evicts the oldest pending connection of
the address holding the most, so one source's silent sockets cannot push out anyone else's
handshakes. A failed handshake (a plaintext client on an enforcing port, an untrusted client
certificate) is one rate-limited log line, never a traceback; a peer that closes or resets
before its first byte (a port probe) is not logged. A TLS connection's closing waits at most
SSL_SHUTDOWN_TIMEOUT_MS for the peer's close_notify, then drops the connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidemq.remoting.log_limit import LogLimit
from tidemq.security.tls import TLS_HANDSHAKE_RECORD, TlsMode, TlsServerSettings, server_context

# Servers need a POSIX loop (add_reader); the client, which imports this package too, must still
# import on Windows, where there is no descriptor limit to read or raise.
if sys.platform != "win32":
    import resource

logger = logging.getLogger(__name__)

# How long accepting pauses after accept() failed for want of resources: as asyncio's
# ACCEPT_RETRY_DELAY, long enough not to spin on a full table, short enough to serve soon after.
ACCEPT_RETRY_DELAY_MS: Final = 1_000
# Connections accepted per readiness callback, so a connection storm cannot starve the reads of
# established connections (asyncio accepts up to its backlog per callback).
ACCEPTS_PER_WAKEUP_MAX: Final = 128
# The listen backlog, as RocketMQ's serverSocketBacklog: connections a burst may leave waiting.
LISTEN_BACKLOG: Final = 1024
# Connections of one TLS port between accept and the end of their handshake (permissive: before
# their first byte, too). A real client finishes in a round trip or two; beyond this many, a
# newcomer evicts the oldest (as the HA port does its pending peers), so silent sockets hold at
# most this many descriptors per port and can never lock clients out. As large as the backlog:
# a reconnect storm after a restart fits.
TLS_PENDING_MAX: Final = 1024
# How long closing a TLS connection waits for the peer's close_notify before dropping it: a peer
# that never reads would otherwise hold it (and a server's stop) for asyncio's 30 s default.
SSL_SHUTDOWN_TIMEOUT_MS: Final = 2_000

# accept() errors that mean "no resources now" rather than "this connection failed".
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() errors of the one connection being accepted, not of the listening socket: Linux
# passes a new connection's pending network error on from accept(), to be treated "like EAGAIN
# by retrying" (accept(2)); EPERM is a firewall's refusal. Backing off for these would let any
# peer whose handshake goes wrong stop accepting for ACCEPT_RETRY_DELAY_MS (asyncio does not).
_CONNECTION_ERRNOS: Final = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "EPERM",
        "ENETDOWN",
        "ENETUNREACH",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENONET",
        "EOPNOTSUPP",
    )
    if hasattr(errno, name)
)

ProtocolFactory = Callable[[], asyncio.Protocol]


@dataclass(frozen=True, slots=True)
class AcceptTls:
    """How an acceptor wraps connections: `permissive` sniffs the first byte (plaintext stays
    plaintext), else every connection is TLS; `log` reports failed handshakes."""

    context: ssl.SSLContext
    permissive: bool
    handshake_timeout_ms: int
    log: LogLimit


def accept_tls(settings: TlsServerSettings | None, log: LogLimit) -> AcceptTls | None:
    """An acceptor's TLS part from a port's settings; None when TLS is off.

    Raises:
        TlsConfigError: a certificate, key or trust file is missing or does not fit.
    """
    if settings is None or not settings.enabled:
        return None
    return AcceptTls(
        server_context(settings),
        permissive=settings.mode is TlsMode.PERMISSIVE,
        handshake_timeout_ms=settings.handshake_timeout_ms,
        log=log,
    )


class _ClosedFirst(Exception):
    """A permissive port's connection closed (or reset) before sending a byte (a port probe, a
    load balancer's health check): closed without a warning."""


class ListenError(OSError):
    """A port could not be bound (in use, privileged, an address this host does not have).
    Carries the host and port so the edge (the CLI) can name the setting that chose them."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.host = host
        self.port = port

    @property
    def in_use(self) -> bool:
        return self.errno == errno.EADDRINUSE

    def __str__(self) -> str:
        return f"cannot listen on {self.host}:{self.port}: {self.strerror}"


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on `host`:`port` (0 picks a free port), with
    SO_REUSEADDR so a restarted server can bind while old connections linger in TIME_WAIT.

    Raises:
        ListenError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        raise ListenError(host, port, exc) from exc
    sock.setblocking(False)
    return sock


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE: how many descriptors this process may hold (-1: no such limit)."""
    if sys.platform == "win32":
        return -1
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Acceptor:
    """Accepts connections on `sock` and hands each to the loop with a protocol from `factory`."""

    def __init__(
        self,
        sock: socket.socket,
        factory: ProtocolFactory,
        *,
        name: str,
        log: LogLimit,
        tls: AcceptTls | None = None,
        per_address_max: int = 0,
        served_from: Callable[[str], int] | None = None,
    ) -> None:
        """`per_address_max` (0: none) caps the TLS connections pending from one address plus
        those `served_from(address)` (caps.py's maxConnectionsPerAddress)."""
        self._sock = sock
        self._tls = tls
        self._per_address_max = per_address_max
        self._served_from = served_from
        self._factory = factory
        self._name = name
        self._log = log
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        # Task → remote address; per address in accept order: with TLS the oldest pending one
        # of the address holding the most is evicted first.
        self._handovers: dict[asyncio.Task[None], str] = {}
        self._pending_from: dict[str, dict[asyncio.Task[None], None]] = {}
        self.port: int = sock.getsockname()[1]
        self.accept_failures = 0

    def start(self) -> None:
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    @property
    def pending(self) -> int:
        """Connections accepted and not yet handed over: with TLS, those still sniffed or in
        their handshake (each holds a descriptor until the handshake timeout at most)."""
        return len(self._handovers)

    async def close(self) -> None:
        """Stop accepting and close the listening socket; connections already handed over stay."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self._handovers:
            if self._tls is not None:  # a silent peer must not hold the stop for its timeout
                for task in self._handovers:
                    task.cancel()
            await asyncio.gather(*self._handovers, return_exceptions=True)

    def _on_readable(self) -> None:
        if self._sock.fileno() < 0:
            return  # closed by `close` after this callback was queued
        for _ in range(ACCEPTS_PER_WAKEUP_MAX):
            try:
                connection, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _CONNECTION_ERRNOS:
                    # That connection is lost (e.g. the peer gave up while in the backlog); the
                    # next one may be fine.
                    logger.debug("%s: accept on port %d: %s", self._name, self.port, exc)
                    continue
                self._back_off(exc)
                return
            self._hand_over(connection)

    def _back_off(self, exc: OSError) -> None:
        """Stop watching the socket for a while: the failure would repeat at once."""
        self.accept_failures += 1
        if exc.errno in _RESOURCE_ERRNOS:
            self._log.warning(
                "%s: cannot accept connections on port %d: %s (open files limit %d); "
                "waiting connections stay queued, retrying every %d ms",
                self._name,
                self.port,
                exc.strerror,
                open_files_limit(),
                ACCEPT_RETRY_DELAY_MS,
            )
        else:
            self._log.warning(
                "%s: accept on port %d failed: %s; retrying in %d ms",
                self._name,
                self.port,
                exc,
                ACCEPT_RETRY_DELAY_MS,
            )
        self._loop.remove_reader(self._sock.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY_MS / 1000, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self._sock.fileno() >= 0:
            self.start()
            self._on_readable()

    def _hand_over(self, connection: socket.socket) -> None:
        try:
            connection.setblocking(False)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            host = str(connection.getpeername()[0])
        except OSError as exc:  # e.g. reset already (EINVAL on BSDs): close it, go on accepting
            connection.close()
            logger.debug("%s: dropping a connection just accepted: %s", self._name, exc)
            return
        if self._tls is not None and not self._make_room(host, self._tls):
            connection.close()
            return
        task = self._loop.create_task(self._connect(connection))
        self._handovers[task] = host
        self._pending_from.setdefault(host, {})[task] = None
        task.add_done_callback(self._forget_handover)

    def _forget_handover(self, task: asyncio.Task[None]) -> None:
        host = self._handovers.pop(task, None)
        if host is None:
            return  # evicted already
        tasks = self._pending_from[host]
        del tasks[task]
        if not tasks:
            del self._pending_from[host]

    def _make_room(self, host: str, tls: AcceptTls) -> bool:
        """Whether a newcomer from `host` may start its handshake: not over the per-address cap
        (False: the caller closes it), and room made by evicting the oldest pending connection
        of the address holding the most when the port has TLS_PENDING_MAX pending."""
        if self._per_address_max:
            pending = len(self._pending_from.get(host, ()))
            served = self._served_from(host) if self._served_from is not None else 0
            if pending + served >= self._per_address_max:
                tls.log.warning(
                    "%s: closing a new connection from %s: %d in their TLS handshake and %d"
                    " served from it, the limit (maxConnectionsPerAddress)",
                    self._name,
                    host,
                    pending,
                    served,
                )
                return False
        if len(self._handovers) >= TLS_PENDING_MAX:
            largest, tasks = max(self._pending_from.items(), key=lambda item: len(item[1]))
            oldest = next(iter(tasks))
            self._forget_handover(oldest)
            oldest.cancel()  # _connect closes its socket
            tls.log.warning(
                "%s: %d connections on port %d still in their TLS handshake: closing the oldest"
                " of the %d from %s",
                self._name,
                TLS_PENDING_MAX,
                self.port,
                len(tasks) + 1,
                largest,
            )
        return True

    async def _connect(self, connection: socket.socket) -> None:
        # Whatever fails, the descriptor is closed here: a transport that took it over detached
        # (uvloop) or shares (asyncio) this socket object, so the second close is a no-op.
        try:
            if self._tls is None:
                await self._loop.connect_accepted_socket(self._factory, connection)
            else:
                await self._connect_tls(connection, self._tls)
        except OSError as exc:
            connection.close()
            self._log.warning("%s: dropping a connection just accepted: %s", self._name, exc)
        except Exception:
            connection.close()
            logger.exception("%s: cannot serve a connection just accepted", self._name)
        except BaseException:  # cancelled (stop): never leak the descriptor
            connection.close()
            raise

    async def _connect_tls(self, connection: socket.socket, tls: AcceptTls) -> None:
        """Hand `connection` over wrapped in TLS, or as it is when a permissive port sees a
        plaintext first byte. A failed or timed-out handshake closes it with one log line."""
        try:
            peer = connection.getpeername()
        except OSError:
            peer = "?"
        # One deadline for the first byte and the handshake together.
        deadline = self._loop.time() + tls.handshake_timeout_ms / 1000
        try:
            async with asyncio.timeout_at(deadline):
                if tls.permissive and not await self._tls_first(connection):
                    await self._loop.connect_accepted_socket(self._factory, connection)
                    return
            await self._loop.connect_accepted_socket(
                self._factory,
                connection,
                ssl=tls.context,
                ssl_handshake_timeout=max(deadline - self._loop.time(), 0.001),
                ssl_shutdown_timeout=SSL_SHUTDOWN_TIMEOUT_MS / 1000,
            )
        except _ClosedFirst:
            connection.close()
            logger.debug("%s: %s closed before sending anything", self._name, _peer_text(peer))
        except TimeoutError:
            connection.close()
            tls.log.warning(
                "%s: closing a connection from %s: nothing sent in %d ms",
                self._name,
                _peer_text(peer),
                tls.handshake_timeout_ms,
            )
        except (OSError, EOFError) as exc:  # ssl.SSLError is an OSError
            connection.close()
            tls.log.warning(
                "%s: TLS handshake with %s failed: %s",
                self._name,
                _peer_text(peer),
                exc or type(exc).__name__,
            )

    async def _tls_first(self, connection: socket.socket) -> bool:
        """Wait for `connection`'s first byte and peek at it: True for a TLS handshake record.

        Raises:
            _ClosedFirst: the peer closed before sending anything.
        """
        while True:
            readable = self._loop.create_future()
            fd = connection.fileno()
            self._loop.add_reader(fd, _set_once, readable)
            try:
                await readable
            finally:
                self._loop.remove_reader(fd)
            try:
                first = connection.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except ConnectionResetError:  # connected, then reset: a probe, as a close is
                raise _ClosedFirst from None
            if not first:
                raise _ClosedFirst
            return first[0] == TLS_HANDSHAKE_RECORD


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _peer_text(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, once at process start.

    Every connection costs a descriptor, and the usual soft default (1024) is a few hundred
    clients once the store's files are open; the hard limit is what the operator allows us.

    Returns:
        (soft before, soft now). They are equal when the soft limit already was the hard one or
        the system refused the change (logged).
    """
    if sys.platform == "win32":
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        # macOS refuses an unlimited soft limit (OPEN_MAX); keep the soft one and say so.
        logger.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, exc)
        return soft, soft
    return soft, hard
