"""Subscription filters the broker applies on pull: tag expressions and SQL92 (§4.2, issue 4).

    build_filter(expression, type, sql_enabled) ─▶ SubscriptionFilter
        codes      the consume-queue sieve: tag hash codes that may pass (None: any). For TAG it
                   is the expression's tags; for SQL92 what TAGS = / TAGS IN conjuncts require
        predicate  SQL92 only: evaluated on the stored record's properties after the sieve

A bad expression raises FilterRefused with the text the client sees in the remark
(SUBSCRIPTION_PARSE_FAILED), at heartbeat and at pull alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.broker.filter.sql92 import Expr, SqlSyntaxError, evaluate, parse, tag_codes
from tidemq.errors import ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol.message import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    parse_tag_expression,
)


class FilterRefused(ValueError):
    """The subscription cannot be used: bad syntax, unknown type, or SQL92 disabled."""


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    codes: frozenset[int] | None
    sql: Expr | None = None

    def matches_code(self, code: int) -> bool:
        return self.codes is None or code in self.codes

    def matches_properties(self, props: Mapping[str, str]) -> bool:
        return self.sql is None or evaluate(self.sql, props) is True

    def matches_record(self, message: rec.StoredMessage) -> bool:
        return self.matches_properties(message.property_map())

    @property
    def predicate(self) -> SubscriptionFilter | None:
        """Self when records must be decoded and checked (SQL92), else None."""
        return self if self.sql is not None else None


def build_filter(
    expression: str | None, expression_type: str | None, *, sql_enabled: bool
) -> SubscriptionFilter:
    kind = (expression_type or EXPRESSION_TYPE_TAG).strip().upper()
    if kind == EXPRESSION_TYPE_TAG:
        try:
            tags = parse_tag_expression(expression)
        except ProtocolError as exc:
            raise FilterRefused(str(exc)) from None
        return SubscriptionFilter(None if tags.matches_all else tags.codes)
    if kind != EXPRESSION_TYPE_SQL92:
        raise FilterRefused(f"expression type {expression_type} is not supported (TAG or SQL92)")
    if not sql_enabled:
        raise FilterRefused(
            "The broker does not support consumer to filter message by SQL92 "
            "(set enablePropertyFilter=true)"
        )
    try:
        expr = parse(expression or "")
    except SqlSyntaxError as exc:
        raise FilterRefused(f"invalid SQL92 expression {expression!r}: {exc}") from None
    return SubscriptionFilter(tag_codes(expr), expr)
