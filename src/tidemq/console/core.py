"""What every console page shares: the Admin's lifetime, rendering under a deadline, errors
as pages, form and time parsing.

GET never writes. Each read page runs under PAGE_TIMEOUT_S; an unknown broker, topic, group or
message is a 404 page naming it, bad input a 400 page, a broker error a 502 page with its message
(never an empty table), anything unexpected the 500 page (app.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from tidemq.client.admin import Admin
from tidemq.clock import Clock, SystemClock
from tidemq.errors import QueueError

from . import reads
from .guard import CSRF_FIELD, Guard

# A page's whole budget: its Admin calls together (each also has the Admin's own timeout).
PAGE_TIMEOUT_S: Final = 15.0
# Form bodies are a few fields; anything larger is refused unread.
FORM_BYTES_MAX: Final = 16 * 1024
_HERE: Final = Path(__file__).parent
log = logging.getLogger(__name__)

Build = Callable[[Admin], Awaitable[dict[str, Any]]]


def _when(ms: int | str | None) -> str:
    if not ms or int(ms) <= 0:
        return "-"
    return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class WriteStep:
    """One step of a write (module docstring of actions.py): the fields it sent, whether it is
    the confirming one (a POST whose form says confirm=yes, the only step that writes), and the
    403 page when the POST is not the console's own form."""

    fields: dict[str, str]
    confirmed: bool
    refused: Response | None = None


class BadInput(Exception):
    """What the person typed or sent cannot be used: a 400 page (413 for a too-large form)."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.status = status


def parse_time(text: str) -> int:
    """ms since the epoch, or an ISO date-time (UTC unless it names an offset). The browser's
    script sends ms it computed from the person's local time; only without JavaScript does a
    naive date-time arrive here, and the form says it is read as UTC."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(f"Not a time: {text!r} (ms since the epoch or an ISO date-time).") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def time_field(fields: Mapping[str, str], name: str) -> str:
    """A time the form sent: the ms the script filled in, else the datetime-local value (UTC)."""
    return (fields.get(name) or fields.get(f"{name}_local") or "").strip()


def _templates(guard: Guard) -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.filters["when"] = _when
    templates.env.globals["csrf_token"] = guard.token
    templates.env.globals["csrf_field"] = CSRF_FIELD
    templates.env.globals["kind"] = reads.topic_kind
    return templates


class Console:
    """The routes' shared state: the Admin (started by the lifespan) and the templates."""

    def __init__(
        self, make_admin: Callable[[], Admin], guard: Guard, clock: Clock | None = None
    ) -> None:
        self._make_admin = make_admin
        self.guard = guard
        self.clock = clock or SystemClock()
        self._admin: Admin | None = None
        self.templates = _templates(guard)

    @property
    def admin(self) -> Admin:
        assert self._admin is not None, "the console's Admin starts with the app"
        return self._admin

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._admin = self._make_admin()
        await self._admin.start()
        try:
            yield
        finally:
            await self._admin.shutdown()

    async def page(
        self, request: Request, name: str, build: Build, *, writes: bool = False
    ) -> Response:
        """Render template `name` with what `build` gathers, or the error page that says why.
        Reads have PAGE_TIMEOUT_S; a page that `writes` has no deadline: it is never cut off
        half done (each of its requests has the Admin's own timeout), so it can say what was
        done on every broker."""
        timeout_s = None if writes else PAGE_TIMEOUT_S
        try:
            async with asyncio.timeout(timeout_s):
                context = await build(self.admin)
        except reads.NotFound as missing:
            return self.error(request, 404, f"No {missing.kind} named {missing.name!r}.")
        except reads.Refused as refused:
            return self.error(request, 400, str(refused))
        except BadInput as bad:
            return self.error(request, bad.status, str(bad))
        except TimeoutError:
            return self.error(request, 504, f"The cluster did not answer in {timeout_s} s.")
        except QueueError as error:
            return self.error(request, 502, str(error) or type(error).__name__)
        return self.templates.TemplateResponse(request, name, context)

    async def write_form(self, request: Request) -> WriteStep:
        """A write step's fields (a GET's query, a POST's form) and, for a POST that is not the
        console's own confirm form (guard.py), the 403 page refusing it."""
        if request.method != "POST":
            return WriteStep(dict(request.query_params), confirmed=False)
        fields = await form_of(request)
        confirmed = fields.get("confirm") == "yes"
        if (why := self.guard.refusal(request, fields)) is not None:
            return WriteStep(fields, confirmed, self.error(request, 403, why))
        return WriteStep(fields, confirmed)

    def error(self, request: Request, status: int, text: str) -> Response:
        context = {"status": status, "text": text}
        return self.templates.TemplateResponse(request, "error.html", context, status_code=status)


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (first value each), without python-multipart. The body is
    read only up to FORM_BYTES_MAX: a larger one is refused (413) without reading the rest."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES_MAX:
            raise BadInput(f"A form of more than {FORM_BYTES_MAX} bytes is refused.", 413)
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}


def number(request: Request, name: str = "page") -> int:
    text = request.query_params.get(name, "1")
    return int(text) if text.isdigit() else 1
