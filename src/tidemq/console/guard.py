"""Why a page of another site cannot drive the console: it has no login, so every write must
provably come from the console's own confirm form, seen by a person in a top-level window.

- Host allowlist (starlette's TrustedHostMiddleware): the bind address, localhost, 127.0.0.1
  and each --allowed-host. DNS rebinding (evil.example resolving to 127.0.0.1) sends
  `Host: evil.example` and is refused, so the page cannot even read the console's answers.
- A POST needs an Origin header naming an allowed host and equal to its Host (browsers send one
  on every POST; a POST without it is a script, not the console's form), and the CSRF token its
  form carries: an HMAC, under a key drawn at process start, of the form's path. A page of
  another site can neither read the token nor guess it.
- Every answer says X-Frame-Options: DENY and CSP frame-ancestors 'none', so a prefilled
  confirm form cannot be framed under a decoy (clickjacking); default-src 'self' keeps scripts
  and styles to the console's own files.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Hosts every console accepts besides its bind address and --allowed-host values.
LOCAL_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
CSRF_FIELD: Final = "csrf"
SECURITY_HEADERS: Final = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> list[str]:
    """The Host header values the console answers: local names, its bind address, `extra`.
    A wildcard bind address (0.0.0.0, ::) is no name a browser uses: it adds nothing."""
    hosts = [*LOCAL_HOSTS]
    if bind_host and bind_host not in ("0.0.0.0", "::"):
        hosts.append(bind_host)
    hosts += [h.strip().lower() for h in extra if h.strip()]
    return sorted(set(hosts))


def is_loopback(bind_host: str) -> bool:
    if bind_host == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind_host).is_loopback
    except ValueError:
        return False


def exposure_warning(bind_host: str) -> str | None:
    """The line `tidemq console` logs when it listens beyond this machine, else None."""
    if is_loopback(bind_host):
        return None
    return (
        f"the console listens on {bind_host}, beyond this machine, and has NO login: anyone who "
        "reaches it can reset offsets, delete groups and resend messages; put an authenticating "
        "proxy in front of it (and name the proxy's host with --allowed-host)"
    )


class Guard:
    """The per-process CSRF key and the write checks (module docstring)."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.hosts = frozenset(h.lower() for h in hosts)
        self._key = secrets.token_bytes(32)

    def token(self, path: str) -> str:
        """The token of the form that posts to `path`."""
        return hmac.new(self._key, path.encode(), hashlib.sha256).hexdigest()

    def refusal(self, request: Request, fields: dict[str, str]) -> str | None:
        """Why a POST is not the console's own confirm form, or None when it is."""
        origin = request.headers.get("origin")
        if not origin:
            return "Refused a write without an Origin header: writes come from the console's form."
        parts = urlsplit(origin)
        if (parts.hostname or "") not in self.hosts or parts.netloc != request.headers.get(
            "host", ""
        ):
            return f"Refused a write sent from another site ({origin})."
        token = fields.get(CSRF_FIELD, "")
        if not hmac.compare_digest(token, self.token(request.url.path)):
            return "Refused a write without this console's form token (reload the form)."
        return None


def add_headers(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


class SecurityHeaders:
    """ASGI middleware: SECURITY_HEADERS on every HTTP answer (also the host refusals)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
