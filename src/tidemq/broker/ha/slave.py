"""HASlave: follows its master's commit log into this store, byte for byte.

    set_master(addr) ──▶ connect loop (one task)
      IDLE (no master known) ──set_master──▶ CONNECTING
      CONNECTING ──TCP──▶ HANDSHAKE ──VERDICT OK──▶ FOLLOWING
      HANDSHAKE ──VERDICT refused──▶ REFUSED: one error line (why, what to do); retry in 5 s
      FOLLOWING ──bytes the store refuses (ReplicaCorruptError, ReplicaOffsetError)──▶ REFUSED
      any state ──close, error, master silent──▶ BACKOFF 0.5 s doubling to 5 s ──▶ CONNECTING
      (set_master to a new address skips the wait)

The back-off restarts at 0.5 s only after a healthy connection: one that appended log bytes or
stayed FOLLOWING for a heartbeat interval. A connection that passes the handshake and then breaks
at once (a broken store, a master that closes) keeps doubling it: no 2 Hz reconnect storm.
Bytes the store refuses will be refused again on every retry (most often mappedFileSizeCommitLog
differs between master and slave): they are a refusal like a verdict's, with `refused_reason`
set (`tidemq cluster list` shows it) until a connection is healthy again.

    FOLLOWING, per read:  frames ──▶ pending ──append_replica(offset of pending[0])──▶ log
                          └ the unit still incomplete stays pending (the held tail) for the
                            next read; then the store's new max offset is reported

The store only takes whole CRC-valid units at its own end (store/replica.py), so a master that
dies mid-frame leaves a valid prefix, and a restart (even after kill -9) resumes from the
store's end: the slave's state is its log. The session (protocol/ha.py) checks that each frame
starts where the last ended; the store checks that the bytes continue its log. A slave reports
after each append and every heartbeat interval, and drops a master silent for
housekeeping_interval_ms. It never truncates its log: a refusal (AHEAD, DIVERGED,
BEHIND_RETENTION) needs an operator (automatic truncation is the failover issue, 14).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
from dataclasses import dataclass
from typing import Final, Protocol, cast

from tidemq.broker.ha.settings import HASettings, window_bytes
from tidemq.broker.service import cancel_and_wait, wait_woken
from tidemq.clock import Clock
from tidemq.errors import ProtocolError, ReplicaCorruptError, ReplicaOffsetError, StoreError
from tidemq.limits import MESSAGE_BODY_SIZE_MAX
from tidemq.protocol import ha
from tidemq.remoting.log_limit import LogLimit, clip_peer_text

log = logging.getLogger(__name__)

# Reconnect back-off after a failed or lost connection (then every REFUSED_RETRY_S at most).
BACKOFF_S_MIN: Final = 0.5
BACKOFF_S_MAX: Final = 5.0
# After a refusal nothing changes until an operator acts: retry at the slow pace.
REFUSED_RETRY_S: Final = 5.0
# A master that does not accept the TCP connection within this long is unreachable.
CONNECT_TIMEOUT_S: Final = 5.0
# A refusal's error line is repeated at most this often while it lasts.
REFUSAL_LOG_WINDOW_MS: Final = 600_000

REFUSAL_ADVICE: Final = {
    ha.VerdictStatus.BAD_SECRET: (
        "the master rejected our haSecret: give master and slave the same haSecret"
    ),
    ha.VerdictStatus.AHEAD: (
        "this slave's commit log ends after the master's: it holds bytes the master lost (the "
        "master restarted after a crash?). Move this slave's store directory aside to copy the "
        "master afresh; automatic truncation is not done (issue 14)"
    ),
    ha.VerdictStatus.DIVERGED: (
        "this slave's last commit-log bytes differ from the master's at the same offsets (its "
        "store was written by another master or by hand). Move its store directory aside to "
        "copy the master afresh"
    ),
    ha.VerdictStatus.BEHIND_RETENTION: (
        "the master has deleted the commit-log files this slave needs next. Move this slave's "
        "store directory aside to copy the master's whole log, or keep files longer on the "
        "master (fileReservedTime)"
    ),
}


class ReplicaSink(Protocol):
    """What the slave uses of its store (FileMessageStore in replica mode)."""

    @property
    def max_physical_offset(self) -> int: ...

    def append_replica(self, offset: int, data: bytes | memoryview) -> int: ...

    def bytes_before(self, end: int, size_max: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class SlaveState:
    master_addr: str | None  # the master's HA address, None while unknown
    connected: bool  # following (handshake passed)
    replica_offset: int  # this store's max physical offset
    master_max: int  # the master's end as last seen (VERDICT, frames)
    refused_reason: str | None  # why the master refused us, while it does
    last_frame_ms: int  # wall clock of the last frame (0: none yet)
    lag_bytes: int
    lag_ms: int  # since the replica last reached master_max (0: it is there)


class Outcome(enum.Enum):
    FAILED = "failed"  # no connection, it broke before the VERDICT, or soon after it
    FOLLOWED = "followed"  # reached FOLLOWING, appended or lasted a heartbeat, then ended
    REFUSED = "refused"  # a refusing VERDICT, or bytes this store refuses


# What a slave operator checks when the store refuses the master's bytes, by error.
STREAM_FAULT_ADVICE: Final = {
    ReplicaCorruptError: (
        "the master sent bytes this store refuses as a commit-log unit. Check that "
        "mappedFileSizeCommitLog is equal on master and slave (a blank marker that does not end "
        "this store's segment is refused); if it is, the master's log is damaged at that offset"
    ),
    ReplicaOffsetError: (
        "the master's stream does not continue this store's log. Check that "
        "mappedFileSizeCommitLog is equal on master and slave (an empty slave starts at the "
        "master's first retained segment, which must start a segment of its own)"
    ),
}


class HASlave:
    """Follows the master set by `set_master` (module docstring).

    Args:
        store: this broker's store, in replica mode.
        settings: the HA knobs (listen_* unused).
        clock: monotonic time for silence and lag, wall time for `last_frame_ms`.
        broker_id: this slave's brokerId, sent in its AUTH.
        message_size_max: this store's maxMessageSize (bounds the held tail).
    """

    def __init__(
        self,
        store: ReplicaSink,
        settings: HASettings,
        clock: Clock,
        *,
        broker_id: int = 1,
        message_size_max: int = MESSAGE_BODY_SIZE_MAX,
    ) -> None:
        assert broker_id >= 1
        self.store = store
        self.settings = settings
        self.clock = clock
        self.broker_id = broker_id
        # A master keeps within its window; twice ours leaves room for a master configured
        # with larger messages, and still bounds what a broken master can make us hold.
        self.pending_max = 2 * window_bytes(message_size_max)
        self._master_addr: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._link: _MasterLink | None = None
        self._stopped = False
        self.master_max = 0
        self.refused_reason: str | None = None
        # The refused_reason is a stream fault: a mere OK verdict does not clear it.
        self._stream_fault = False
        self._refusal_kind: str | None = None  # of the last refusal logged at once
        self.last_frame_ms = 0
        self._caught_up_ms = clock.monotonic_ms()
        self.log_limit = LogLimit(log, clock)
        self._refusal_log = _refusal_log_limit(clock)

    def set_master(self, ha_addr: str | None) -> None:
        """Follow the master at `ha_addr` ("host:port"; None: no master known). On the loop."""
        if self._stopped or (ha_addr == self._master_addr and self._task is not None):
            return
        if ha_addr != self._master_addr:
            log.info("HA master address %s (was %s)", ha_addr, self._master_addr)
            self._master_addr = ha_addr
            self._clear_refusal()
            if self._link is not None:
                self._link.abort()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-slave")
        self._wake.set()

    async def stop(self) -> None:
        """End the connection and the connect loop."""
        self._stopped = True
        task, self._task = self._task, None
        await cancel_and_wait(task)

    @property
    def following(self) -> bool:
        """Connected to a master and past its OK verdict."""
        link = self._link
        return link is not None and link.following and not link.closed

    def state(self) -> SlaveState:
        replica = self.store.max_physical_offset
        lag_bytes = max(0, self.master_max - replica)
        lag_ms = 0
        if lag_bytes:
            lag_ms = int(self.clock.monotonic_ms() - self._caught_up_ms)
        return SlaveState(
            master_addr=self._master_addr,
            connected=self.following,
            replica_offset=replica,
            master_max=self.master_max,
            refused_reason=self.refused_reason,
            last_frame_ms=self.last_frame_ms,
            lag_bytes=lag_bytes,
            lag_ms=lag_ms,
        )

    # --- the connect loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        backoff_s = BACKOFF_S_MIN
        while True:
            self._wake.clear()
            addr = self._master_addr
            if addr is None:
                await self._wake.wait()
                continue
            try:
                outcome = await self._follow(addr)
            except Exception:
                # A bug, or a store that cannot even say where it ends: seen in full, retried.
                log.exception("HA slave: following %s failed", addr)
                outcome = Outcome.FAILED
            if outcome is Outcome.REFUSED:
                delay_s = REFUSED_RETRY_S
            elif outcome is Outcome.FOLLOWED:  # healthy: appended or lasted a heartbeat
                backoff_s = delay_s = BACKOFF_S_MIN
            else:
                delay_s = backoff_s
                backoff_s = min(backoff_s * 2, BACKOFF_S_MAX)
            if not self._wake.is_set():  # a new master address skips the wait
                await wait_woken(self._wake, delay_s)

    async def _follow(self, addr: str) -> Outcome:
        """One connection to `addr`, from connect to close."""
        try:
            host, port = parse_address(addr)
        except ValueError as exc:
            self.log_limit.warning("HA master address %r unusable: %s", addr, exc)
            return Outcome.FAILED
        slave_max = self.store.max_physical_offset
        tail = self.store.bytes_before(slave_max, ha.TAIL_SIZE_MAX)
        session = ha.SlaveSession(
            self.settings.secret,
            secrets.token_bytes(ha.NONCE_SIZE),
            slave_max=slave_max,
            broker_id=self.broker_id,
            tail=tail,
        )
        link = _MasterLink(self, session, addr)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                tls = self.settings.client_ssl  # the master's HA port checks our cert, if any
                await loop.create_connection(
                    lambda: link, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except (OSError, TimeoutError) as exc:
            self.log_limit.warning("HA master %s unreachable: %s", addr, exc or "timeout")
            return Outcome.FAILED
        self._link = link
        try:
            if addr == self._master_addr:  # else set_master moved on while we connected
                await self._watch(link)
        finally:
            link.abort()
            await link.lost
            self._link = None
        if link.outcome is Outcome.FOLLOWED and not self._healthy(link):
            return Outcome.FAILED  # broke right after the verdict: keep backing off
        return link.outcome

    def _healthy(self, link: _MasterLink) -> bool:
        """Whether `link` was healthy: it appended log bytes, or followed for a heartbeat
        interval (then a refusal left by a stream fault is over)."""
        followed_ms = link.followed_ms
        if not link.appended and (
            followed_ms is None
            or self.clock.monotonic_ms() - followed_ms < self.settings.heartbeat_interval_ms
        ):
            return False
        if self._stream_fault and link.outcome is Outcome.FOLLOWED:
            self._clear_refusal()
        return True

    def _clear_refusal(self) -> None:
        self.refused_reason = None
        self._stream_fault = False
        self._refusal_kind = None  # the same cause coming back is logged again at once

    async def _watch(self, link: _MasterLink) -> None:
        """Until the connection ends: report every heartbeat interval, drop a silent master."""
        interval_s = self.settings.heartbeat_interval_ms / 1000
        silence_ms = self.settings.housekeeping_interval_ms
        while not link.lost.done():
            await asyncio.wait({link.lost}, timeout=interval_s)
            if link.closed:
                return
            if link.following:
                link.report()
                self._healthy(link)
            quiet_ms = self.clock.monotonic_ms() - link.heard_ms
            if quiet_ms > silence_ms:
                self.log_limit.warning("HA master %s silent for %.0f ms", link.addr, quiet_ms)
                return

    # --- events from the link -------------------------------------------------------------------

    def on_verdict(self, link: _MasterLink, verdict: ha.Verdict) -> None:
        self.master_max = max(self.master_max, verdict.master_max)
        if verdict.status is ha.VerdictStatus.OK:
            link.outcome = Outcome.FOLLOWED
            link.followed_ms = self.clock.monotonic_ms()
            if not self._stream_fault:
                self._clear_refusal()
            log.info(
                "HA following master %s from offset %d (its end %d)",
                link.addr,
                verdict.start_offset,
                verdict.master_max,
            )
            link.report()
            return
        reason = f"{verdict.status.name}: {REFUSAL_ADVICE[verdict.status]}"
        self._refused(
            link,
            verdict.status.name,
            reason,
            "HA master %s refuses this slave (our end %d, its end %d) %s",
            link.addr,
            self.store.max_physical_offset,
            verdict.master_max,
            reason,
        )
        self._stream_fault = False

    def on_stream_fault(self, link: _MasterLink, exc: StoreError) -> None:
        """The store refused the master's bytes (ReplicaCorruptError or ReplicaOffsetError, whose
        text says at which offset): a refusal until a connection is healthy again."""
        kind = type(exc).__name__
        advice = STREAM_FAULT_ADVICE.get(type(exc), "")
        reason = f"{kind}: {clip_peer_text(exc)}. {advice}"
        self._refused(link, kind, reason, "HA master %s: stream refused, %s", link.addr, reason)
        self._stream_fault = True
        link.abort()

    def _refused(
        self, link: _MasterLink, kind: str, reason: str, message: str, *args: object
    ) -> None:
        """Record a refusal; its error line goes out at once when its kind is new, else at
        most once per REFUSAL_LOG_WINDOW_MS."""
        link.outcome = Outcome.REFUSED
        self.refused_reason = reason
        if kind != self._refusal_kind:  # a new cause: its line now, then a fresh window
            self._refusal_kind = kind
            self._refusal_log = _refusal_log_limit(self.clock)
        self._refusal_log.log(logging.ERROR, message, *args)

    def on_frame(self, end: int) -> None:
        self.master_max = max(self.master_max, end)
        self.last_frame_ms = self.clock.now_ms()

    def on_appended(self, link: _MasterLink) -> None:
        link.appended = True
        if self._stream_fault:
            self._healthy(link)
        if self.store.max_physical_offset >= self.master_max:
            self._caught_up_ms = self.clock.monotonic_ms()


def _refusal_log_limit(clock: Clock) -> LogLimit:
    """One line per refusal's cause, repeated once per REFUSAL_LOG_WINDOW_MS while it lasts."""
    return LogLimit(log, clock, lines_max=1, window_ms=REFUSAL_LOG_WINDOW_MS)


def parse_address(addr: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 host]:port"."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected host:port")
    return host.strip("[]"), int(port)


class _MasterLink(asyncio.Protocol):
    """One connection to the master: the session, the held tail, the appends."""

    def __init__(self, slave: HASlave, session: ha.SlaveSession, addr: str) -> None:
        self.slave = slave
        self.session = session
        self.addr = addr
        self.transport: asyncio.Transport | None = None
        self.outcome = Outcome.FAILED
        self.closed = False
        self.followed_ms: float | None = None  # monotonic, at the OK verdict
        self.appended = False  # the store took bytes of this connection
        # Log bytes received and not yet taken by the store: the start of a unit still
        # incomplete (it sits at session.next_offset - len(pending)).
        self.pending = bytearray()
        self.heard_ms = slave.clock.monotonic_ms()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def following(self) -> bool:
        return self.session.state is ha.State.FOLLOWING

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclasses of asyncio.Transport, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard_ms = self.slave.clock.monotonic_ms()
        try:
            events = self.session.receive(data)
        except ProtocolError as exc:
            self.drop("broke the protocol: %s", clip_peer_text(exc))
            return
        out = self.session.data_to_send()
        if out:
            self._write(out)
        received = False
        for event in events:
            if isinstance(event, ha.FrameData):
                self.pending += event.data
                received = True
            elif isinstance(event, ha.FrameStart):
                self.slave.on_frame(event.offset + event.size)
            else:
                self.slave.on_verdict(self, event.verdict)
        if received:
            self._append()

    def _append(self) -> None:
        """Hand the store what it can take; report its new end."""
        pending = self.pending
        offset = self.session.next_offset - len(pending)
        store = self.slave.store
        try:
            with memoryview(pending) as view:
                consumed = store.append_replica(offset, view)
        except (ReplicaCorruptError, ReplicaOffsetError) as exc:
            self.slave.on_stream_fault(self, exc)
            return
        except (StoreError, OSError) as exc:
            self.drop("sent bytes the store could not append at %d: %s", offset, exc)
            return
        if consumed:
            del pending[:consumed]
            self.slave.on_appended(self)
            self.report()
        if len(pending) > self.slave.pending_max:
            self.drop("left %d bytes that make no whole record", len(pending))

    def report(self) -> None:
        self._write(ha.encode_report(self.slave.store.max_physical_offset))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)

    def drop(self, reason: str, *args: object) -> None:
        self.slave.log_limit.warning("HA master %s dropped: " + reason, self.addr, *args)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        elif not self.lost.done():
            self.lost.set_result(None)
