"""LogLimit: at most a few log lines per window, then one count of what was left out.

What a peer can make us log must cost us far less than it costs the peer: a 120-byte malformed
frame once cost 1 KiB of traceback. Errors caused by a peer (a malformed request, a frame past a
limit, a full descriptor table while clients keep connecting) are therefore logged through a
LogLimit: one per connection for a peer's protocol errors, one per server for what the server
does to protect itself. Tracebacks stay for our own bugs, which are not rate-limited: a bug must
be seen.
"""

from __future__ import annotations

import logging
from typing import Final

from tidemq.clock import Clock

# Lines a limit lets through per window: the first errors show what is going on; more of the
# same say nothing new.
LOG_LINES_PER_WINDOW_MAX: Final = 3
# The window; a peer that keeps failing is reported again, with the count left out, this often.
LOG_WINDOW_MS: Final = 10_000
# Characters of a peer-supplied text (an error that quotes a field, a refusal's remark) that reach
# the log: a 100 KB header field once made a 150 KB line, and the line only has to say what was
# wrong.
PEER_ERROR_LOG_CHARS_MAX: Final = 300


def clip_peer_text(text: object) -> str:
    """`text` for a log line, cut to PEER_ERROR_LOG_CHARS_MAX characters."""
    text = str(text)
    if len(text) > PEER_ERROR_LOG_CHARS_MAX:
        return f"{text[:PEER_ERROR_LOG_CHARS_MAX]}... ({len(text)} characters)"
    return text


class LogLimit:
    """Logs at most `lines_max` lines per `window_ms` to `logger`; the first line of a later
    window says how many were left out before it.

    Not thread-safe: each instance belongs to one event loop.
    """

    __slots__ = ("_clock", "_left_out", "_lines", "_lines_max", "_logger", "_start", "_window_ms")

    def __init__(
        self,
        logger: logging.Logger,
        clock: Clock,
        *,
        lines_max: int = LOG_LINES_PER_WINDOW_MAX,
        window_ms: int = LOG_WINDOW_MS,
    ) -> None:
        assert lines_max > 0
        assert window_ms > 0
        self._logger = logger
        self._clock = clock
        self._lines_max = lines_max
        self._window_ms = window_ms
        self._start = clock.monotonic_ms()
        self._lines = 0
        self._left_out = 0

    def log(self, level: int, message: str, *args: object) -> bool:
        """Log `message % args` at `level` unless this window is full; True when it was logged."""
        now_ms = self._clock.monotonic_ms()
        if now_ms - self._start >= self._window_ms:
            self._start = now_ms
            self._lines = 0
        if self._lines >= self._lines_max:
            self._left_out += 1
            return False
        self._lines += 1
        if self._left_out:
            message += " (%d similar lines left out before this one)"
            args = (*args, self._left_out)
            self._left_out = 0
        self._logger.log(level, message, *args)
        return True

    def warning(self, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, message, *args)
