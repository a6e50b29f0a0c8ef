"""`print_table`: the column-aligned output every CLI verb prints (admin, dlq, tx)."""

from __future__ import annotations


def print_table(rows: list[list[str]]) -> None:
    """Print `rows` (the first is the header) left-aligned, two spaces between columns."""
    if not rows:
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
