"""Repository lints that ruff does not know (after TigerBeetle's tidy.zig).

Each rule keeps a property the architecture relies on: small modules, time and randomness only
through injected objects, no output from library code, sans-I/O codecs and a synchronous store.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "tidemq"
MODULE_LINES_MAX = 600
# A function longer than this no longer fits on one screen with its context, and in this tree
# every one that grew past it did several things (parse, check, act, answer) that read and test
# better apart. Counted from `def` to the function's last line, docstring and comments included.
FUNCTION_LINES_MAX = 70
# Parts allowed to print, read the wall clock or draw random numbers directly.
EDGE_PARTS = ("cli", "testing")
EDGE_MODULES = ("clock.py",)


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _part(path: Path) -> str:
    return path.relative_to(SRC).parts[0]


def _code_lines(path: Path) -> list[tuple[int, str]]:
    lines = []
    in_docstring = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""')
        if in_docstring:
            if quotes:
                in_docstring = False
            continue
        if stripped.startswith('"""') and quotes == 1:
            in_docstring = True
            continue
        if stripped.startswith("#"):
            continue
        lines.append((number, line))
    return lines


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_module_is_tidy(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MODULE_LINES_MAX, f"{path} is over {MODULE_LINES_MAX} lines"
    at_edge = _part(path) in EDGE_PARTS or path.name in EDGE_MODULES
    for number, line in _code_lines(path):
        where = f"{path.relative_to(SRC)}:{number}"
        assert not re.search(r"\bexcept\s*:", line), f"bare except at {where}"
        if not at_edge:
            assert not re.search(r"(?<![\w.])print\(", line), f"print( at {where}"
            assert "time.time(" not in line, f"time.time( at {where}: inject a Clock"
            assert not re.search(r"(?<![\w.])random\.(?!Random\b|SystemRandom\b)\w+\(", line), (
                f"module-level random at {where}: inject a random.Random"
            )
        if _part(path) in ("protocol", "store"):
            assert not re.match(r"\s*(import asyncio|from asyncio)", line), (
                f"asyncio imported at {where}: protocol and store stay synchronous"
            )


def _function_lines(path: Path) -> dict[str, int]:
    """Map each function's qualified name (`Class.method`, `outer.inner`) to its length in lines."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return lengths


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_functions_are_short(path: Path) -> None:
    module = str(path.relative_to(SRC))
    for name, lines in _function_lines(path).items():
        assert lines <= FUNCTION_LINES_MAX, (
            f"{module}: {name} is {lines} lines (max {FUNCTION_LINES_MAX}): split it by what each "
            "part does"
        )
