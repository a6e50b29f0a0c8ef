"""Issue 17 item 5, the offline half: --json on every read verb (a walk of the real parser),
rich tables that fit the terminal, and progress bars drawn only on a terminal."""

from __future__ import annotations

import argparse
import io
import re
import time
from collections.abc import Iterator

import orjson
import pytest
from rich.console import Console

from tidemq.cli.main import build_parser
from tidemq.cli.output import jsonable, records_rows
from tidemq.cli.progress import track
from tidemq.cli.table import print_table
from tidemq.protocol.bodies import MessageQueue

# Leaves that change something or run a server: they need no --json. Every other leaf is a
# read verb and must take --json; a new read verb without it fails the walk below.
NOT_READ = frozenset(
    {
        "namesrv",
        "broker",
        "dev",
        "console",
        "send",
        "consume",
        "topic create",
        "topic delete",
        "message resend",
        "group delete",
        "dlq resend",
        "broker config set",
    }
)


def _leaves(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, bool]]:
    """(verb path, has --json) for every parser that runs something."""
    sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    runs = parser.get_default("run") is not None
    if not sub or runs:
        yield path, any(a.dest == "json" for a in parser._actions)
    for action in sub:
        for name, child in action.choices.items():
            yield from _leaves(child, f"{path} {name}".strip())


def test_every_read_verb_takes_json() -> None:
    leaves = dict(_leaves(build_parser()))
    for expected in ("topic list", "cluster list", "broker status", "group list", "tx stats"):
        assert expected in leaves
    lacking = sorted(path for path, has_json in leaves.items() if not has_json)
    assert [path for path in lacking if path not in NOT_READ] == []


def test_jsonable_turns_queue_keyed_tables_into_lists() -> None:
    queue = MessageQueue(topic="T", broker_name="b", queue_id=1)
    document = jsonable({"offsets": {queue: 5}, "raw": b"\xffok", "ids": (1, 2)})
    assert orjson.loads(orjson.dumps(document)) == {
        "offsets": [{"key": {"topic": "T", "broker_name": "b", "queue_id": 1}, "value": 5}],
        "raw": "\ufffdok",
        "ids": [1, 2],
    }
    rows = records_rows([{"clientId": "c1", "version": 1}, {"clientId": "c2", "language": "JAVA"}])
    assert rows == [["CLIENTID", "VERSION", "LANGUAGE"], ["c1", "1", "-"], ["c2", "-", "JAVA"]]


def test_tables_stay_plain_text_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    print_table([["TOPIC", "LAG"], ["[not markup]", "12"]])
    assert capsys.readouterr().out == "TOPIC         LAG\n[not markup]  12\n"


def test_tables_on_a_terminal_fit_its_width() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=40, color_system=None)
    long_value = "x" * 70
    print_table([["KEY", "VALUE"], ["brokerName", long_value], ["[b]", "1"]], console=console)
    lines = out.getvalue().splitlines()
    assert lines
    assert all(len(line) <= 40 for line in lines)
    text = out.getvalue()
    assert "brokerName" in text
    assert "[b]" in text
    assert text.count("x") == 70  # folded onto more lines, not cut


def test_progress_bar_shows_count_and_rate_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with track("sending", 40, console=console) as bar:
        for _ in range(40):
            bar.advance()
            time.sleep(0.001)  # a rate needs time to pass between the steps
    final = out.getvalue().rsplit("\r", 1)[-1]
    assert "sending" in final
    assert "40/40" in final
    assert re.search(r"\d/s", final), final


def test_progress_is_silent_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with track("consuming", None) as bar:
        bar.advance(3)
    drawn = io.StringIO()
    with track("sending", 5, console=Console(file=drawn, force_terminal=True), show=False) as bar:
        bar.advance()
    assert capsys.readouterr() == ("", "")
    assert drawn.getvalue() == ""
