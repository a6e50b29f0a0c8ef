"""SQL92 property filters (RocketMQ's `MessageSelector.bySql`): a parser and evaluator of our own.

    expr    := or
    or      := and ("OR" and)*
    and     := not ("AND" not)*
    not     := "NOT" not | pred
    pred    := "(" expr ")" | TRUE | FALSE
             | ident "IS" ["NOT"] "NULL"
             | ident ["NOT"] "BETWEEN" literal "AND" literal
             | ident ["NOT"] "IN" "(" literal ("," literal)* ")"
             | ident op literal            op: = <> != > >= < <=
             | literal op ident
    literal := 'string' ('' escapes a quote) | integer | decimal | TRUE | FALSE

Identifiers are message property names (letters, digits, `_`, `.`, `$`; TAGS and KEYS included);
keywords are case-insensitive. Three-valued logic as in SQL: a comparison with a missing property
or a value of the wrong kind is UNKNOWN (None), NOT UNKNOWN is UNKNOWN, and a message is delivered
only when the whole expression is TRUE. Numbers compare numerically (the property text must parse
as a number), strings only with = and <> (RocketMQ refuses ordering on strings; we answer UNKNOWN).

`tag_codes(expr)` gives the consume-queue sieve: the tag hash codes a message must have for the
expression to be TRUE (from TAGS = 'x' / TAGS IN (...) conjuncts), or None when any tag may pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.protocol.message import TAGS, tag_code

# An expression longer than this is refused (the subscription travels in every pull header).
SQL_EXPRESSION_LENGTH_MAX: Final = 4_096
# Nesting deeper than this is refused (bounds the recursive parser's stack).
SQL_NESTING_MAX: Final = 64

Value = str | int | float | bool
Truth = bool | None


class SqlSyntaxError(ValueError):
    """The expression is not valid SQL92 filter syntax; the message says where."""


@dataclass(frozen=True, slots=True)
class Literal:
    value: Value


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Ident | Literal
    right: Ident | Literal


@dataclass(frozen=True, slots=True)
class Between:
    ident: Ident
    low: Literal
    high: Literal
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    ident: Ident
    values: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    ident: Ident
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # "AND" | "OR"
    operands: tuple[Expr, ...]


Expr = Literal | Compare | Between | In | IsNull | Not | BoolOp

_TOKEN: Final = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^']++|'')*+')
      | (?P<num>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLdDfF]?)
      | (?P<op><>|!=|>=|<=|=|>|<|\(|\)|,)
      | (?P<word>[A-Za-z_$][A-Za-z0-9_.$]*)
    )""",
    re.VERBOSE,
)
# Possessive (*+, ++) as SQL lexes a string: '' inside one is always a quote. Backtracking there
# kept ~140 bytes per character of an unterminated string (0.5 MiB for a 4 KiB expression; found
# by tests/fuzz).
_TRAILING_SPACE: Final = re.compile(r"\s*\Z")
_KEYWORDS: Final = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_COMPARE_OPS: Final = frozenset({"=", "<>", "!=", ">", ">=", "<", "<="})


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # str | num | op | kw | ident | end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if _TRAILING_SPACE.match(text, pos):  # not text[pos:].strip(): quadratic in the length
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise SqlSyntaxError(f"unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        start = match.start(kind)
        if kind == "word":
            kind = "kw" if value.upper() in _KEYWORDS else "ident"
            value = value.upper() if kind == "kw" else value
        tokens.append(_Tok(kind, value, start))
        pos = match.end()
    tokens.append(_Tok("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokenize(text)
        self._i = 0
        self._depth = 0

    @property
    def _tok(self) -> _Tok:
        return self._tokens[self._i]

    def _fail(self, expected: str) -> SqlSyntaxError:
        tok = self._tok
        found = "end of expression" if tok.kind == "end" else repr(tok.text)
        return SqlSyntaxError(f"expected {expected} at {tok.pos}, found {found}")

    def _accept(self, kind: str, text: str | None = None) -> _Tok | None:
        tok = self._tok
        if tok.kind == kind and (text is None or tok.text == text):
            self._i += 1
            return tok
        return None

    def _expect(self, kind: str, text: str | None = None) -> _Tok:
        tok = self._accept(kind, text)
        if tok is None:
            raise self._fail(text or kind)
        return tok

    def parse(self) -> Expr:
        expr = self._or()
        if self._tok.kind != "end":
            raise self._fail("AND, OR or the end")
        return expr

    def _or(self) -> Expr:
        operands = [self._and()]
        while self._accept("kw", "OR"):
            operands.append(self._and())
        return operands[0] if len(operands) == 1 else BoolOp("OR", tuple(operands))

    def _and(self) -> Expr:
        operands = [self._not()]
        while self._accept("kw", "AND"):
            operands.append(self._not())
        return operands[0] if len(operands) == 1 else BoolOp("AND", tuple(operands))

    def _not(self) -> Expr:
        if self._accept("kw", "NOT"):
            return Not(self._nested(self._not))
        return self._predicate()

    def _nested(self, rule: Callable[[], Expr]) -> Expr:
        self._depth += 1
        if self._depth > SQL_NESTING_MAX:
            raise SqlSyntaxError(f"expression nested deeper than {SQL_NESTING_MAX}")
        try:
            return rule()
        finally:
            self._depth -= 1

    def _predicate(self) -> Expr:
        if self._accept("op", "("):
            inner = self._nested(self._or)
            self._expect("op", ")")
            return inner
        if self._tok.kind == "ident":
            return self._about(Ident(self._expect("ident").text))
        literal = self._literal()
        if self._tok.kind == "op" and self._tok.text in _COMPARE_OPS:
            op = self._expect("op").text
            return Compare(op, literal, Ident(self._expect("ident").text))
        if isinstance(literal.value, bool):
            return literal
        raise self._fail("a comparison operator")

    def _about(self, ident: Ident) -> Expr:
        if self._accept("kw", "IS"):
            negated = self._accept("kw", "NOT") is not None
            self._expect("kw", "NULL")
            return IsNull(ident, negated)
        negated = self._accept("kw", "NOT") is not None
        if self._accept("kw", "BETWEEN"):
            low = self._literal()
            self._expect("kw", "AND")
            return Between(ident, low, self._literal(), negated)
        if self._accept("kw", "IN"):
            self._expect("op", "(")
            values = [self._literal()]
            while self._accept("op", ","):
                values.append(self._literal())
            self._expect("op", ")")
            return In(ident, tuple(values), negated)
        if negated:
            raise self._fail("BETWEEN or IN after NOT")
        if self._tok.kind == "op" and self._tok.text in _COMPARE_OPS:
            op = self._expect("op").text
            return Compare(op, ident, self._literal())
        raise self._fail("a comparison, BETWEEN, IN or IS")

    def _literal(self) -> Literal:
        tok = self._tok
        if tok.kind == "str":
            self._i += 1
            return Literal(tok.text[1:-1].replace("''", "'"))
        if tok.kind == "num":
            self._i += 1
            return Literal(_number(tok.text))
        if tok.kind == "kw" and tok.text in ("TRUE", "FALSE"):
            self._i += 1
            return Literal(tok.text == "TRUE")
        raise self._fail("a literal")


def _number(text: str) -> int | float:
    body = text.rstrip("lLdDfF")
    if re.fullmatch(r"[+-]?\d+", body):
        return int(body)
    return float(body)


def parse(text: str) -> Expr:
    """The expression tree; raises SqlSyntaxError with a position."""
    if not text or not text.strip():
        raise SqlSyntaxError("empty expression")
    if len(text) > SQL_EXPRESSION_LENGTH_MAX:
        raise SqlSyntaxError(f"expression longer than {SQL_EXPRESSION_LENGTH_MAX} characters")
    return _Parser(text).parse()


# -- evaluation ------------------------------------------------------------------------------


def _value(operand: Ident | Literal, props: Mapping[str, str]) -> Value | None:
    if isinstance(operand, Literal):
        return operand.value
    return props.get(operand.name)


def _coerce(text: str, like: Value) -> Value | None:
    """A property's text read as the literal's kind; None when it does not parse."""
    if isinstance(like, bool):
        lowered = text.strip().lower()
        return lowered == "true" if lowered in ("true", "false") else None
    if isinstance(like, (int, float)):
        try:
            return int(text) if re.fullmatch(r"\s*[+-]?\d+\s*", text) else float(text)
        except ValueError:
            return None
    return text


def _compare(op: str, left: Value, right: Value) -> Truth:
    if isinstance(left, str) or isinstance(right, str) or isinstance(left, bool):
        if op in ("=", "<>", "!="):
            return (left == right) == (op == "=")
        return None
    return {
        "=": left == right,
        "<>": left != right,
        "!=": left != right,
        ">": left > right,
        ">=": left >= right,
        "<": left < right,
        "<=": left <= right,
    }[op]


def _operands(left: Value | None, right: Value | None) -> tuple[Value, Value] | None:
    if left is None or right is None:
        return None
    # A property (always text) takes the kind of the literal it is compared with.
    if isinstance(left, str) and not isinstance(right, str):
        left = _coerce(left, right)
    elif isinstance(right, str) and not isinstance(left, str):
        right = _coerce(right, left)
    if left is None or right is None:
        return None
    if isinstance(left, bool) != isinstance(right, bool):
        return None
    return left, right


def evaluate(expr: Expr, props: Mapping[str, str]) -> Truth:
    """TRUE, FALSE or UNKNOWN (None) for a message with these properties."""
    if isinstance(expr, Literal):
        return bool(expr.value) if isinstance(expr.value, bool) else None
    if isinstance(expr, Compare):
        pair = _operands(_value(expr.left, props), _value(expr.right, props))
        return None if pair is None else _compare(expr.op, *pair)
    if isinstance(expr, IsNull):
        return (props.get(expr.ident.name) is None) != expr.negated
    if isinstance(expr, Between):
        low = evaluate(Compare(">=", expr.ident, expr.low), props)
        high = evaluate(Compare("<=", expr.ident, expr.high), props)
        inside = _and3(low, high)
        return inside if inside is None or not expr.negated else not inside
    if isinstance(expr, In):
        if props.get(expr.ident.name) is None:
            return None
        found = any(evaluate(Compare("=", expr.ident, v), props) for v in expr.values)
        return found != expr.negated
    if isinstance(expr, Not):
        inner = evaluate(expr.operand, props)
        return None if inner is None else not inner
    results = [evaluate(operand, props) for operand in expr.operands]
    if expr.op == "AND":
        return False if False in results else (None if None in results else True)
    return True if True in results else (None if None in results else False)


def _and3(a: Truth, b: Truth) -> Truth:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def tag_codes(expr: Expr) -> frozenset[int] | None:
    """Tag hash codes a message must carry for `expr` to be TRUE; None: no constraint."""
    if isinstance(expr, Compare) and expr.op == "=":
        pair = (expr.left, expr.right)
        for ident, literal in (pair, pair[::-1]):
            if (
                isinstance(ident, Ident)
                and ident.name == TAGS
                and isinstance(literal, Literal)
                and isinstance(literal.value, str)
            ):
                return frozenset({tag_code(literal.value)})
        return None
    if isinstance(expr, In) and expr.ident.name == TAGS and not expr.negated:
        if all(isinstance(v.value, str) for v in expr.values):
            return frozenset(tag_code(str(v.value)) for v in expr.values)
        return None
    if isinstance(expr, BoolOp):
        parts = [tag_codes(operand) for operand in expr.operands]
        if expr.op == "AND":
            known = [p for p in parts if p is not None]
            return frozenset.intersection(*known) if known else None
        if any(p is None for p in parts):
            return None
        return frozenset().union(*[p for p in parts if p is not None])
    return None
