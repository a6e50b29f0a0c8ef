"""The request-code → handler table a RemotingServer or RemotingClient dispatches through.

Commands as data (redis): each process builds one table at its composition root and hands it to
the transport, so the set of codes a server answers can be listed and tested without a socket.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

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


# rocketmq_rpc_latency's bucket bounds (ms), as RocketMQ 5's RemotingMetricsManager.
RPC_LATENCY_BOUNDS_MS: Final = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
_BOUNDS_NS: Final = tuple(ms * 1_000_000 for ms in RPC_LATENCY_BOUNDS_MS)
_FIRST_BOUND_NS: Final = _BOUNDS_NS[0]
# Deferred requests awaiting their answer; past this many (answers lost with their
# connections) the starts are dropped: a bound on what a metric can hold, not a real load.
RPC_DEFERRED_MAX: Final = 65_536


class RpcLatency:
    """How long served requests took, from dispatch to the answer, by request and response code.

    Connections call it only when a server's HandlerTable has one (`observer`), so a server
    without metrics pays one attribute read per request. Counting is plain ints on the loop
    thread: `buckets[(request code, response code)]` holds one count per bound of
    RPC_LATENCY_BOUNDS_MS, one past the last bound (+Inf), then the sum of latencies in ns.
    A deferred request (answered later by `Connection.respond`) is timed from `begin` to `end`.
    """

    __slots__ = ("_started", "buckets")

    def __init__(self) -> None:
        self.buckets: dict[tuple[int, int], list[int]] = {}
        self._started: dict[int, int] = {}  # id(request) → perf_counter_ns at `begin`

    def record(self, request_code: int, response_code: int, elapsed_ns: int) -> None:
        key = (request_code, response_code)
        counts = self.buckets.get(key)
        if counts is None:
            counts = self.buckets[key] = [0] * (len(_BOUNDS_NS) + 2)
        # Nearly every request ends within the first bound: skip the search for it.
        counts[0 if elapsed_ns <= _FIRST_BOUND_NS else bisect_left(_BOUNDS_NS, elapsed_ns)] += 1
        counts[-1] += elapsed_ns

    def record_many(
        self, request_code: int, response_code: int, elapsed_ns: int, count: int
    ) -> None:
        """`count` requests of one code that took `elapsed_ns` each: a group answered together
        (the broker's coalesced sends, timed from the group's first request)."""
        key = (request_code, response_code)
        counts = self.buckets.get(key)
        if counts is None:
            counts = self.buckets[key] = [0] * (len(_BOUNDS_NS) + 2)
        counts[0 if elapsed_ns <= _FIRST_BOUND_NS else bisect_left(_BOUNDS_NS, elapsed_ns)] += count
        counts[-1] += elapsed_ns * count

    def begin(self, request: RemotingCommand) -> None:
        """`request` is deferred: its time runs until `end`. Keyed by identity: the request
        object lives until it is answered."""
        started = self._started
        if len(started) >= RPC_DEFERRED_MAX:
            started.clear()
        started[id(request)] = perf_counter_ns()

    def end(self, request: RemotingCommand, response_code: int) -> None:
        """`request` is answered: record it if `begin` timed it (a request deferred untimed, as
        the coalesced sends, is not found: its caller records it)."""
        start = self._started.pop(id(request), None)
        if start is not None:
            self.record(request.code, response_code, perf_counter_ns() - start)


class HandlerTable:
    """Maps request codes to handlers. Registering a code twice is a wiring bug and raises.
    `observer`: what times the requests served through it (None: nothing is timed)."""

    __slots__ = ("_handlers", "observer")

    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}
        self.observer: RpcLatency | None = None

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
