"""HAMaster: streams the commit log to authenticated slaves and answers SYNC sends' ack waits.

    store put pass ──append listener──▶ wake each slave's sender
                                                  ┌──────────── one _Link per slave ────────────┐
    accept ─▶ HELLO ─▶ AUTH ─▶ judge ─▶ VERDICT ─▶│ sender task: read_replica ─▶ frames         │
      (at most PENDING_CONNECTIONS_MAX             │   (≤ window beyond the acked offset,       │
       unauthenticated at once, the oldest         │    a heartbeat frame when idle)            │
       evicted by a newcomer; each for             │ data_received: reports ─▶ acked offset     │
       HANDSHAKE_TIMEOUT_MS at most)               │                                            │
                                                  └─────────────────┬───────────────────────────┘
    SYNC send ─▶ on_acked(end, cb) ─▶ AckWaiters ◀── release(best acked) on each report

A link is PENDING until its VERDICT, then STREAMING if the verdict was OK; any other verdict is
written and the connection closed. A real slave sends its AUTH within one round trip of the
HELLO, so a pending link gets HANDSHAKE_TIMEOUT_MS (or housekeeping_interval_ms if shorter); and
when PENDING_CONNECTIONS_MAX are pending, a newcomer evicts the oldest instead of being refused:
idle sockets can hold the port for seconds at most, never lock a slave out. The wire and its
handshake are protocol/ha.py.

Flow control: a sender writes while the transport is below its high-water mark and the next
byte is less than settings.WINDOW_BYTES (plus one largest record, so a slave holding the head of
a record always gets its end) beyond what the slave acknowledged; each report reopens the window.

A slave is dropped (one rate-limited log line each, remoting/log_limit.py) when it fails the
handshake, is silent for housekeeping_interval_ms (it reports at least every heartbeat), or
breaks the protocol: a report below one before it or beyond what was sent, bytes before its
VERDICT. A peer without the secret gets the HELLO, a BAD_SECRET verdict that carries no offset,
and a close.

Ack rule (upstream's, spec ha.md §1): SUCCESS once some streaming slave reported >= end (a
dropped link stops counting at once, not when its connection_lost runs);
SLAVE_NOT_AVAILABLE at once when no slave streams or the best is more than
max_gap_not_in_sync behind end; FLUSH_SLAVE_TIMEOUT after sync_timeout_ms. A waiter left at
stop() gets SLAVE_NOT_AVAILABLE.

Controller mode (`set_sync_set`, in_sync.py): SUCCESS once every other member of the sync set,
and every slave JOINING it, has a streaming link that reported >= end (the master alone: at
once); no SLAVE_NOT_AVAILABLE shortcut, a missing member is waited for until the set shrinks
(re-evaluated at once) or the timeout. `confirm_offset` (what pulls may see) goes to its
listeners as it advances; `lagging` and `caught_up` tell the controller whom to drop or add.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Final, Protocol, cast

from tidemq.broker.ha.acks import AckCallback, AckWaiters, call_back
from tidemq.broker.ha.in_sync import ConfirmListeners, InSync, best_acks
from tidemq.broker.ha.lag import LagSamples, SlaveInfo
from tidemq.broker.ha.settings import HASettings, window_bytes
from tidemq.broker.service import wait_woken
from tidemq.clock import Clock
from tidemq.errors import ProtocolError, StoreError
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, MIB
from tidemq.protocol import ha
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.acceptor import Acceptor, accept_tls, listen
from tidemq.remoting.log_limit import LogLimit, clip_peer_text

log = logging.getLogger(__name__)

# Connections still in their handshake at once: a newcomer beyond it evicts the oldest (an
# unauthenticated peer must not hold descriptors and timers without bound, nor lock slaves out).
PENDING_CONNECTIONS_MAX: Final = 16
# A connection's time from accept to AUTH: a slave sends it within one round trip of the HELLO.
HANDSHAKE_TIMEOUT_MS: Final = 3_000
# Streaming slaves at once; a group has one or two in practice.
SLAVES_MAX: Final = 16
# A sender writes at most this much before yielding the loop to sends and other slaves.
SEND_BURST_BYTES: Final = 1 * MIB
# The transport's buffer a sender fills before waiting (asyncio's default 64 KiB is two frames).
WRITE_BUFFER_HIGH_BYTES: Final = 1 * MIB


class ReplicaSource(Protocol):
    """What the master reads of its store (FileMessageStore)."""

    @property
    def max_physical_offset(self) -> int: ...

    @property
    def min_physical_offset(self) -> int: ...

    def read_replica(self, offset: int, size_max: int) -> bytes: ...

    def bytes_before(self, end: int, size_max: int) -> bytes: ...

    def add_append_listener(self, fn: Callable[[int], None]) -> None: ...


class HAMaster:
    """Serves slaves on settings.listen_host:listen_port (module docstring).

    Args:
        store: the master's store; `message_size_max` sizes the flow-control window.
        settings: the HA knobs.
        clock: monotonic time for silence and lag, wall time for `connected_since_ms`.
    """

    def __init__(
        self,
        store: ReplicaSource,
        settings: HASettings,
        clock: Clock,
        *,
        message_size_max: int = MESSAGE_BODY_SIZE_MAX,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.window = window_bytes(message_size_max)
        self._server: Acceptor | None = None  # ours, as the client ports' (TLS alike)
        # Every link from accept to connection_lost, in accept order (the oldest pending first).
        self._links: dict[_Link, None] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # every sender until it has finished
        self._waiters = AckWaiters(settings.sync_timeout_ms)
        self._log_limit = LogLimit(log, clock)
        self._lag_samples = LagSamples()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._listening = False
        self._in_sync: InSync | None = None  # controller mode only
        self._confirm_listeners = ConfirmListeners()
        self._join_timer: asyncio.TimerHandle | None = None  # the oldest joiner's time is up

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        assert self._server is None, "HAMaster started twice"
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        tls = accept_tls(self.settings.tls, self._log_limit)
        sock = listen(self.settings.listen_host, self.settings.listen_port)
        self._server = Acceptor(sock, lambda: _Link(self), name="HA", log=self._log_limit, tls=tls)
        self._server.start()
        if not self._listening:  # the store has no remove: one registration per master
            self.store.add_append_listener(self._on_append)
        self._listening = True
        log.info("HA master listening on %s:%d", self.settings.listen_host, self.port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.port

    async def stop(self) -> None:
        """Close the listener and every slave connection, end every task, answer every waiter."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.close()
        links = list(self._links)
        for link in links:
            link.abort()
        # Senders of links already gone may still be finishing their cancellation.
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *(link.lost for link in links), return_exceptions=True)
        self._links.clear()
        self._arm_join_timer(None)
        self._waiters.fail_all(ResponseCode.SLAVE_NOT_AVAILABLE)
        log.info("HA master stopped")

    # --- acknowledgements -----------------------------------------------------------------------

    def on_acked(self, end: int, callback: AckCallback) -> None:
        """Call `callback(code)` once a slave acknowledged the log up to `end` (ack rule in the
        module docstring). On the event loop; an exception the callback raises is logged."""
        if self._in_sync is not None:
            # Joiners and the confirm told first: a SUCCESS's end is <= it (in_sync.py).
            if end <= self._in_sync.floor(self._group_changed()):
                call_back(callback, ResponseCode.SUCCESS)
            else:
                self._waiters.add(end, callback)
            return
        best = self.acked_offset
        if not self._streaming() or end - best > self.settings.max_gap_not_in_sync:
            call_back(callback, ResponseCode.SLAVE_NOT_AVAILABLE)
        elif end <= best:
            call_back(callback, ResponseCode.SUCCESS)
        else:
            self._waiters.add(end, callback)

    async def wait_acked(self, end: int) -> int:
        """`on_acked` awaited: the ResponseCode."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def answer(code: int) -> None:
            if not future.done():
                future.set_result(code)

        self.on_acked(end, answer)
        return await future

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # --- controller mode (in_sync.py) -----------------------------------------------------------

    def set_sync_set(self, ids: frozenset[int] | None, self_id: int) -> None:
        """Acknowledge by the group rule of `ids` (this master is `self_id`); None: the 4.x
        rule. Waiters a shrink covers are released at once; a joiner left out of `ids` stays
        JOINING (the controller may still be CASing it in). On the loop."""
        if ids is None:
            self._in_sync = None  # and every joiner with it
            self._arm_join_timer(None)
            return
        in_sync = self._in_sync
        if in_sync is None:
            in_sync = self._in_sync = InSync(self_id, self.store.max_physical_offset, self.window)
        acks = self._acks()
        in_sync.change(ids, self_id, acks, self.clock.monotonic_ms())
        log.info("HA sync set %s (this master: %d)", sorted(ids), self_id)
        self._group_changed(acks)

    @property
    def confirm_offset(self) -> int:
        """min(the sync set's and the joiners' acked offsets, the log end); pulls see what the
        listeners were told, which never steps back. Without a sync set: the log end."""
        end = self.store.max_physical_offset
        if self._in_sync is None:
            return end
        return self._in_sync.confirm(self._acks(), end)

    def add_confirm_listener(self, fn: Callable[[int], None]) -> None:
        """Call `fn(confirm_offset)` on the loop each time it advances, and at once if it did
        before (controller mode)."""
        self._confirm_listeners.add(fn)

    def lagging(self, max_ms: float) -> frozenset[int]:
        """Sync set members (not this master) that have not had the whole log at any moment
        of the last `max_ms` (haMaxTimeSlaveNotCatchup): the controller drops them. `max_ms`
        is also the longest a replica stays JOINING without entering the set."""
        if self._in_sync is None:
            return frozenset()
        now_ms, end = self.clock.monotonic_ms(), self.store.max_physical_offset
        late = self._in_sync.lagging(self._acks(), end, max_ms, now_ms)
        self._arm_join_timer(self._in_sync.join_due_ms(now_ms))  # max_ms may have changed
        return late

    def caught_up(self) -> frozenset[int]:
        """JOINING replicas that hold every acknowledged message: the controller may CAS them
        into syncSet, then name them in `set_sync_set`."""
        if self._in_sync is None:
            return frozenset()
        return self._in_sync.caught_up(self._group_changed())

    def _acks(self) -> dict[int, int]:
        """Replica id → the best acked offset of its streaming links."""
        return best_acks((link.broker_id, link.session.acked) for link in self._streaming())

    def _group_changed(self, acks: dict[int, int] | None = None) -> dict[int, int]:
        """Drop and admit joiners, release what the group rule now covers, tell the confirm
        listeners if it advanced; returns the acks. Joiners are admitted before the release:
        what is released from then on waited for them."""
        in_sync = self._in_sync
        assert in_sync is not None
        acks = self._acks() if acks is None else acks
        now_ms, end = self.clock.monotonic_ms(), self.store.max_physical_offset
        in_sync.prune(acks, end, now_ms)
        in_sync.join(acks, end, self._confirm_listeners.confirmed, now_ms)
        self._waiters.release(in_sync.floor(acks))
        self._confirm_listeners.advance(in_sync.confirm(acks, end))
        self._arm_join_timer(in_sync.join_due_ms(now_ms))
        return acks

    def _arm_join_timer(self, due_ms: float | None) -> None:
        """Wake in `due_ms` to drop a joiner whose time is up even if nothing else happens
        (None: no timer). A timer due as early (within 1 ms) is kept: one per deadline."""
        timer, loop = self._join_timer, self._loop
        if loop is None:  # not started: no link, so no joiner
            return
        when = None if due_ms is None else loop.time() + max(due_ms, 0) / 1000
        if timer is not None:
            if when is not None and timer.when() <= when + 0.001:
                return
            timer.cancel()
        self._join_timer = None if when is None else loop.call_at(when, self._join_time_up)

    def _join_time_up(self) -> None:
        self._join_timer = None
        if self._in_sync is not None:
            self._group_changed()

    @property
    def acked_offset(self) -> int:
        """The highest offset a streaming slave acknowledged (0: none)."""
        return max((link.session.acked for link in self._streaming()), default=0)

    @property
    def max_offset(self) -> int:
        """The end of what was sent to the furthest slave (0: none)."""
        return max((link.session.sent_end for link in self._streaming()), default=0)

    def slaves(self) -> list[SlaveInfo]:
        now_ms = self.clock.monotonic_ms()
        end = self.store.max_physical_offset
        links = sorted(self._streaming(), key=lambda link: link.connected_since_ms)
        return [
            self._lag_samples.slave_info(link, link.session.acked, end, now_ms) for link in links
        ]

    def _streaming(self) -> list[_Link]:
        # A dropped link stays in _links until connection_lost runs (a loop turn later): it
        # must not count as a slave for acks meanwhile.
        return [link for link in self._links if link.streaming and not link.closed]

    # --- events from links and the store --------------------------------------------------------

    def _on_append(self, end: int) -> None:
        """The store's append listener (the writer thread: the loop's, in the broker)."""
        if self._server is None:
            return
        if threading.get_ident() != self._loop_thread:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._on_append, end)
            return
        now_ms = self.clock.monotonic_ms()
        self._lag_samples.appended(end, now_ms)
        for link in self._links:
            link.wake.set()
        if self._in_sync is not None:
            acks = self._acks()
            self._in_sync.appended(acks, end, now_ms)
            self._group_changed(acks)

    def _on_report(self, link: _Link) -> None:
        link.wake.set()  # the window moved
        if self._in_sync is not None:
            self._in_sync.reported(link.broker_id, link.session.acked, self.clock.monotonic_ms())
            self._group_changed(self._acks())
        else:
            self._waiters.release(self.acked_offset)
        slowest = min((other.session.acked for other in self._streaming()), default=0)
        self._lag_samples.trim(slowest)

    def _admit(self, link: _Link) -> bool:
        """Take a new connection in; with PENDING_CONNECTIONS_MAX handshakes pending, the
        oldest is evicted (a flood of idle sockets delays a slave by one eviction at most)."""
        if self._server is None:
            return False
        pending = [other for other in self._links if not other.streaming and not other.closed]
        if len(pending) >= PENDING_CONNECTIONS_MAX:
            pending[0].drop("evicted by a newer connection: %d handshakes pending", len(pending))
        self._links[link] = None
        return True

    def _judge(self, link: _Link, event: ha.AuthReceived) -> None:
        """Answer a slave's AUTH; an OK verdict starts its sender."""
        auth = event.auth
        store = self.store
        try:
            status, start = ha.judge(
                auth,
                mac_ok=event.mac_ok,
                offset_min=store.min_physical_offset,
                offset_max=store.max_physical_offset,
                tail_before=store.bytes_before,
            )
        except StoreError as exc:
            link.drop("its AUTH could not be checked against the log: %s", exc)
            return
        if status is ha.VerdictStatus.OK and len(self._streaming()) >= SLAVES_MAX:
            link.drop("%d slaves already stream", SLAVES_MAX)
            return
        link.session.send_verdict(status, start, store.max_physical_offset)
        link.write(link.session.data_to_send())
        if status is not ha.VerdictStatus.OK:
            self._log_limit.warning(
                "HA slave %s (brokerId %d, offset %d) refused: %s",
                link.addr,
                auth.broker_id,
                auth.slave_max,
                status.name,
            )
            link.close()
            return
        link.start_streaming(auth.broker_id, start)
        if self._in_sync is not None:  # its AUTH's offset may already cover waiters
            self._on_report(link)
        log.info(
            "HA slave %s (brokerId %d) follows from offset %d (its end %d, ours %d)",
            link.addr,
            auth.broker_id,
            start,
            auth.slave_max,
            store.max_physical_offset,
        )

    def _on_lost(self, link: _Link) -> None:
        self._links.pop(link, None)
        if link.streaming and self._in_sync is not None:
            self._in_sync.lost(link.broker_id, link.session.acked, self.clock.monotonic_ms())
            if self._server is not None:  # a joiner gone must not hold acks back
                self._group_changed()
        if link.streaming:
            log.info("HA slave %s (brokerId %d) disconnected", link.addr, link.broker_id)

    # --- the sender -----------------------------------------------------------------------------

    async def send_loop(self, link: _Link) -> None:
        """One slave's sender: frames while there is log to send within the window, a heartbeat
        when idle, the drop of a silent slave."""
        heartbeat_ms = self.settings.heartbeat_interval_ms
        silence_ms = self.settings.housekeeping_interval_ms
        try:
            while not link.closed:
                link.wake.clear()
                now_ms = self.clock.monotonic_ms()
                if now_ms - link.heard_ms > silence_ms:
                    link.drop("silent for %.0f ms", now_ms - link.heard_ms)
                    return
                if self._send_some(link):
                    await asyncio.sleep(0)
                    continue
                if now_ms - link.sent_ms >= heartbeat_ms:
                    link.write(ha.encode_frame_header(link.session.sent_end, 0))
                    link.sent_ms = now_ms
                wait_ms = min(
                    heartbeat_ms - (now_ms - link.sent_ms), silence_ms - (now_ms - link.heard_ms)
                )
                await wait_woken(link.wake, max(wait_ms, 1.0) / 1000)
        except StoreError as exc:
            # The slave's next byte is gone (retention deleted it) or a read failed.
            link.drop("its next offset %d cannot be read: %s", link.session.sent_end, exc)
        except Exception:
            # A bug: seen in full, and the slave reconnects to a fresh link.
            log.exception("HA sender for slave %s failed", link.addr)
            link.abort()

    def _send_some(self, link: _Link) -> int:
        """Write frames from the slave's next offset: at most SEND_BURST_BYTES, within the
        window, while the transport takes them. Returns the bytes sent."""
        session = link.session
        offset = start = session.sent_end
        limit = max(session.acked, link.start_offset) + self.window
        end = min(self.store.max_physical_offset, limit)
        batch = self.settings.transfer_batch_size
        while link.sendable and offset < end and offset - start < SEND_BURST_BYTES:
            data = self.store.read_replica(offset, min(batch, end - offset))
            if not data:
                break
            link.write_frame(offset, data)
            offset += len(data)
        if offset == start:
            return 0
        session.note_sent(offset)
        link.sent_ms = self.clock.monotonic_ms()
        return offset - start


class _Link(asyncio.Protocol):
    """One slave connection: the session, its transport and the sender's state."""

    def __init__(self, master: HAMaster) -> None:
        self.master = master
        self.session = ha.MasterSession(master.settings.secret, secrets.token_bytes(ha.NONCE_SIZE))
        self.transport: asyncio.Transport | None = None
        self.addr = "?"
        self.broker_id = 0
        self.start_offset = 0
        self.streaming = False
        self.closed = False
        self.writable = True
        self.connected_since_ms = 0
        self.streaming_since_ms = 0.0
        self.heard_ms = self.sent_ms = master.clock.monotonic_ms()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # Done once the transport is gone (stop() waits for it: no socket outlives the master).
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._handshake_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclasses of asyncio.Transport, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.addr = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self.master._admit(self):
            self.closed = True
            transport.abort()  # not in the master's links: nobody waits for `lost`
            return
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        transport.write(self.session.data_to_send())
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(
            handshake_timeout_ms(self.master.settings) / 1000, self._handshake_expired
        )

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard_ms = self.master.clock.monotonic_ms()
        try:
            events = self.session.receive(data)
        except ProtocolError as exc:
            self.drop("%s", clip_peer_text(exc))
            return
        reported = False
        for event in events:
            if isinstance(event, ha.AuthReceived):
                self.master._judge(self, event)
            else:
                reported = True
        if reported:
            self.master._on_report(self)

    def eof_received(self) -> bool:
        return False  # a half-closed slave is gone: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self.task is not None:
            self.task.cancel()
        if not self.lost.done():
            self.lost.set_result(None)
        self.master._on_lost(self)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.wake.set()

    def start_streaming(self, broker_id: int, start_offset: int) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.broker_id = broker_id
        self.start_offset = start_offset
        self.streaming = True
        self.connected_since_ms = self.master.clock.now_ms()
        self.streaming_since_ms = self.master.clock.monotonic_ms()
        loop = asyncio.get_running_loop()
        self.task = task = loop.create_task(
            self.master.send_loop(self), name=f"ha-send-{self.addr}"
        )
        tasks = self.master._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @property
    def sendable(self) -> bool:
        """Open, and the transport's buffer below its high-water mark."""
        transport = self.transport
        return (
            self.writable
            and not self.closed
            and transport is not None
            and not (transport.is_closing())
        )

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def write_frame(self, offset: int, data: bytes) -> None:
        assert self.transport is not None
        self.transport.writelines((ha.encode_frame_header(offset, len(data)), data))

    def drop(self, reason: str, *args: object) -> None:
        self.master._log_limit.warning(
            "HA slave %s (brokerId %d) dropped: " + reason, self.addr, self.broker_id, *args
        )
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.wake.set()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after what is written (a refusal's VERDICT) has gone out."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if not self.streaming and not self.closed:
            self.drop("no handshake within %d ms", handshake_timeout_ms(self.master.settings))


def handshake_timeout_ms(settings: HASettings) -> int:
    """How long a connection may take from accept to its AUTH."""
    return min(HANDSHAKE_TIMEOUT_MS, settings.housekeeping_interval_ms)
