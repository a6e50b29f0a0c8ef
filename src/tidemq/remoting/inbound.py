"""Inbound frame buffering: one connection's decoder, and the bound on what incomplete frames of
all of a server's connections may hold.

A frame announces its length first, so a peer can announce 16 MiB, send most of it and stop: the
frame limit bounds one connection, not a server (40 such connections took a broker from 130 to
730 MB). Two limits close that:

    bytes held for incomplete frames, summed over a server's connections  <= incomplete_bytes_max
    time from an incomplete frame's first byte to its last                 <  completion_timeout

Past the byte bound the connections holding the most are closed (and logged) until the sum is
under it again: the peers that pin the most memory go first, and a well-behaved client, whose
partial tails are a few KiB, is never the largest while a hostile one is there. Stopping reading
instead would leave the held bytes held, and a peer that never finishes its frame would keep the
budget from everyone else. The completion deadline is checked by the server's sweep
(server.py): the idle timeout cannot catch a peer that sends a byte now and then.

Frames that arrive whole are decoded straight from the read and never held; only a partial tail
is charged. A malformed or oversized frame raises ProtocolError from `feed`: the decoder cannot
resynchronise a byte stream, so the connection closes (the peer is broken or hostile).

A well-formed frame whose header alone is over FRAME_HEADER_SIZE_MAX is a request to refuse, not
a broken stream: the decoder sets it aside (`oversized`) and the connection answers it with
`oversized_answer`'s code and remark (a send: MESSAGE_ILLEGAL naming its properties' size and
their limit, as upstream answers properties over 32767 bytes; anything else: SYSTEM_ERROR naming
the header's size and limit). The C++ client puts a message's keys and tags in its send header,
so a 1 MiB KEYS property used to close the connection ("No route info" in that client). The
decoder reads no more of such a header than that answer needs (protocol/frame.py: a binary
header's fixed part, a JSON header's fixed fields and properties, a JSON header over twice the
limit not at all: that closes), so a peer gets no costly decoding out of it; an oversized
response reaches its waiter as `oversized_response`'s SYSTEM_ERROR.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.limits import FRAME_HEADER_SIZE_MAX, FRAME_SIZE_MAX, MESSAGE_PROPERTIES_SIZE_MAX, MIB
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import (
    FLAG_RESPONSE,
    OVERSIZED_KEPT_FIELDS,
    FrameDecoder,
    HeaderTooLargeError,
    RemotingCommand,
)
from tidemq.remoting.log_limit import LogLimit, clip_peer_text

logger = logging.getLogger(__name__)

# Bytes of incomplete frames one server holds across all its connections: eight maximal frames
# (or 32 maximal messages) in progress at once, far above what honest clients keep partly sent,
# and small beside the broker's resident budget. bytearray growth adds up to 1/8 on top.
INCOMPLETE_FRAME_BYTES_MAX: Final = 128 * MIB
# An incomplete frame must be complete this long after its first byte arrived (a maximal frame
# at 0.6 MB/s); a Java client's own send timeout is 3 s.
FRAME_COMPLETION_TIMEOUT_MS: Final = 30_000


def frame_bytes_held_max(frame_size_max: int) -> int:
    """The most one connection holds of an incomplete frame: its 4-byte length and up to
    `frame_size_max` bytes after it. A budget below this could never receive a maximal frame."""
    return frame_size_max + 4


assert frame_bytes_held_max(FRAME_SIZE_MAX) <= INCOMPLETE_FRAME_BYTES_MAX

# The requests that carry a message: a header over its limit there is the message's properties
# (keys, tags, user properties) over theirs.
SEND_CODES: Final = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)
# Where a send header keeps the properties: SEND_MESSAGE's name, SEND_MESSAGE_V2's short one
# (the fields the decoder keeps of an oversized header).
_PROPERTIES_FIELDS: Final = OVERSIZED_KEPT_FIELDS


def oversized_answer(refused: HeaderTooLargeError) -> tuple[int, str]:
    """The code and remark of a request whose header is over FRAME_HEADER_SIZE_MAX."""
    command = refused.command
    header = f"the request header of {refused.header_size} bytes exceeds the limit of "
    header += f"{FRAME_HEADER_SIZE_MAX} bytes"
    if command.code not in SEND_CODES:
        return ResponseCode.SYSTEM_ERROR, header
    fields = command.ext_fields
    properties = next((fields[k] for k in _PROPERTIES_FIELDS if k in fields), "")
    size = len(properties.encode(errors="replace"))
    if size <= MESSAGE_PROPERTIES_SIZE_MAX:  # another field made it (a huge topic, say)
        return ResponseCode.MESSAGE_ILLEGAL, header
    return ResponseCode.MESSAGE_ILLEGAL, (
        f"the message properties (keys, tags and user properties) of {size} bytes exceed the "
        f"limit of {MESSAGE_PROPERTIES_SIZE_MAX} bytes ({header})"
    )


def oversized_response(refused: HeaderTooLargeError) -> RemotingCommand:
    """What the waiter of a response whose header is over FRAME_HEADER_SIZE_MAX gets: the
    response when it was decoded whole, else a SYSTEM_ERROR saying why (never a response
    stripped of its fields)."""
    command = refused.command
    if refused.complete:
        return command
    return RemotingCommand(
        code=ResponseCode.SYSTEM_ERROR,
        opaque=command.opaque,
        flag=FLAG_RESPONSE,
        remark=f"the response header of {refused.header_size} bytes exceeds the limit of "
        f"{FRAME_HEADER_SIZE_MAX} bytes",
        serialize_type=command.serialize_type,
    )


EvictCallback = Callable[[], None]


class InboundFrames:
    """One connection's frame decoder: what it holds, since when, charged to a FrameBudget.

    Attributes:
        name: the connection as the log names it (the peer's "host:port").
        incomplete_since_ms: monotonic time the current incomplete frame began; None when
            nothing is held.
    """

    __slots__ = (
        "_budget",
        "_clock",
        "_decoder",
        "_frame_size_max",
        "_on_evict",
        "incomplete_since_ms",
        "name",
        "oversized",
    )

    def __init__(
        self,
        frame_size_max: int,
        clock: Clock,
        *,
        budget: FrameBudget | None = None,
        on_evict: EvictCallback | None = None,
    ) -> None:
        assert budget is None or on_evict is not None
        self._frame_size_max = frame_size_max
        self._clock = clock
        self._budget = budget
        self._on_evict = on_evict
        self._decoder = FrameDecoder(frame_size_max)
        # The decoder's frames whose header is over its limit, to answer and clear (an attribute,
        # not a property: the connection looks at it after every read).
        self.oversized: list[HeaderTooLargeError] = self._decoder.oversized
        self.incomplete_since_ms: float | None = None
        self.name = ""

    def log_malformed(self, peer: str, error: ProtocolError) -> None:
        """One warning for a connection closed over a malformed frame: through the server's
        shared rate limit when there is one (any peer can open connections and send garbage),
        with the error's text only (a record that kept the exception would keep its frames)."""
        text = clip_peer_text(error)
        if self._budget is not None:
            self._budget.log.warning("closing connection from %s: %s", peer, text)
        else:
            logger.warning("closing connection from %s: %s", peer, text)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        """Decode what `data` completes; hold the rest, charged to the budget (which may close
        connections, this one included, when the sum goes over its bound).

        Raises:
            ProtocolError: a frame length below the minimum or above the frame limit, or a frame
                that cannot be decoded. The caller closes the connection.
        """
        held_before = self._decoder.buffered
        commands = self._decoder.feed(data)
        held = self._decoder.buffered
        if not held:
            self.incomplete_since_ms = None
        elif commands or not held_before:
            # A new frame began in this read: its deadline starts now.
            self.incomplete_since_ms = self._clock.monotonic_ms()
        if self._budget is not None and (held or held_before):
            self._budget.hold(self, held)
        return commands

    def release(self) -> None:
        """Drop what is held (the connection is closing); the decoder starts afresh."""
        if self._decoder.buffered:
            self._decoder = FrameDecoder(self._frame_size_max)
            self.oversized = self._decoder.oversized
        self.incomplete_since_ms = None
        if self._budget is not None:
            self._budget.hold(self, 0)

    def evict(self) -> None:
        """Called by the budget: release what is held and close the connection."""
        self.release()
        if self._on_evict is not None:
            self._on_evict()


class FrameBudget:
    """The bytes of incomplete frames held across one server's connections, and its bound.

    Each InboundFrames reports what it holds after every read; past `bytes_max` the holders of
    the most are evicted (closed), largest first, the last charged first among equals, until the
    sum is at most `bytes_max` again.
    """

    __slots__ = ("_held", "buffered_bytes", "buffered_bytes_peak", "bytes_max", "evictions", "log")

    def __init__(self, bytes_max: int, log: LogLimit) -> None:
        assert bytes_max > 0
        self.bytes_max = bytes_max
        self.buffered_bytes = 0
        # The most held at once after evictions (for tests and operators): never over bytes_max.
        self.buffered_bytes_peak = 0
        self.evictions = 0
        self.log = log  # rate-limits what peers make us log about frames
        # Insertion order is charge order (`hold` re-inserts on every read), so among equal
        # holders the one that read last is the last.
        self._held: dict[InboundFrames, int] = {}

    @property
    def holders(self) -> int:
        """Connections holding an incomplete frame."""
        return len(self._held)

    def hold(self, frames: InboundFrames, held_bytes: int) -> None:
        """Record that `frames` now holds `held_bytes`; evict holders while over the bound."""
        self.buffered_bytes += held_bytes - self._held.pop(frames, 0)
        if held_bytes:
            self._held[frames] = held_bytes
        while self.buffered_bytes > self.bytes_max:
            self._evict_largest()
        self.buffered_bytes_peak = max(self.buffered_bytes_peak, self.buffered_bytes)

    def _evict_largest(self) -> None:
        victim = max(reversed(self._held), key=self._held.__getitem__)
        held = self._held[victim]
        self.log.warning(
            "closing %s: incomplete frames hold %d bytes across connections, over the bound of "
            "%d bytes; it held the most, %d",
            victim.name,
            self.buffered_bytes,
            self.bytes_max,
            held,
        )
        self.evictions += 1
        victim.evict()
