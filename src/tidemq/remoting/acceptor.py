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
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
from collections.abc import Callable
from typing import Final

from tidemq.remoting.log_limit import LogLimit

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


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on `host`:`port` (0 picks a free port), with
    SO_REUSEADDR so a restarted server can bind while old connections linger in TIME_WAIT.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
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
        self, sock: socket.socket, factory: ProtocolFactory, *, name: str, log: LogLimit
    ) -> None:
        self._sock = sock
        self._factory = factory
        self._name = name
        self._log = log
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        self._handovers: set[asyncio.Task[None]] = set()
        self.port: int = sock.getsockname()[1]
        self.accept_failures = 0

    def start(self) -> None:
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    async def close(self) -> None:
        """Stop accepting and close the listening socket; connections already handed over stay."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self._handovers:
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
        except OSError as exc:  # e.g. reset already (EINVAL on BSDs): close it, go on accepting
            connection.close()
            logger.debug("%s: dropping a connection just accepted: %s", self._name, exc)
            return
        task = self._loop.create_task(self._connect(connection))
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)

    async def _connect(self, connection: socket.socket) -> None:
        # Whatever fails, the descriptor is closed here: a transport that took it over detached
        # (uvloop) or shares (asyncio) this socket object, so the second close is a no-op.
        try:
            await self._loop.connect_accepted_socket(self._factory, connection)
        except OSError as exc:
            connection.close()
            self._log.warning("%s: dropping a connection just accepted: %s", self._name, exc)
        except Exception:
            connection.close()
            logger.exception("%s: cannot serve a connection just accepted", self._name)
        except BaseException:  # cancelled (stop): never leak the descriptor
            connection.close()
            raise


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
