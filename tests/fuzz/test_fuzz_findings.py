"""The fuzzers' findings, each pinned by the input that found it (docs/security.md, "Fuzzing")."""

from __future__ import annotations

import struct

import orjson
import pytest

from tidemq.broker.filter import sql92
from tidemq.errors import ProtocolError
from tidemq.protocol.frame import decode_frame
from tidemq.protocol.headers import PullMessageRequestHeader
from tidemq.testing.fuzz.targets import bounded_memory


def test_an_integer_of_5000_digits_is_a_protocol_error() -> None:
    # int() refuses text over 4300 digits with ValueError: the handler logged a traceback.
    fields = {"consumerGroup": "G", "topic": "T", "queueId": "9" * 5000, "queueOffset": "0"}
    with pytest.raises(ProtocolError, match="out of the 64-bit range"):
        PullMessageRequestHeader.from_fields(fields)


def test_an_ext_field_nested_300_deep_is_a_protocol_error() -> None:
    # orjson reads 1024 levels but writes 254: the value's text form raised TypeError.
    header = b'{"code":10,"opaque":1,"flag":0,"version":1,"language":"JAVA","extFields":{"k":'
    header += b'{"a":' * 300 + b"1" + b"}" * 300 + b"}}"
    with pytest.raises(ProtocolError, match="nested too deep"):
        decode_frame(struct.pack(">I", len(header)) + header)
    assert orjson.loads(header)  # the header itself is valid JSON


def test_an_unterminated_sql_string_costs_memory_in_proportion() -> None:
    # The backtracking string pattern held ~140 bytes per character: 0.5 MiB here.
    text = "'" + "9" * 4000 + "A != ''"
    with bounded_memory(len(text)), pytest.raises(sql92.SqlSyntaxError, match="at 0"):
        sql92.parse(text)


def test_sql_strings_still_lex_as_sql_does() -> None:
    # '' inside a string is a quote, also after the possessive rewrite.
    assert sql92.parse("a = 'it''s'") == sql92.Compare("=", sql92.Ident("a"), sql92.Literal("it's"))
    assert sql92.parse("a = '' OR b = 'x'   ") == sql92.BoolOp(
        "OR",
        (
            sql92.Compare("=", sql92.Ident("a"), sql92.Literal("")),
            sql92.Compare("=", sql92.Ident("b"), sql92.Literal("x")),
        ),
    )
