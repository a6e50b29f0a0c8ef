"""Progress bars with rates for the CLI's long work (send/consume --count, offset resets,
dlq resend, store verify), drawn by rich on stderr, and only when stderr is a terminal.

Why stderr, and why only a terminal: stdout carries the verb's result (message lines, a table,
a --json document) and must stay byte-for-byte what a script expects, and a bar redrawn with
carriage returns is noise in a log file. So piped or captured, `track` hands out a tracker that
does nothing, and the output is what it was before bars existed.

    sending   ━━━━━━━━━━━━━━━━━━━━━━━━╺━━━━━━━━━━━━━━━  6,114/10,000  2,409/s  0:00:02  0:00:01

A total that is unknown (a consume without --count, a store being verified) draws a pulsing bar
with the count and the rate so far. Tests render the bar into a StringIO through a Console made
with force_terminal=True (the `console` argument). rich is imported only when a bar is drawn
(cli/progress_bar.py): a piped CLI run does not pay for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console


class Tracker(Protocol):
    def advance(self, amount: int = 1) -> None: ...


class _Silent:
    """The tracker when no bar is drawn: counting costs one call that does nothing."""

    def advance(self, amount: int = 1) -> None:
        return None


@contextmanager
def track(
    description: str, total: int | None, *, console: Console | None = None, show: bool = True
) -> Iterator[Tracker]:
    """A tracker to `advance` as work is done: a bar on `console`, or on stderr when it is a
    terminal; else silent (and silent with show=False: one message needs no bar). The bar stays
    on screen at the end, with the final count and rate."""
    if not show or (console is None and not sys.stderr.isatty()):
        yield _Silent()
        return
    from tidemq.cli.progress_bar import bar

    with bar(description, total, console) as tracker:
        yield tracker
