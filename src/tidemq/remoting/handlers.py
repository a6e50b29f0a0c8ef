"""The request-code → handler table a RemotingServer or RemotingClient dispatches through.

Commands as data (redis): each process builds one table at its composition root and hands it to
the transport, so the set of codes a server answers can be listed and tested without a socket.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeAlias

from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.log_limit import clip_peer_text

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection

# Answers one request. Returning None sends no response: the request needs none, or the handler
# called `connection.defer(request)` and answers later with `respond` / `respond_frame`.
Handler: TypeAlias = "Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]"
# Runs before dispatch; a non-None result is sent instead of calling the handler (ACL, flow
# control). A plain function, not a coroutine: it runs for every request a server reads, and
# a coroutine there would cost its frame and its StopIteration each time.
RequestHook: TypeAlias = "Callable[[Connection, RemotingCommand], RemotingCommand | None]"


# What decides a request from the peer's host: None lets it through, else the refusal to send.
RequestCheck: TypeAlias = Callable[[RemotingCommand, str], "RemotingCommand | None"]


def refusing_hook(check: RequestCheck, what: str) -> RequestHook:
    """A request hook answering with `check(request, peer host)`'s refusal, each refusal logged
    (rate-limited per connection) as "<what> refused code N from host:port: remark"."""

    def hook(connection: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        refusal = check(cmd, connection.peer[0])
        if refusal is not None:
            connection.log_peer_error(
                "%s refused code %d from %s: %s",
                what,
                cmd.code,
                connection.peer_text,
                clip_peer_text(refusal.remark),
            )
        return refusal

    return hook


class ResponseWaiter(Protocol):
    """What a connection completes a pending request of ours through (the response, or the
    failure); asyncio.Future[RemotingCommand] is one, the producer's SendWaiter another."""

    def done(self) -> bool: ...
    def set_result(self, result: RemotingCommand, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class HandlerTable:
    """Maps request codes to handlers. Registering a code twice is a wiring bug and raises."""

    __slots__ = ("_handlers",)

    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}

    def register(self, code: int, handler: Handler) -> None:
        """Serve `code` with `handler`.

        Raises:
            ValueError: `code` already has a handler.
        """
        code = int(code)
        if code in self._handlers:
            raise ValueError(f"request code {code} already has a handler")
        self._handlers[code] = handler

    def get(self, code: int) -> Handler | None:
        return self._handlers.get(code)

    def codes(self) -> list[int]:
        """The registered codes, ascending."""
        return sorted(self._handlers)

    def __contains__(self, code: object) -> bool:
        return code in self._handlers

    def __iter__(self) -> Iterator[int]:
        return iter(self.codes())

    def __len__(self) -> int:
        return len(self._handlers)
