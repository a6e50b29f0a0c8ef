"""`print_table`: the tables every CLI verb prints (admin, cluster, dlq, tx, ops, lookup).

On a terminal the table is drawn by rich and fits its width (long cells wrap instead of pushing
the next columns off the screen). Piped into a file or another program it stays plain text, left
aligned, two spaces between columns, exactly as before rich: scripts that cut columns and the
tests that read them keep working. --json (cli/output.py) is the format meant for scripts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def print_table(rows: list[list[str]], *, console: Console | None = None) -> None:
    """Print `rows` (the first is the header): a rich table on a terminal (or on `console`),
    else plain aligned text."""
    if not rows:
        return
    if console is None and not sys.stdout.isatty():
        _print_plain(rows)
        return
    from rich import box  # only for a terminal: a piped run does not pay for importing rich
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console if console is not None else Console(file=sys.stdout)
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for title in rows[0]:
        table.add_column(Text(title), overflow="fold")
    for row in rows[1:]:
        table.add_row(*(Text(cell) for cell in row))  # cells are data, never markup
    console.print(table)


def _print_plain(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
