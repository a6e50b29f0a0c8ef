"""The rich half of cli/progress.py: the bar itself, imported only when one is drawn."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

# How often the bar is redrawn: often enough to look live, rarely enough to cost nothing
# next to network round trips.
REFRESHES_PER_SECOND: Final = 8


class RateColumn(ProgressColumn):
    """Items per second over rich's recent-speed window ("2,409/s"), "-" before the first."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("-", style="progress.data.speed")
        return Text(f"{speed:,.0f}/s", style="progress.data.speed")


class _Bar:
    def __init__(self, progress: Progress, task_id: TaskID) -> None:
        self._progress = progress
        self._task_id = task_id

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task_id, amount)


def _columns(total: int | None) -> list[ProgressColumn]:
    columns: list[ProgressColumn] = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn() if total is not None else TextColumn("{task.completed:,}"),
        RateColumn(),
        TimeElapsedColumn(),
    ]
    if total is not None:
        columns.append(TimeRemainingColumn())
    return columns


@contextmanager
def bar(description: str, total: int | None, console: Console | None) -> Iterator[_Bar]:
    """A live bar on `console` (None: stderr) for `total` items (None: unknown)."""
    progress = Progress(
        *_columns(total),
        console=console if console is not None else Console(file=sys.stderr),
        refresh_per_second=REFRESHES_PER_SECOND,
        # A terminal's stdout (per-message lines) is printed above the bar, not through it; a
        # piped stdout is the verb's result, left alone.
        redirect_stdout=sys.stdout.isatty(),
        redirect_stderr=False,
    )
    with progress:
        task_id = progress.add_task(description, total=total)
        yield _Bar(progress, task_id)
        progress.refresh()
