"""Every non-success response code has exactly one exception class (nats errors.json, in Python)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from mypy import api as mypy_api

from tidemq import errors
from tidemq.protocol.codes import ResponseCode


def test_every_code_has_exactly_one_class() -> None:
    seen: set[type[errors.BrokerError]] = set()
    for code in ResponseCode:
        if code is ResponseCode.SUCCESS:
            continue
        cls = errors.error_class_for_code(code)
        assert cls is not errors.BrokerError, code
        assert cls.code is code
        assert cls not in seen
        seen.add(cls)


def test_error_for_code_carries_code_and_remark() -> None:
    error = errors.error_for_code(ResponseCode.TOPIC_NOT_EXIST, "no route for T")
    assert isinstance(error, errors.BrokerError)
    assert error.response_code == 17
    assert "TOPIC_NOT_EXIST" in str(error)
    assert "no route for T" in str(error)
    assert error.retriable


def test_unknown_code_falls_back_to_broker_error() -> None:
    error = errors.error_for_code(9999, "odd")
    assert type(error) is errors.BrokerError
    assert error.response_code == 9999
    assert not error.retriable


def test_error_classes_are_class_statements() -> None:
    """Made at import time, they were invisible to type checkers and editors (issue 16)."""
    tree = ast.parse(Path(errors.__file__).read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    for code in ResponseCode:
        if code is not ResponseCode.SUCCESS:
            name = "".join(part.capitalize() for part in code.name.split("_")) + "Error"
            assert errors.error_class_for_code(code).__name__ == name
            assert name in defined, code


def test_importing_an_error_class_type_checks(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from tidemq.errors import BrokerError, TopicNotExistError\n"
        "error: BrokerError = TopicNotExistError('no route')\n"
        "assert TopicNotExistError.code == 17\n",
        encoding="utf-8",
    )
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", os.devnull, str(snippet)]
    )
    assert status == 0, out + err
