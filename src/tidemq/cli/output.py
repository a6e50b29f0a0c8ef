"""`--json` for the read verbs: one JSON document on stdout, nothing else on stdout.

A script that parses a table breaks the day a column is added; one that reads a JSON document
does not. Every read verb takes --json (tests/cli/test_cli_output.py walks the parser and fails
on a read verb without it) and then prints exactly one document, made by orjson, followed by a
newline. Errors and notes still go to stderr, and the exit status is the table's: a script can
test the status first and parse stdout after.

`jsonable` turns what the client returns (frozen dataclasses, enums, mappings keyed by
MessageQueue) into plain JSON values. Field names stay the dataclasses' own (snake_case); keys
that are data, such as the broker's runtime-info and config keys, are kept as the broker
spells them.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import enum
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from tidemq.client.message import MessageExt

JSON_HELP = "print one JSON document on stdout instead of a table"


def add_json_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give a read verb --json (the parser walk in the tests looks for this dest)."""
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    return parser


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def emit_json(document: Any) -> None:
    """Print `document` (made JSON-able by `jsonable`) as the one thing on stdout."""
    text = orjson.dumps(jsonable(document), option=orjson.OPT_INDENT_2).decode()
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def jsonable(value: Any) -> Any:
    """Plain JSON values for `value`: dataclasses become objects, enums their names, bytes
    UTF-8 text, and a mapping with keys that are not strings a list of {key, value}."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, MessageExt):
        return message_document(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        if all(isinstance(key, str | int) for key in value):
            return {str(key): jsonable(item) for key, item in value.items()}
        return [{"key": jsonable(key), "value": jsonable(item)} for key, item in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    return str(value)


def message_document(message: MessageExt) -> dict[str, Any]:
    """A received message as the verbs that show messages print it with --json. A body that is
    not UTF-8 text is base64 (body_encoding says which): replacing its bytes would lose them."""
    try:
        body, encoding = message.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(message.body).decode("ascii"), "base64"
    return {
        "topic": message.topic,
        "broker_name": message.broker_name,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "msg_id": message.msg_id,
        "offset_msg_id": message.offset_msg_id,
        "tags": message.tags,
        "keys": list(message.keys),
        "reconsume_times": message.reconsume_times,
        "born_timestamp": message.born_timestamp,
        "store_timestamp": message.store_timestamp,
        "born_host": f"{message.born_host[0]}:{message.born_host[1]}",
        "store_host": f"{message.store_host[0]}:{message.store_host[1]}",
        "properties": dict(message.properties),
        "body": body,
        "body_encoding": encoding,
    }


def records_rows(records: list[Mapping[str, Any]]) -> list[list[str]]:
    """A table (header first) of JSON-able records, one column per key in first-seen order;
    used for answers whose shape the CLI only relays (connections, running info)."""
    columns: list[str] = []
    for record in records:
        columns.extend(key for key in record if key not in columns)
    rows = [[column.upper() for column in columns]]
    for record in records:
        rows.append([_cell(record.get(column)) for column in columns])
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return str(value)
