"""The HA stream between a master and its slaves: TideMQ's handshake, then RocketMQ 4.x's stream.

    slave                                                      master
      |  ------------------------ TCP connect ------------------>  |
      |  <-------- HELLO    "TQHA" version nonce_m        (21 B)  |
      |  --------> AUTH     "TQHS" version nonce_s mac_s
      |                     slave_max broker_id tail_len tail_crc (77 B)  ------->
      |  <-------- VERDICT  status mac_m start_offset master_max  (49 B)  |
      |                     (any status but OK: the master closes)        |
      |  --------> report   slave_max: i64                (8 B, on start, after each append
      |                                                     pass, every heartbeat interval)
      |  <-------- frame    phy_offset: i64 | size: i32 | size bytes of commit log
      |                     (size 0 = heartbeat, sent when idle)

All integers are big-endian. The stream after the VERDICT is upstream's; the handshake is ours:
upstream's HA port takes any client, so anyone could fake an acknowledgement (spec ha.md §2,
upstream issues #3015/#1155). Both ends prove they know the shared secret:

    mac_s = HMAC-SHA256(secret, b"slave"  + nonce_m + nonce_s)   checked by the master
    mac_m = HMAC-SHA256(secret, b"master" + nonce_m + nonce_s)   checked by the slave

    HELLO    off size              AUTH      off size               VERDICT  off size
    magic      0   4 "TQHA"        magic       0   4 "TQHS"         status     0   1 VerdictStatus
    version    4   1 1             version     4   1 1              mac_m      1  32 (zeros unless
    nonce_m    5  16               nonce_s     5  16                                 the MAC held)
                                   mac_s      21  32                start     33   8 first frame
                                   slave_max  53   8                master_max 41  8
                                   broker_id  61   8
                                   tail_len   69   4  bytes of the slave's log before slave_max
                                   tail_crc   73   4  zlib.crc32 of them (divergence check)

`judge` is the master's decision, in this order: a wrong MAC is BAD_SECRET (and the VERDICT
carries nothing but that status); a slave_max past the master's end is AHEAD (the slave has bytes
the master does not); an empty slave (slave_max 0) starts at the master's first byte (the whole
history, unlike upstream, which starts it at the last segment); a slave_max before the master's
first byte is BEHIND_RETENTION (exactly at it, nothing is left to compare: OK); a tail whose crc
differs from the master's bytes at the same range is DIVERGED; otherwise the stream starts at
slave_max.

Each side is one sans-I/O session: `receive(bytes)` returns events, `data_to_send()` the bytes
to write. Bytes may arrive split anywhere; frame bodies come out in pieces as they arrive
(`FrameData`), so a slave can append whole records of a frame that never completes.

    slave session                                  master session
    AWAIT_HELLO --HELLO--> AWAIT_VERDICT           AWAIT_AUTH --AUTH--> AUTH_RECEIVED
    AWAIT_VERDICT --VERDICT OK--> FOLLOWING        AUTH_RECEIVED --VERDICT OK--> STREAMING
    AWAIT_VERDICT --VERDICT refused--> CLOSED      AUTH_RECEIVED --VERDICT refused--> CLOSED

Any other (state, input) pair is a ProtocolError, as are a bad magic or version, a frame whose
offset is not where the last one ended, a frame size outside 0..FRAME_DATA_SIZE_MAX, a report
that goes back or past what was sent, and bytes from the master session's peer before its
VERDICT.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from tidemq.errors import ProtocolError
from tidemq.limits import MIB

VERSION: Final = 1
HELLO_MAGIC: Final = b"TQHA"
AUTH_MAGIC: Final = b"TQHS"
NONCE_SIZE: Final = 16
MAC_SIZE: Final = 32
# The slave sends at most this many bytes of its log's tail for the divergence check: enough to
# cover the last record of an ordinary workload, and one crc32 of it costs microseconds.
TAIL_SIZE_MAX: Final = 4096
# A frame carries at most haTransferBatchSize bytes (32 KiB by default); a size above this is
# not a frame from a TideMQ master but a broken or hostile stream.
FRAME_DATA_SIZE_MAX: Final = 16 * MIB

HELLO: Final = struct.Struct(">4sB16s")
assert HELLO.size == 21
AUTH: Final = struct.Struct(">4sB16s32sqqII")
assert AUTH.size == 77
VERDICT: Final = struct.Struct(">B32sqq")
assert VERDICT.size == 49
FRAME_HEADER: Final = struct.Struct(">qi")  # phy_offset, size
assert FRAME_HEADER.size == 12
REPORT: Final = struct.Struct(">q")  # the slave's max physical offset
assert REPORT.size == 8
_NO_MAC: Final = bytes(MAC_SIZE)


class VerdictStatus(enum.IntEnum):
    OK = 0
    BAD_SECRET = 1
    AHEAD = 2  # the slave's log is longer than the master's
    DIVERGED = 3  # the slave's last bytes differ from the master's at the same offsets
    BEHIND_RETENTION = 4  # the slave's end is in files the master has deleted


@dataclass(frozen=True, slots=True)
class Hello:
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Auth:
    nonce: bytes
    mac: bytes
    slave_max: int
    broker_id: int
    tail_len: int
    tail_crc: int


@dataclass(frozen=True, slots=True)
class Verdict:
    status: VerdictStatus
    mac: bytes
    start_offset: int
    master_max: int


def slave_mac(secret: bytes, nonce_m: bytes, nonce_s: bytes) -> bytes:
    return hmac.new(secret, b"slave" + nonce_m + nonce_s, hashlib.sha256).digest()


def master_mac(secret: bytes, nonce_m: bytes, nonce_s: bytes) -> bytes:
    return hmac.new(secret, b"master" + nonce_m + nonce_s, hashlib.sha256).digest()


def tail_crc(tail: bytes) -> int:
    return zlib.crc32(tail)


def encode_hello(nonce: bytes) -> bytes:
    assert len(nonce) == NONCE_SIZE
    return HELLO.pack(HELLO_MAGIC, VERSION, nonce)


def decode_hello(data: bytes) -> Hello:
    magic, version, nonce = HELLO.unpack(data)
    _check_magic(magic, version, HELLO_MAGIC, "HELLO")
    return Hello(nonce)


def encode_auth(auth: Auth) -> bytes:
    assert len(auth.nonce) == NONCE_SIZE
    assert len(auth.mac) == MAC_SIZE
    return AUTH.pack(
        AUTH_MAGIC,
        VERSION,
        auth.nonce,
        auth.mac,
        auth.slave_max,
        auth.broker_id,
        auth.tail_len,
        auth.tail_crc,
    )


def decode_auth(data: bytes) -> Auth:
    magic, version, nonce, mac, slave_max, broker_id, tail_len, crc = AUTH.unpack(data)
    _check_magic(magic, version, AUTH_MAGIC, "AUTH")
    if slave_max < 0 or tail_len > TAIL_SIZE_MAX or tail_len > slave_max:
        raise ProtocolError(f"AUTH with slave_max {slave_max} and tail_len {tail_len}")
    return Auth(nonce, mac, slave_max, broker_id, tail_len, crc)


def encode_verdict(verdict: Verdict) -> bytes:
    assert len(verdict.mac) == MAC_SIZE
    return VERDICT.pack(verdict.status, verdict.mac, verdict.start_offset, verdict.master_max)


def decode_verdict(data: bytes) -> Verdict:
    status, mac, start_offset, master_max = VERDICT.unpack(data)
    try:
        known = VerdictStatus(status)
    except ValueError:
        raise ProtocolError(f"VERDICT with unknown status {status}") from None
    if start_offset < 0 or master_max < 0:
        raise ProtocolError(f"VERDICT with start {start_offset}, master max {master_max}")
    return Verdict(known, mac, start_offset, master_max)


def _check_magic(magic: bytes, version: int, expected: bytes, what: str) -> None:
    if magic != expected:
        raise ProtocolError(f"{what} magic {magic!r}: not a TideMQ HA peer")
    if version != VERSION:
        raise ProtocolError(f"{what} version {version}, this side speaks {VERSION}")


def encode_frame_header(phy_offset: int, size: int) -> bytes:
    assert phy_offset >= 0
    assert 0 <= size <= FRAME_DATA_SIZE_MAX
    return FRAME_HEADER.pack(phy_offset, size)


def encode_report(offset: int) -> bytes:
    assert offset >= 0
    return REPORT.pack(offset)


# Reads `size` bytes of the master's log ending at `end` (the store's bytes_before).
TailReader: TypeAlias = Callable[[int, int], bytes]


def judge(
    auth: Auth, *, mac_ok: bool, offset_min: int, offset_max: int, tail_before: TailReader
) -> tuple[VerdictStatus, int]:
    """The master's answer to `auth` and the offset its stream starts at (module docstring)."""
    if not mac_ok:
        return VerdictStatus.BAD_SECRET, 0
    if auth.slave_max > offset_max:
        return VerdictStatus.AHEAD, 0
    if auth.slave_max == 0:
        return VerdictStatus.OK, offset_min
    if auth.slave_max < offset_min:
        return VerdictStatus.BEHIND_RETENTION, 0
    if auth.slave_max == offset_min:
        # The slave ends where the master's retained log starts: the master no longer has the
        # bytes to compare, and nothing the slave has overlaps what it will be sent.
        return VerdictStatus.OK, auth.slave_max
    tail = tail_before(auth.slave_max, auth.tail_len)
    if len(tail) != auth.tail_len or tail_crc(tail) != auth.tail_crc:
        return VerdictStatus.DIVERGED, 0
    return VerdictStatus.OK, auth.slave_max


# --- sessions -----------------------------------------------------------------------------------


class State(enum.Enum):
    AWAIT_HELLO = "AWAIT_HELLO"
    AWAIT_VERDICT = "AWAIT_VERDICT"
    FOLLOWING = "FOLLOWING"
    AWAIT_AUTH = "AWAIT_AUTH"
    AUTH_RECEIVED = "AUTH_RECEIVED"
    STREAMING = "STREAMING"
    CLOSED = "CLOSED"


class Input(enum.Enum):
    HELLO = "HELLO"
    AUTH = "AUTH"
    VERDICT_OK = "VERDICT_OK"
    VERDICT_REFUSED = "VERDICT_REFUSED"


TRANSITIONS: Final[dict[tuple[State, Input], State]] = {
    (State.AWAIT_HELLO, Input.HELLO): State.AWAIT_VERDICT,
    (State.AWAIT_VERDICT, Input.VERDICT_OK): State.FOLLOWING,
    (State.AWAIT_VERDICT, Input.VERDICT_REFUSED): State.CLOSED,
    (State.AWAIT_AUTH, Input.AUTH): State.AUTH_RECEIVED,
    (State.AUTH_RECEIVED, Input.VERDICT_OK): State.STREAMING,
    (State.AUTH_RECEIVED, Input.VERDICT_REFUSED): State.CLOSED,
}


def advance(state: State, event: Input) -> State:
    """The state after `event` in `state`; ProtocolError for a pair the table does not have."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ProtocolError(f"HA session in {state.value}: {event.value} is not allowed") from None


def _verdict_input(status: VerdictStatus) -> Input:
    return Input.VERDICT_OK if status is VerdictStatus.OK else Input.VERDICT_REFUSED


@dataclass(frozen=True, slots=True)
class AuthReceived:
    auth: Auth
    mac_ok: bool


@dataclass(frozen=True, slots=True)
class VerdictReceived:
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Report:
    offset: int


@dataclass(frozen=True, slots=True)
class FrameStart:
    """A frame's header: `size` bytes follow at `offset` (0: a heartbeat)."""

    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class FrameData:
    """A piece of a frame's body: the log bytes at `offset` (a view of the bytes received)."""

    offset: int
    data: memoryview


MasterEvent: TypeAlias = AuthReceived | Report
SlaveEvent: TypeAlias = VerdictReceived | FrameStart | FrameData


class MasterSession:
    """The master's side of one slave connection (module docstring). Sends HELLO at once."""

    def __init__(self, secret: bytes, nonce: bytes) -> None:
        assert secret
        self.state = State.AWAIT_AUTH
        self._secret = secret
        self._nonce = nonce
        self._auth: Auth | None = None
        self._outbox = bytearray(encode_hello(nonce))
        self._buffer = bytearray()
        # What the slave has reported (starts at its AUTH's slave_max) and the end of what was
        # sent to it: a report must stay between them.
        self.acked = 0
        self.sent_end = 0

    def data_to_send(self) -> bytes:
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def receive(self, data: bytes) -> list[MasterEvent]:
        if self.state is State.STREAMING:
            return self._receive_reports(data)
        if self.state is not State.AWAIT_AUTH:
            raise ProtocolError(f"{len(data)} bytes from the slave in {self.state.value}")
        self._buffer += data
        if len(self._buffer) < AUTH.size:
            return []
        if len(self._buffer) > AUTH.size:
            raise ProtocolError("the slave sent bytes after its AUTH before the VERDICT")
        auth = decode_auth(bytes(self._buffer))
        self._buffer.clear()
        self.state = advance(self.state, Input.AUTH)
        self._auth = auth
        expected = slave_mac(self._secret, self._nonce, auth.nonce)
        return [AuthReceived(auth, hmac.compare_digest(expected, auth.mac))]

    def send_verdict(self, status: VerdictStatus, start_offset: int, master_max: int) -> None:
        """Queue the VERDICT; with OK the session streams from `start_offset`."""
        self.state = advance(self.state, _verdict_input(status))
        auth = self._auth
        assert auth is not None
        if status is VerdictStatus.BAD_SECRET:
            # A peer without the secret learns nothing about the log (no MAC, no offsets).
            verdict = Verdict(status, _NO_MAC, 0, 0)
        else:
            mac = master_mac(self._secret, self._nonce, auth.nonce)
            verdict = Verdict(status, mac, start_offset, master_max)
        self._outbox += encode_verdict(verdict)
        self.acked = auth.slave_max
        self.sent_end = start_offset

    def note_sent(self, end: int) -> None:
        """The log bytes up to `end` were handed to the transport."""
        assert end >= self.sent_end
        self.sent_end = end

    def _receive_reports(self, data: bytes) -> list[MasterEvent]:
        buffer = self._buffer
        buffer += data
        whole = len(buffer) - len(buffer) % REPORT.size
        events: list[MasterEvent] = []
        for (offset,) in REPORT.iter_unpack(memoryview(buffer)[:whole]):
            if offset < self.acked:
                raise ProtocolError(f"slave reported {offset} after {self.acked}")
            if offset > max(self.sent_end, self.acked):
                raise ProtocolError(f"slave reported {offset}, beyond the {self.sent_end} sent")
            self.acked = offset
            events.append(Report(offset))
        del buffer[:whole]
        return events


class SlaveSession:
    """The slave's side of one connection to a master (module docstring).

    Args:
        secret: the shared secret.
        nonce: this connection's random 16 bytes.
        slave_max: the slave store's max physical offset.
        broker_id: the slave's brokerId (>= 1).
        tail: the slave's last bytes before `slave_max` (at most TAIL_SIZE_MAX).
    """

    def __init__(
        self, secret: bytes, nonce: bytes, *, slave_max: int, broker_id: int, tail: bytes
    ) -> None:
        assert secret
        assert len(tail) <= min(TAIL_SIZE_MAX, slave_max)
        self.state = State.AWAIT_HELLO
        self._secret = secret
        self._nonce = nonce
        self._slave_max = slave_max
        self._broker_id = broker_id
        self._tail = tail
        self._master_nonce = b""
        self._outbox = bytearray()
        self._buffer = bytearray()
        self.next_offset = 0  # where the next frame must start (FOLLOWING)
        self._body_left = 0  # bytes of the current frame's body still to come

    def data_to_send(self) -> bytes:
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def receive(self, data: bytes) -> list[SlaveEvent]:
        events: list[SlaveEvent] = []
        view = memoryview(data)
        while view and self.state is not State.CLOSED:
            if self.state is State.FOLLOWING:
                view = self._receive_frames(view, events)
            else:
                view = self._receive_handshake(view, events)
        return events

    def _take(self, view: memoryview, size: int) -> tuple[bytes | None, memoryview]:
        """Buffer `view` towards a `size`-byte message: the message once whole, and the rest."""
        need = size - len(self._buffer)
        self._buffer += view[:need]
        if len(self._buffer) < size:
            return None, view[len(view) :]
        message = bytes(self._buffer)
        self._buffer.clear()
        return message, view[need:]

    def _receive_handshake(self, view: memoryview, events: list[SlaveEvent]) -> memoryview:
        if self.state is State.AWAIT_HELLO:
            message, view = self._take(view, HELLO.size)
            if message is not None:
                self.state = advance(self.state, Input.HELLO)
                self._master_nonce = decode_hello(message).nonce
                self._outbox += encode_auth(self._auth())
            return view
        message, view = self._take(view, VERDICT.size)
        if message is not None:
            verdict = decode_verdict(message)
            if verdict.status is not VerdictStatus.BAD_SECRET:
                expected = master_mac(self._secret, self._master_nonce, self._nonce)
                if not hmac.compare_digest(expected, verdict.mac):
                    raise ProtocolError("the master's VERDICT MAC is wrong: it has another secret")
            self.state = advance(self.state, _verdict_input(verdict.status))
            self.next_offset = verdict.start_offset
            events.append(VerdictReceived(verdict))
        return view

    def _auth(self) -> Auth:
        mac = slave_mac(self._secret, self._master_nonce, self._nonce)
        crc = tail_crc(self._tail)
        return Auth(self._nonce, mac, self._slave_max, self._broker_id, len(self._tail), crc)

    def _receive_frames(self, view: memoryview, events: list[SlaveEvent]) -> memoryview:
        """Header, then body pieces, as far as `view` goes."""
        if self._body_left:
            piece = view[: self._body_left]
            events.append(FrameData(self.next_offset, piece))
            self.next_offset += len(piece)
            self._body_left -= len(piece)
            return view[len(piece) :]
        header, view = self._take(view, FRAME_HEADER.size)
        if header is None:
            return view
        offset, size = FRAME_HEADER.unpack(header)
        if offset != self.next_offset:
            raise ProtocolError(f"frame at offset {offset}, expected {self.next_offset}")
        if not 0 <= size <= FRAME_DATA_SIZE_MAX:
            raise ProtocolError(f"frame of {size} bytes (0..{FRAME_DATA_SIZE_MAX} allowed)")
        self._body_left = size
        events.append(FrameStart(offset, size))
        return view
