"""Turns and backpressure: when a connection starts the requests it has read, and when it stops
reading. The base class of Connection, apart from it because it changes for other reasons
(throughput tuning, memory bounds) than pairing requests with answers.

One read can bring hundreds of pipelined requests. The connection starts the first `turn_budget`
worth of them at once (a request costs one, plus one per 2 KiB of body) and the rest from a
backlog in later loop iterations, twice as much each time, with reading paused until the backlog
is empty. The first answers then leave while later requests are still being handled, so a
pipelining peer works at the same time as we do instead of taking turns with us over its whole
window.

Frames written during one loop iteration leave together (`_flush_writes`). A server connection
takes no new requests while its peer does not read the answers: the transport paused writing, or
more than WRITE_BUFFER_BYTES_MAX is queued. A writer awaits (`_drain`) while the transport is
paused.

Requests in flight hold their bodies (a handler awaiting a flush, a deferred send), so a server
connection also takes no new requests while the bodies of those in flight sum to
`in_flight_bytes_max` or more: the rest of the read waits in the backlog with reading paused
(backpressure: the peer's window fills and its writes wait), and draining resumes as requests
finish. At most in_flight_bytes_max + one frame is held per connection; nothing is closed.

A backlog is also a queue in upstream's sense (its send thread pool's queue). With
`send_wait_ms_max` (brokerFastFailureEnable, waitTimeMillsInSendQueue) a send that has waited in
the backlog that long when its turn comes is answered SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]broker
busy, start flow control for a while, period in queue: Nms, size of queue: M", upstream's words,
instead of being started: the loop is too far behind (or the bodies in flight too many) for the
send to be answered in good time, and the producer retries it, on another broker if it can.
Only sends are cleaned: a pull or an admin request waits its turn.

The interface with Connection: it feeds each read's commands to `_admit`, appends frames to
`_write_buffer` (adding their size to `_buffered_bytes`, scheduling `_flush_writes` when the
buffer was empty), counts the body bytes of the requests it serves in `_in_flight_bytes` (calling
`_release_bytes` when one finishes), and implements `_on_request`, `_on_response` and
`_refuse_busy`. Subclassing rather
than holding a helper object keeps the per-request path free of extra attribute hops.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import ConnectionClosedError
from tidemq.protocol.frame import FLAG_RESPONSE, RemotingCommand
from tidemq.remoting.inbound import SEND_CODES

# Response bytes a server connection may queue in one loop iteration before it handles no more
# of that peer's requests until they are written: bounds what a client that sends but never
# reads can make us hold (one maximal pull answer fits).
WRITE_BUFFER_BYTES_MAX: Final = 8 * 1024 * 1024
# What one loop iteration may start of one read (see the module docstring). Measured with
# benchmarks/profile/run.sh, 1 KiB bodies, ASYNC flush: pipelined (256 in flight) 44k msg/s when a
# whole read starts at once, 55-58k with 16 (8 and 32 the same; a steady 16 per iteration without
# doubling: broker CPU per send 18 -> 22 µs, 47k); batched (64 per request, 8 in flight) 70-73k
# -> 81-91k once bodies count, unchanged while only requests counted.
TURN_BUDGET: Final = 16
_BODY_UNIT_SHIFT: Final = 11  # a request costs one more per 2 KiB of its body


class FlowControl(asyncio.Protocol):
    """Turn budget, request backlog, paused reading and write buffering of one connection."""

    __slots__ = (
        "_backlog",
        "_backlog_since_ms",
        "_buffered_bytes",
        "_closed",
        "_drain_scheduled",
        "_drain_waiters",
        "_in_flight_bytes",
        "_in_flight_bytes_max",
        "_join_writes",
        "_loop",
        "_paused",
        "_read_while_blocked",
        "_send_wait_ms_max",
        "_transport",
        "_turn_budget",
        "_turn_limit",
        "_write_buffer",
    )

    _clock: Clock  # Connection's

    def __init__(
        self,
        *,
        read_while_blocked: bool,
        turn_budget: int | None,
        in_flight_bytes_max: int | None = None,
        send_wait_ms_max: float | None = None,
    ) -> None:
        assert turn_budget is None or turn_budget > 0
        assert in_flight_bytes_max is None or in_flight_bytes_max > 0
        assert send_wait_ms_max is None or send_wait_ms_max >= 0
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._closed = False
        # Server side (False): while the peer does not read our responses and the transport's
        # buffer is over its high-water mark, stop reading its requests, so a client that never
        # reads cannot make us queue responses without bound. Clients keep reading: their peer
        # reads independently, and pausing both sides could deadlock.
        self._read_while_blocked = read_while_blocked
        self._paused = False
        # Frames written during one loop iteration, sent together by _flush_writes: under
        # pipelining one send syscall carries many responses instead of one each.
        self._write_buffer: list[bytes] = []
        # TLS (Connection sets it): a flush is one write, so one TLS record carries many frames;
        # writelines would make a record (and an encryption call) of each head and each body.
        self._join_writes = False
        self._buffered_bytes = 0
        # Requests read but not started: beyond the `turn_budget` of one read, or (server side)
        # because the peer is not reading our responses (see `_blocked`). Started in order by
        # _drain_backlog, `_turn_limit` worth per iteration; reading stays paused until it is
        # empty.
        self._backlog: collections.deque[RemotingCommand] = collections.deque()
        self._drain_scheduled = False
        # None: every request of a read starts at once (a SYNC_FLUSH broker: its answers wait
        # for the disk anyway, and each slice would cost a group-commit round of its own).
        self._turn_budget = turn_budget or sys.maxsize
        self._turn_limit = self._turn_budget
        self._drain_waiters: list[asyncio.Future[None]] = []
        # Body bytes of the requests being handled; server side, no new request starts while
        # they reach the bound (None: no bound).
        self._in_flight_bytes = 0
        self._in_flight_bytes_max = in_flight_bytes_max or sys.maxsize
        # When the backlog's requests were read (they all come from one read: reading pauses
        # while there is a backlog); None while it is empty.
        self._backlog_since_ms: float | None = None
        self._send_wait_ms_max = send_wait_ms_max

    @property
    def writing_paused(self) -> bool:
        """True while the transport's write buffer is over its high-water mark."""
        return self._paused

    @property
    def reading_paused(self) -> bool:
        """True while the server stopped reading this peer's requests (it is not reading ours)."""
        transport = self._transport
        return transport is not None and not transport.is_reading()

    @property
    def peer_text(self) -> str:
        """The peer as "host:port", for messages (Connection)."""
        raise NotImplementedError

    def _on_request(self, cmd: RemotingCommand) -> None:
        """Start serving one inbound request (Connection)."""
        raise NotImplementedError

    def _on_response(self, cmd: RemotingCommand) -> None:
        """Hand a response to the request that awaits it (Connection)."""
        raise NotImplementedError

    def _refuse_busy(self, refused: list[RemotingCommand], remark: str) -> None:
        """Answer `refused` SYSTEM_BUSY with `remark` (Connection)."""
        raise NotImplementedError

    def _admit(self, commands: list[RemotingCommand]) -> None:
        """Route this read's responses at once; start what its turn budget allows of its
        requests and keep the rest in the backlog, with reading paused until it drains."""
        backlog = self._backlog
        budget = self._turn_budget
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                self._on_response(cmd)
            elif backlog or budget <= 0 or self._blocked():
                backlog.append(cmd)
            else:
                budget -= 1 + (len(cmd.body) >> _BODY_UNIT_SHIFT)
                self._on_request(cmd)
        if backlog and self._transport is not None:
            if self._backlog_since_ms is None:
                self._backlog_since_ms = self._clock.monotonic_ms()
            # Bound the backlog to what one read delivered: read nothing more until it drains.
            self._transport.pause_reading()
            if not self._blocked():
                self._schedule_drain()

    def _flush_writes(self) -> None:
        buffer = self._write_buffer
        if not buffer:
            return
        self._write_buffer = []
        self._buffered_bytes = 0
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self._join_writes:
                transport.write(b"".join(buffer))
            else:
                transport.writelines(buffer)
        if self._backlog and not self._blocked():
            self._schedule_drain()

    def _blocked(self) -> bool:
        """Server side: the peer is not keeping up with our responses, so take no new requests."""
        return not self._read_while_blocked and (
            self._paused
            or self._buffered_bytes > WRITE_BUFFER_BYTES_MAX
            or self._in_flight_bytes >= self._in_flight_bytes_max
        )

    def _release_bytes(self, size: int) -> None:
        """A request of `size` body bytes finished: the backlog may go on."""
        self._in_flight_bytes -= size
        if self._backlog:
            self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain_backlog)

    def _drain_backlog(self) -> None:
        """Start the next slice of the backlog, twice the last one; come back next iteration for
        more, or resume reading once none are left. Stops while blocked: resume_writing or
        _flush_writes schedules it again."""
        self._drain_scheduled = False
        backlog = self._backlog
        if self._send_wait_ms_max is not None and self._backlog_since_ms is not None:
            self._clean_backlog(self._send_wait_ms_max, self._backlog_since_ms)
        self._turn_limit = budget = min(self._turn_limit * 2, sys.maxsize)
        while backlog and not self._closed and not self._blocked():
            if budget <= 0:
                self._schedule_drain()
                return
            cmd = backlog.popleft()
            budget -= 1 + (len(cmd.body) >> _BODY_UNIT_SHIFT)
            self._on_request(cmd)
        if backlog:
            return
        self._backlog_since_ms = None
        self._turn_limit = self._turn_budget
        transport = self._transport
        # Not `_blocked()`: over WRITE_BUFFER_BYTES_MAX but not paused, nothing would resume
        # reading once the buffer is written. New requests then wait in the backlog instead.
        # Only a server connection whose transport paused writing waits for resume_writing.
        paused_by_peer = self._paused and not self._read_while_blocked
        if not paused_by_peer and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _clean_backlog(self, wait_ms_max: float, since_ms: float) -> None:
        """Answer SYSTEM_BUSY to the backlog's sends once they have waited `wait_ms_max`."""
        waited_ms = self._clock.monotonic_ms() - since_ms
        backlog = self._backlog
        if waited_ms < wait_ms_max or not backlog or self._closed:
            return
        refused = [cmd for cmd in backlog if cmd.code in SEND_CODES]
        if not refused:
            return
        kept = [cmd for cmd in backlog if cmd.code not in SEND_CODES]
        backlog.clear()
        backlog.extend(kept)
        self._refuse_busy(
            refused,
            "[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: "
            f"{int(waited_ms)}ms, size of queue: {len(refused) + len(kept)}",
        )

    async def _drain(self) -> None:
        """Wait until the transport takes writes again (resume_writing) or the connection closes."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.peer_text} closed while writing")
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def pause_writing(self) -> None:
        self._paused = True
        if not self._read_while_blocked and self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if not self._read_while_blocked and self._transport is not None:
            if self._backlog:
                self._schedule_drain()
            elif not self._transport.is_closing():
                self._transport.resume_reading()
        self._wake_writers(None)

    def _wake_writers(self, exc: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
