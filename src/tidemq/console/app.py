"""The console's starlette app: routes → reads/actions → jinja2 templates.

    /                          cluster: brokers by cluster and name, runtime figures, replication
    /broker/{addr}             one broker's runtime info (and config when the Admin reads it)
    /topics, /topics/{t}       topics; queues (min/max offset, last update), route, groups, chart
    /groups, /groups/{g}       groups; lag per queue, clients, chart
    /groups/{g}/reset          reset offsets by time: GET shows the plan, POST confirm=yes writes
    /groups/{g}/delete         delete the group: GET asks, POST confirm=yes deletes
    /messages                  query by topic + time range, by key, by id
    /message?id=..             one message: body (text or hex, cut) and properties
    /message/resend            resend to a group: GET asks, POST confirm=yes sends
    /dlq, /dlq/{g}             groups with dead letters; a group's dead letters
    /transactions              each master's transaction counters and in-flight half messages
    /api/counters?kind=&name=  cumulative counters the live charts poll (JSON)

The pages themselves are in pages.py, what they share (the Admin, rendering, errors) in core.py,
what keeps other sites from driving it (Host allowlist, Origin + CSRF token on writes, no
framing) in guard.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidemq.client.admin import Admin
from tidemq.client.tls import TlsOption
from tidemq.security.signing import Credentials

from . import guard
from .core import BadInput, Console
from .pages import Handlers

_STATIC: Final = Path(__file__).parent / "static"
log = logging.getLogger(__name__)


def _routes(console: Console) -> list[Route | Mount]:
    handlers = Handlers(console)
    return [
        Route("/", handlers.cluster),
        Route("/broker/{addr}", handlers.broker),
        Route("/topics", handlers.topics),
        Route("/topics/{topic}", handlers.topic),
        Route("/groups", handlers.groups),
        Route("/groups/{group}", handlers.group),
        Route("/groups/{group}/reset", handlers.reset, methods=["GET", "POST"]),
        Route("/groups/{group}/delete", handlers.delete, methods=["GET", "POST"]),
        Route("/messages", handlers.messages),
        Route("/message", handlers.message),
        Route("/message/resend", handlers.resend, methods=["GET", "POST"]),
        Route("/dlq", handlers.dlq),
        Route("/dlq/{group}", handlers.dlq_group),
        Route("/transactions", handlers.transactions),
        Route("/api/counters", handlers.counters),
        Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
    ]


def create_app(
    namesrv_addr: str,
    *,
    bind_host: str = "127.0.0.1",
    allowed_hosts: Sequence[str] = (),
    credentials: Credentials | None = None,
    tls: TlsOption = False,
    timeout_ms: float = 5_000,
) -> Starlette:
    """The console for the cluster whose name servers are `namesrv_addr` (';'-separated),
    answering requests whose Host is local, `bind_host` or one of `allowed_hosts` (guard.py)."""

    def make_admin() -> Admin:
        return Admin(namesrv_addr, credentials=credentials, tls=tls, timeout_ms=timeout_ms)

    hosts = guard.allowed_hosts(bind_host, allowed_hosts)
    console = Console(make_admin, guard.Guard(hosts))

    async def not_found(request: Request, exc: Exception) -> Response:
        return console.error(request, 404, f"No page at {request.url.path}.")

    async def bad_input(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadInput)
        return console.error(request, exc.status, str(exc))

    async def failed(request: Request, exc: Exception) -> Response:
        # The outermost handler: its answer bypasses the middleware, so it adds the headers.
        log.error("console page %s failed", request.url.path, exc_info=exc)
        text = f"The console failed on this page ({type(exc).__name__}); its log has the details."
        return guard.add_headers(console.error(request, 500, text))

    return Starlette(
        routes=_routes(console),
        lifespan=console.lifespan,
        middleware=[
            Middleware(guard.SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        ],
        exception_handlers={404: not_found, BadInput: bad_input, 500: failed},
    )
