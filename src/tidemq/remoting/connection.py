"""One TCP connection carrying RemotingCommands both ways, used by server and client alike.

A connection is symmetric: either side may send requests, and either side answers requests.

    inbound bytes ──▶ FrameDecoder ──▶ response? ──▶ its waiter by opaque (pending.py)
                                  └──▶ request  ──▶ hook → handler → answer (a task if it awaits)

Every inbound request starts when its turn comes (turns.py); one that awaits (a held long-poll
pull, a sync-flush wait) continues as its own task (eager.py), so it never stops the socket from
reading. Answers may leave out of order, paired by opaque. In-flight requests per connection
are bounded by IN_FLIGHT_MAX; beyond it the request is answered SYSTEM_BUSY at once, as a Java
broker does when its executor queue is full.

Which requests of a read start now and which wait, when reading pauses, and how writes are
buffered and flushed is the base class's part: FlowControl (turns.py).

`start_request` registers and writes a request without a coroutine or a timer, for pipelining
callers that keep their own deadlines (the producer's send_nowait; `abandon` drops one).

A connection made with a `signer` (a client's with credentials, RemotingClient(signer=...)) passes
every request it sends, through `start_request` or `oneway`, to it just before the write: the ACL
signature covers the fields as they leave. Answers are never signed, and a connection without a
signer pays one `is not None` test per request.

A handler may answer later without a task: it calls `defer(request)` and returns None, and later
`respond(request, response)` from any callback (the broker stores the single sends of one loop
turn together and answers each, broker/handlers/send_coalesce.py). A deferred request still counts
in flight; the request hook has run for it like for any other.

Inbound bytes are decoded by InboundFrames (inbound.py): a malformed or oversized frame closes
only this connection, and a server bounds what incomplete frames hold across its connections.
A request whose header alone is over its limit is answered (inbound.oversized_answer), never
served, and the connection stays. A server connection bounds the body bytes of the requests it
has in flight (`in_flight_bytes_max`, IN_FLIGHT_BYTES_MAX by default) by reading no more until
they drop (turns.py); with `send_wait_ms_max` a send that waited that long in the backlog is
answered SYSTEM_BUSY (turns.py).
A handler's ProtocolError is the peer's fault: SYSTEM_ERROR naming it, and one log line
(rate-limited per connection, log_limit.py), never a traceback. When the connection closes, pending
requests fail with ConnectionClosedError at once; handler tasks still running are left to finish
(their answers are dropped) so a handler never sees a cancellation it did not expect.

Writes go out as `writelines([head, body])` so large bodies are not copied into the header.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import Final, cast

from tidemq.clock import Clock
from tidemq.errors import ConnectionClosedError, ProtocolError
from tidemq.limits import MIB
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, encode_parts
from tidemq.remoting.address import socket_address
from tidemq.remoting.eager import resume
from tidemq.remoting.handlers import HandlerTable, RequestHook, ResponseWaiter, RpcLatency
from tidemq.remoting.inbound import (
    FrameBudget,
    InboundFrames,
    oversized_answer,
    oversized_response,
)
from tidemq.remoting.log_limit import LogLimit, clip_peer_text
from tidemq.remoting.pending import PendingRequests
from tidemq.remoting.turns import TURN_BUDGET, FlowControl
from tidemq.security.tls import subject_text

__all__ = ["IN_FLIGHT_BYTES_MAX", "IN_FLIGHT_MAX", "TURN_BUDGET", "Connection", "Signer"]

logger = logging.getLogger(__name__)

# Requests one connection may have running at once; a client needs far fewer (held pulls are one
# per queue), so reaching this means a runaway peer. Beyond it: SYSTEM_BUSY.
IN_FLIGHT_MAX: Final = 4096
# Body bytes of the requests one server connection has in flight before it reads no more of its
# requests (maxInFlightBytesPerConnection): four maximal frames, or 16 maximal messages being
# stored or awaiting their flush; a pipelining producer of 1 KiB messages has 64k of them in
# flight before it waits. Bounds what one peer makes us hold to this plus one frame.
IN_FLIGHT_BYTES_MAX: Final = 64 * MIB

ConnectionCallback = Callable[["Connection"], None]
# Adds to an outbound request what the peer checks before serving it (the ACL signature,
# tidemq.security.signing.sign): applied to our requests only, never to answers.
Signer = Callable[[RemotingCommand], None]


class Connection(FlowControl):
    """One TCP connection. Built by RemotingServer and RemotingClient, not by callers.

    It is the transport's asyncio Protocol: connection_made, data_received, connection_lost,
    pause_writing and resume_writing are the event loop's to call. `on_open` and `on_close` are
    called with the connection once it is connected and once it has closed.

    Attributes:
        peer: the remote (host, port), host as IPv4 text where possible.
        local: the local (host, port).
        attributes: per-connection state owned by upper layers (client id, ACL identity, ...).
        tls: the connection is TLS (security/tls.py; a permissive port serves both kinds).
        peer_cert_subject: the subject of the peer's verified certificate ("CN=...,O=..."),
            None without TLS or without a client certificate (mutual TLS).
    """

    __slots__ = (
        "_clock",
        "_close_listeners",
        "_closed_event",
        "_handlers",
        "_in_flight",
        "_in_flight_max",
        "_inbound",
        "_last_activity_ms",
        "_on_close",
        "_on_open",
        "_peer_errors",
        "_pending",
        "_request_hook",
        "_signer",
        "_tasks",
        "attributes",
        "local",
        "peer",
        "peer_cert_subject",
        "tls",
    )

    def __init__(
        self,
        handlers: HandlerTable,
        *,
        clock: Clock,
        frame_size_max: int,
        frame_budget: FrameBudget | None = None,
        request_hook: RequestHook | None = None,
        in_flight_max: int = IN_FLIGHT_MAX,
        read_while_blocked: bool = True,
        turn_budget: int | None = TURN_BUDGET,
        on_open: ConnectionCallback | None = None,
        on_close: ConnectionCallback | None = None,
        signer: Signer | None = None,
        in_flight_bytes_max: int | None = None,
        send_wait_ms_max: float | None = None,
    ) -> None:
        super().__init__(
            read_while_blocked=read_while_blocked,
            turn_budget=turn_budget,
            in_flight_bytes_max=in_flight_bytes_max,
            send_wait_ms_max=send_wait_ms_max,
        )
        self._signer = signer
        self._handlers = handlers
        self._on_open = on_open
        self._on_close = on_close
        self._clock = clock
        self._request_hook = request_hook
        self._inbound = InboundFrames(
            frame_size_max, clock, budget=frame_budget, on_evict=self.abort
        )
        self._peer_errors: LogLimit | None = None
        self._in_flight_max = in_flight_max
        self._in_flight = 0
        self._pending = PendingRequests()
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_listeners: list[ConnectionCallback] = []
        self._closed_event = asyncio.Event()
        self._last_activity_ms = clock.monotonic_ms()
        self.attributes: dict[str, object] = {}
        self.peer: tuple[str, int] = ("", 0)
        self.local: tuple[str, int] = ("", 0)
        self.tls = False
        self.peer_cert_subject: str | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {self.peer_text} ({state})>"

    @property
    def peer_text(self) -> str:
        """The peer as "host:port" (what RocketMQ calls the remote address of a channel)."""
        return f"{self.peer[0]}:{self.peer[1]}"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_activity_ms(self) -> float:
        """Monotonic time of the last byte read or frame written."""
        return self._last_activity_ms

    @property
    def incomplete_frame_since_ms(self) -> float | None:
        """Monotonic time the frame being received began; None between frames."""
        return self._inbound.incomplete_since_ms

    @property
    def in_flight(self) -> int:
        """Inbound requests currently being handled."""
        return self._in_flight

    # -- outbound ---------------------------------------------------------------------------

    async def request(self, cmd: RemotingCommand, timeout_ms: float) -> RemotingCommand:
        """Send `cmd` as a request and await its response.

        Assigns `cmd.opaque` and clears the response bit, so one command object must not be in
        flight twice at once.

        Raises:
            RequestTimeoutError: no response within `timeout_ms`.
            ConnectionClosedError: the connection closed before the response arrived.
        """
        future: asyncio.Future[RemotingCommand] = self._loop.create_future()
        opaque = self.start_request(cmd, future)
        timer = self._loop.call_later(
            max(timeout_ms, 0) / 1000, self._expire, opaque, cmd.code, timeout_ms
        )
        try:
            if self._paused:
                await self._drain()
            return await future
        finally:
            timer.cancel()
            self._pending.discard(opaque)

    def start_request(self, cmd: RemotingCommand, waiter: ResponseWaiter) -> int:
        """`request` without awaiting, pausing or a timeout: `waiter` gets the response or a
        ConnectionClosedError; the caller keeps the deadline. Returns the opaque. Raises
        ConnectionClosedError (registering nothing) if the connection is closed."""
        opaque = self._pending.allocate()
        cmd.opaque = opaque
        cmd.flag &= ~FLAG_RESPONSE
        if self._signer is not None:
            self._signer(cmd)
        self._write(cmd)
        self._pending.add(opaque, waiter)
        return opaque

    def abandon(self, opaque: int) -> None:
        """Forget a pending request (its response, if one comes, is dropped)."""
        self._pending.discard(opaque)

    async def oneway(self, cmd: RemotingCommand) -> None:
        """Send `cmd` with the oneway bit set; returns once the write is accepted by the transport.

        Raises:
            ConnectionClosedError: the connection is closed.
        """
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.peer_text} is closed")
        cmd.opaque = self._pending.allocate()
        cmd.flag = (cmd.flag & ~FLAG_RESPONSE) | FLAG_ONEWAY
        if self._signer is not None:
            self._signer(cmd)
        self._write(cmd)
        if self._paused:
            await self._drain()

    @property
    def rpc_observer(self) -> RpcLatency | None:
        """What times the requests this connection serves (None: nothing is timed)."""
        return self._handlers.observer

    def defer(self, request: RemotingCommand, *, timed: bool = True) -> None:
        """Called by a handler that returns None and answers `request` later with `respond`:
        the request stays counted in flight (and its body in the in-flight bytes) until then.
        `timed=False`: the caller records its latency itself (`rpc_observer.record_many`), as
        the broker's send coalescer does for a whole group at once."""
        self._in_flight += 1
        self._in_flight_bytes += len(request.body)
        if timed:
            observer = self._handlers.observer
            if observer is not None:
                observer.begin(request)

    def respond(self, request: RemotingCommand, response: RemotingCommand) -> None:
        """Answer a deferred `request` now, without awaiting: the frame leaves with this loop
        iteration's other writes. Nothing is sent for a oneway request or on a closed connection.
        """
        self._in_flight -= 1
        self._release_bytes(len(request.body))
        observer = self._handlers.observer
        if observer is not None:
            observer.end(request, response.code)
        if not request.flag & FLAG_ONEWAY:
            self._write_answer(request, response)

    def respond_frame(self, request: RemotingCommand, frame: bytes) -> None:
        """`respond` with the whole response frame encoded by the caller (from a template: the
        caller answers in the request's serialisation type, with its opaque)."""
        self._in_flight -= 1
        # _release_bytes, inlined: every coalesced send is answered here.
        self._in_flight_bytes -= len(request.body)
        # Not timed here: its caller, the send coalescer, records its whole group at once.
        if self._backlog:
            self._schedule_drain()
        if request.flag & FLAG_ONEWAY or self._closed or self._transport is None:
            return
        # Activity is not stamped again: the read that brought the request just did.
        buffer = self._write_buffer
        if not buffer:
            self._loop.call_soon(self._flush_writes)
        buffer.append(frame)
        self._buffered_bytes += len(frame)

    async def send_response(self, cmd: RemotingCommand) -> None:
        """Send a response (the caller sets its opaque). Dropped silently once closed: the peer
        that asked is gone and nobody can receive it."""
        cmd.flag |= FLAG_RESPONSE
        if self._closed:
            logger.debug("dropping response %d to closed %s", cmd.opaque, self.peer_text)
            return
        self._write(cmd)
        if self._paused:
            await self._drain()

    def _write_answer(self, request: RemotingCommand, response: RemotingCommand) -> bool:
        """Stamp `response` as the answer to `request` and queue it; False when it is dropped (a
        closed connection: nobody can receive it; or a response that cannot be encoded)."""
        response.opaque = request.opaque
        response.serialize_type = request.serialize_type
        response.flag |= FLAG_RESPONSE
        if self._closed or self._transport is None:
            logger.debug("dropping response %d to closed %s", response.opaque, self.peer_text)
            return False
        try:
            self._write(response)
        except ProtocolError:
            logger.exception("cannot encode the response to code %d", request.code)
            return False
        return True

    def _write(self, cmd: RemotingCommand) -> None:
        transport = self._transport
        if transport is None or self._closed:
            raise ConnectionClosedError(f"connection to {self.peer_text} is closed")
        head, body = encode_parts(cmd)
        buffer = self._write_buffer
        if not buffer:
            self._loop.call_soon(self._flush_writes)
        buffer.append(head)
        if body:
            buffer.append(body)
        self._buffered_bytes += len(head) + len(body)
        self._last_activity_ms = self._clock.monotonic_ms()

    def _expire(self, opaque: int, code: int, timeout_ms: float) -> None:
        message = f"request code {code} to {self.peer_text} timed out after {timeout_ms} ms"
        self._pending.expire(opaque, message)

    # -- lifecycle --------------------------------------------------------------------------

    def add_close_listener(self, listener: ConnectionCallback) -> None:
        """Call `listener(self)` once when the connection closes (at once if already closed)."""
        if self._closed:
            listener(self)
        else:
            self._close_listeners.append(listener)

    def close(self) -> None:
        """Close after flushing queued writes. Pending requests fail with ConnectionClosedError."""
        self._flush_writes()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        elif self._transport is None:
            self.connection_lost(None)

    def abort(self) -> None:
        """Close at once, discarding queued writes and what is held of an incomplete frame."""
        self._inbound.release()
        if self._transport is not None:
            self._transport.abort()
        else:
            self.connection_lost(None)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    async def cancel_tasks(self) -> None:
        """Cancel the handler tasks still running and wait for them (server and client stop)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- asyncio Protocol callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self.peer = socket_address(transport.get_extra_info("peername"))
        self.local = socket_address(transport.get_extra_info("sockname"))
        if transport.get_extra_info("ssl_object") is not None:
            self.tls = self._join_writes = True
            self.peer_cert_subject = subject_text(transport.get_extra_info("peercert"))
        self._inbound.name = self.peer_text
        self._last_activity_ms = self._clock.monotonic_ms()
        if self._on_open is not None:
            self._on_open(self)

    def eof_received(self) -> bool | None:
        return None  # close the transport: a half-closed peer sends no more requests

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbound.release()
        if exc is not None:
            logger.debug("connection %s lost: %s", self.peer_text, exc)
        self._pending.fail_all(self.peer_text)
        self._wake_writers(ConnectionClosedError(f"connection to {self.peer_text} closed"))
        listeners, self._close_listeners = self._close_listeners, []
        for listener in listeners:
            try:
                listener(self)
            except Exception:
                logger.exception("close listener of %s failed", self.peer_text)
        self._closed_event.set()
        if self._on_close is not None:
            self._on_close(self)

    def data_received(self, data: bytes) -> None:
        self._last_activity_ms = self._clock.monotonic_ms()
        try:
            commands = self._inbound.feed(data)
        except ProtocolError as exc:
            self._inbound.log_malformed(self.peer_text, exc)
            self.abort()
            return
        if self._transport is None or self._transport.is_closing():
            return  # evicted by the frame budget in this read (inbound.py)
        if self._inbound.oversized:
            self._refuse_oversized()
        self._admit(commands)

    def _refuse_oversized(self) -> None:
        """Answer the requests of this read whose header is over its limit (responses go to
        their waiters, as inbound.oversized_response: the peer may answer what we asked at
        length, but the decoder keeps only the fixed part of such a header)."""
        oversized = self._inbound.oversized
        for refused in oversized:
            cmd = refused.command
            if cmd.flag & FLAG_RESPONSE:
                self._on_response(oversized_response(refused))
                continue
            code, remark = oversized_answer(refused)
            self.log_peer_error(
                "code %d from %s refused with %d: %s", cmd.code, self.peer_text, code, remark
            )
            if not cmd.flag & FLAG_ONEWAY:
                self._write(cmd.response(code, remark=remark))
        oversized.clear()

    def _refuse_busy(self, refused: list[RemotingCommand], remark: str) -> None:
        self.log_peer_error(
            "%d sends from %s answered SYSTEM_BUSY: %s", len(refused), self.peer_text, remark
        )
        for cmd in refused:
            if not cmd.flag & FLAG_ONEWAY:
                self._write(cmd.response(ResponseCode.SYSTEM_BUSY, remark=remark))

    def _on_response(self, cmd: RemotingCommand) -> None:
        self._pending.answer(cmd, self.peer_text)

    def _on_request(self, cmd: RemotingCommand) -> None:
        if self._closed:
            return
        if self._in_flight >= self._in_flight_max:
            if not cmd.flag & FLAG_ONEWAY:
                remark = f"[OVERLOAD] {self._in_flight} requests in flight on this connection"
                self._write(cmd.response(ResponseCode.SYSTEM_BUSY, remark=remark))
            return
        self._in_flight += 1
        # Eager start (eager.py): only a handler that suspends becomes a task.
        coroutine = self._serve(cmd)
        try:
            awaited = coroutine.send(None)
        except StopIteration:
            return
        except Exception:
            logger.exception("serving code %d from %s failed", cmd.code, self.peer_text)
            return
        task = self._loop.create_task(resume(coroutine, awaited))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        size = len(cmd.body)
        if size:
            # Only a handler that suspends holds its body past this call (a deferred request is
            # counted by `defer`): the common, synchronous path pays nothing for the bound.
            self._in_flight_bytes += size
            task.add_done_callback(lambda _: self._release_bytes(size))

    async def _serve(self, cmd: RemotingCommand) -> None:
        # One coroutine for hook, handler and answer: under pipelining every request passes
        # here, and each coroutine layer costs its frame and its StopIteration.
        observer = self._handlers.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            response = None
            if self._request_hook is not None:
                response = self._request_hook(self, cmd)
            if response is None:
                handler = self._handlers.get(cmd.code)
                if handler is None:
                    response = cmd.response(
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        remark=f" request type {cmd.code} not supported",
                    )
                else:
                    response = await handler(self, cmd)
        except ProtocolError as exc:
            self.log_peer_error(
                "bad request code %d from %s: %s", cmd.code, self.peer_text, clip_peer_text(exc)
            )
            response = cmd.response(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        except Exception as exc:
            # A task boundary: the handler's failure becomes the peer's SYSTEM_ERROR; the
            # connection stays up.
            logger.exception("handler for code %d from %s failed", cmd.code, self.peer_text)
            response = cmd.response(
                ResponseCode.SYSTEM_ERROR, remark=str(exc) or type(exc).__name__
            )
        finally:
            self._in_flight -= 1
        if response is None or cmd.flag & FLAG_ONEWAY:
            return
        if observer is not None:
            observer.record(cmd.code, response.code, perf_counter_ns() - started)
        if self._write_answer(cmd, response) and self._paused:
            try:
                await self._drain()
            except ConnectionClosedError:
                logger.debug("%s closed before the response to %d left", self.peer_text, cmd.code)

    def log_peer_error(self, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Log something the peer got wrong (or asked for and was refused), rate-limited per
        connection (log_limit.py): what a peer can make us log stays small beside what it sends.
        Quote peer-supplied text through `clip_peer_text`."""
        if self._peer_errors is None:
            self._peer_errors = LogLimit(logger, self._clock)
        self._peer_errors.log(level, message, *args)
