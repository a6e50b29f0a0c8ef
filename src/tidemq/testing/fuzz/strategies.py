"""Hypothesis strategies for VALID structures, each with where its integer fields lie.

Every builder here goes through the product's own encoder (frame.encode, encode_batch,
encode_record, encode_properties), so a case's unmutated bytes are exactly what a peer or the
store would produce; `mutations.apply` then breaks them. `Sample.fields` lists (offset, width) of
each length and count the layout has, as the layouts are drawn in the encoders' docstrings.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final

import orjson
from hypothesis import strategies as st

from tidemq.broker.filter import sql92
from tidemq.protocol import record as rec
from tidemq.protocol.frame import RemotingCommand, SerializeType, encode, encode_parts
from tidemq.protocol.message import BatchItem, encode_batch
from tidemq.testing.fuzz.mutations import Sample

# Text without surrogates (not encodable as UTF-8) and, where a format reserves them, without
# its separators.
_chars = st.characters(codec="utf-8")
_prop_chars = st.characters(codec="utf-8", exclude_characters="\x01\x02")
texts = st.text(_chars, min_size=1, max_size=24)
prop_texts = st.text(_prop_chars, min_size=1, max_size=24)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)

# Values a peer may put in any extFields slot: numbers at and past every width, spellings a
# lenient parser may half-accept, non-ASCII digits, control bytes, a number longer than Python's
# int() accepts from text (4300 digits), and ordinary ones.
WEIRD_FIELD_VALUES: Final = (
    "",
    " ",
    "-",
    "+1",
    " 7 ",
    "0x10",
    "1e3",
    "1.5",
    "nan",
    "inf",
    "-0",
    "true",
    "TRUE",
    "1",
    "0",
    "\x00",
    "\u0661\u0662",  # Arabic-Indic digits: str.isdigit() is true, int() accepts them
    "\uff11",  # fullwidth 1
    str(2**31),
    str(-(2**31) - 1),
    str(2**63),
    str(-(2**63) - 1),
    "9" * 19,
    "9" * 5000,
    "-" + "1" * 5000,
    "a" * 70_000,
    "TopicA",
    "%RETRY%G",
    "*",
    "{}",
    "[]",
    '{"a":1}',
)
field_values = st.sampled_from(WEIRD_FIELD_VALUES) | st.text(_chars, max_size=12)

commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=i32,
    flag=st.integers(0, 3),
    ext_fields=st.dictionaries(texts, texts, max_size=6),
    body=st.binary(max_size=200),
    remark=st.none() | texts,
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=st.integers(0, 2**15 - 1),
    serialize_type=st.sampled_from(list(SerializeType)),
)


def frame_fields(frame: bytes, start: int, command: RemotingCommand) -> list[tuple[int, int]]:
    """(offset, width) of the frame's lengths, and of the binary header's when it has one."""
    fields = [(start, 4), (start + 4, 4), (start + 5, 3)]
    if command.serialize_type is not SerializeType.ROCKETMQ:
        return fields
    position = start + 8 + 13  # code, language, version, opaque, flag
    (remark_len,) = struct.unpack_from(">i", frame, position - start)
    fields.append((position, 4))
    position += 4 + remark_len
    fields.append((position, 4))
    position += 4
    for key, value in command.ext_fields.items():
        fields.append((position, 2))
        position += 2 + len(key.encode())
        fields.append((position, 4))
        position += 4 + len(value.encode())
    return fields


@st.composite
def frame_streams(draw: st.DrawFn) -> tuple[list[RemotingCommand], Sample]:
    """1-3 encoded frames back to back (JSON and binary headers)."""
    batch = draw(st.lists(commands, min_size=1, max_size=3))
    data = b""
    fields: list[tuple[int, int]] = []
    for command in batch:
        frame = encode(command)
        fields += frame_fields(frame, len(data), command)
        data += frame
    return batch, Sample(data, tuple(fields))


# JSON fragments put where a header value goes: every type but the expected one, numbers past
# every width, a lone surrogate escape, and nesting deeper than orjson's limit (1024).
WEIRD_JSON: Final = (
    b"null",
    b"true",
    b"false",
    b"1.5",
    b"-0",
    b"1e400",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"2147483648",
    b"-2147483649",
    b'""',
    b'"\\ud800"',
    b'"\\u0000"',
    b"[]",
    b"{}",
    b'{"a":[1,{"b":null}]}',
    b'"' + b"9" * 5000 + b'"',
    b"[" * 2000 + b"]" * 2000,
    b'{"a":' * 300 + b"1" + b"}" * 300,
)
HEADER_KEYS: Final = ("code", "opaque", "flag", "version", "extFields", "language", "remark")


_MARKER: Final = "\x00FUZZ\x00"


def json_header_dict(command: RemotingCommand) -> dict[str, Any]:
    """The header object `frame.encode` writes for a JSON command (read back from what it
    writes, so the two cannot drift)."""
    head, _ = encode_parts(dataclasses.replace(command, serialize_type=SerializeType.JSON))
    header: dict[str, Any] = orjson.loads(head[8:])  # past total_len and ser_type|hdr_len
    return header


@st.composite
def json_headers(draw: st.DrawFn) -> Sample:
    """A JSON-header frame (without its total length) whose header has one value (a top-level
    key, an extFields value, or extFields itself) replaced by a weird JSON fragment."""
    command = draw(commands)
    header = json_header_dict(command)
    key = draw(st.sampled_from(HEADER_KEYS + tuple(f"ext:{k}" for k in command.ext_fields)))
    if key.startswith("ext:"):
        header["extFields"][key[4:]] = _MARKER
    else:
        header[key] = _MARKER
    text = orjson.dumps(header)
    marker = orjson.dumps(_MARKER)
    assert text.count(marker) == 1
    text = text.replace(marker, draw(st.sampled_from(WEIRD_JSON)))
    return Sample(struct.pack(">I", len(text)) + text + command.body, ((0, 4), (1, 3)))


# -- batches, records, properties, SQL92 ---------------------------------------------------------

properties_maps = st.dictionaries(prop_texts, prop_texts, max_size=6)
batch_items = st.lists(
    st.builds(
        BatchItem,
        flag=i32,
        body=st.binary(max_size=100),
        properties=properties_maps.map(lambda m: "".join(f"{k}\x01{v}\x02" for k, v in m.items())),
    ),
    max_size=4,
)


@st.composite
def batch_bodies(draw: st.DrawFn) -> tuple[list[BatchItem], Sample]:
    """A batch body (message_batch.py's layout) and its items; fields: every item's five ints
    and its properties length."""
    items = draw(batch_items)
    data = encode_batch(items)
    fields: list[tuple[int, int]] = []
    position = 0
    for item in items:
        fields += [(position + 4 * i, 4) for i in range(5)]
        position += 20 + len(item.body)
        fields.append((position, 2))
        position += 2 + len(item.properties.encode())
    return items, Sample(data, tuple(fields))


_hosts = st.tuples(
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda parts: ".".join(map(str, parts))), i32
)
record_fields = st.fixed_dictionaries(
    {
        "topic": st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=127),
        "queue_id": i32,
        "body": st.binary(max_size=200),
        "flag": i32,
        "properties": properties_maps.map(
            lambda m: "".join(f"{k}\x01{v}\x02" for k, v in m.items())
        ),
        "sys_flag": st.integers(0, 0xF),
        "born_timestamp": i64,
        "born_host": _hosts,
        "store_timestamp": i64,
        "store_host": _hosts,
        "reconsume_times": i32,
        "prepared_transaction_offset": i64,
        "queue_offset": i64,
        "physical_offset": i64,
    }
)


def record_sample(fields: dict[str, Any]) -> Sample:
    """The encoded record of `fields`, with TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, BODYLENGTH,
    TOPICLENGTH and PROPERTIESLENGTH as its integer fields (record.py's layout)."""
    data = rec.encode_record(**fields)
    topic_at = rec.BODY_OFFSET + len(fields["body"])
    props_at = topic_at + 1 + len(fields["topic"].encode())
    offsets = ((0, 4), (4, 4), (8, 4), (12, 4), (36, 4), (84, 4), (topic_at, 1), (props_at, 2))
    return Sample(data, offsets)


# SQL92: an expression tree drawn, rendered as text, and parsed back.
_KEYWORDS: Final = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
idents = (
    st.from_regex(r"[A-Za-z_$][A-Za-z0-9_.$]{0,8}", fullmatch=True)
    .filter(lambda name: name.upper() not in _KEYWORDS)
    .map(sql92.Ident)
)
scalar_literals = st.one_of(
    st.text(_chars, max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
).map(sql92.Literal)
_ops = st.sampled_from(["=", "<>", "!=", ">", ">=", "<", "<="])
_leaves = st.one_of(
    st.builds(sql92.Compare, _ops, idents, scalar_literals),
    st.builds(sql92.Compare, _ops, scalar_literals, idents),
    st.builds(sql92.Between, idents, scalar_literals, scalar_literals, st.booleans()),
    st.builds(
        sql92.In,
        idents,
        st.lists(scalar_literals, min_size=1, max_size=4).map(tuple),
        st.booleans(),
    ),
    st.builds(sql92.IsNull, idents, st.booleans()),
    st.booleans().map(sql92.Literal),
)
sql_exprs: st.SearchStrategy[sql92.Expr] = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.builds(sql92.Not, children),
        st.builds(
            sql92.BoolOp,
            st.sampled_from(["AND", "OR"]),
            st.lists(children, min_size=2, max_size=3).map(tuple),
        ),
    ),
    max_leaves=12,
)


def render_literal(literal: sql92.Literal) -> str:
    value = literal.value
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def render_sql(expr: sql92.Expr) -> str:
    """SQL92 text that `sql92.parse` reads back as `expr` (every compound parenthesised)."""
    if isinstance(expr, sql92.Literal):
        return render_literal(expr)
    if isinstance(expr, sql92.Compare):
        left, right = (
            x.name if isinstance(x, sql92.Ident) else render_literal(x)
            for x in (expr.left, expr.right)
        )
        return f"{left} {expr.op} {right}"
    if isinstance(expr, sql92.Between):
        neg = "NOT " if expr.negated else ""
        low, high = render_literal(expr.low), render_literal(expr.high)
        return f"{expr.ident.name} {neg}BETWEEN {low} AND {high}"
    if isinstance(expr, sql92.In):
        neg = "NOT " if expr.negated else ""
        values = ", ".join(render_literal(v) for v in expr.values)
        return f"{expr.ident.name} {neg}IN ({values})"
    if isinstance(expr, sql92.IsNull):
        return f"{expr.ident.name} IS {'NOT ' if expr.negated else ''}NULL"
    if isinstance(expr, sql92.Not):
        return f"NOT ({render_sql(expr.operand)})"
    return f" {expr.op} ".join(f"({render_sql(operand)})" for operand in expr.operands)


# Text put into an expression: unbalanced quotes and parentheses, keywords out of place, numbers
# past every width, deep nesting, characters outside the grammar.
SQL_NOISE: Final = (
    "'",
    "''",
    "(",
    ")",
    ",",
    "NOT ",
    " AND ",
    " OR ",
    " IS ",
    " IN ",
    " BETWEEN ",
    "NULL",
    "=",
    "<>",
    "!",
    "1e999",
    "-1e-999",
    "9" * 4000,
    ".",
    "\x00",
    "\u00e9",
    "(" * 200,
    ")" * 200,
    "NOT " * 100,
    "a=1 AND " * 100,
)
property_dicts = st.dictionaries(
    st.sampled_from(["a", "b", "TAGS", "KEYS", "x.y", "$n"]) | texts,
    st.sampled_from(["1", "-1", "1.5", "true", "x", "", "1e999", "nan", "9" * 5000]) | texts,
    max_size=6,
)
