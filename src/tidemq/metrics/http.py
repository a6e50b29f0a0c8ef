"""MetricsServer: GET /metrics in the Prometheus text format, served by uvicorn on the server's
own event loop.

Why on the loop and not prometheus_client's thread server: the collectors read the broker's
dicts, which only the loop thread changes; run there, a scrape sees whole updates without a
lock. The price is that a scrape's collection runs between requests, so collectors must stay
bounded (broker/metrics.py measures what a scrape of 10,000 queues costs).

uvicorn's `Server.serve` installs SIGINT/SIGTERM handlers of its own when run on the main
thread; the process's handlers belong to the CLI, so `_QuietServer` captures none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tidemq.remoting.acceptor import ListenError

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def metrics_app(registry: CollectorRegistry) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app: GET/HEAD /metrics (or /) → the registry's text; anything else → 404."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] not in (METRICS_PATH, "/"):
            await _respond(send, 404, b"text/plain; charset=utf-8", b"not found\n")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"text/plain; charset=utf-8", b"method not allowed\n")
            return
        body = generate_latest(registry)  # the collectors run here, on the loop thread
        if scope["method"] == "HEAD":
            body = b""
        await _respond(send, 200, CONTENT_TYPE_LATEST.encode(), body)

    return app


async def _respond(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MetricsServer:
    """Serves `registry` on host:port (port 0: a free one, see `port`) until stopped."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._socket: socket.socket | None = None
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._socket is not None, "metrics server not started"
        return int(self._socket.getsockname()[1])

    async def start(self) -> None:
        """Bind now (a port that cannot be bound fails the start with ListenError, which the
        CLI words with the setting that chose it), then serve in a task."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
            sock.listen(128)  # a scrape right after start waits in the backlog
        except OSError as exc:
            sock.close()
            raise ListenError(self._host, self._port, exc) from exc
        sock.setblocking(False)
        self._socket = sock
        config = uvicorn.Config(
            metrics_app(self._registry),
            log_config=None,  # the process's logging is the CLI's
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = _QuietServer(config)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="metrics-http"
        )
        log.info("metrics served at http://%s:%d%s", self._host, self.port, METRICS_PATH)

    async def stop(self) -> None:
        server, task = self._server, self._task
        self._server = self._task = None
        if server is not None and task is not None:
            server.should_exit = True  # uvicorn checks it every 0.1 s
            done, _ = await asyncio.wait({task}, timeout=5)
            if not done:
                task.cancel()
            elif not task.cancelled() and task.exception() is not None:
                log.error("metrics server failed", exc_info=task.exception())
        if self._socket is not None:
            self._socket.close()
