"""What a consumer subscribes to: a tag expression or a SQL92 property filter (§4.2).

RocketMQ sends both as a string plus an `expressionType` ("TAG" or "SQL92"), in the heartbeat's
subscription data and in each PULL_MESSAGE header. A plain string given to `subscribe` or `pull`
stays a tag expression, as in the Java client; a SQL92 filter has to be asked for by name:

    consumer.subscribe("TopicA", MessageSelector.by_sql("a > 5 AND region = 'eu'"))
    consumer.subscribe("TopicA", MessageSelector.by_tag("TagA || TagB"))   # same as "TagA || TagB"

SQL92 is evaluated by the broker only (the client has no parser: the broker's answer is the
truth), and only when the broker runs with `enablePropertyFilter=true`; otherwise it refuses the
subscription with SUBSCRIPTION_PARSE_FAILED, as does a filter that does not parse; a push
consumer's start() then fails with that reason (`check_sql_subscriptions`). Tag expressions are
also re-checked on the client, SQL92 ones are not (Java does the same). A plain string that looks
like SQL92 ("a > 5") is still a tag expression, and subscribing with it logs a warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from tidemq.errors import BrokerError, ClientError, SubscriptionParseFailedError
from tidemq.protocol import message as pm

if TYPE_CHECKING:
    from .instance import ClientInstance

__all__ = ["MessageSelector", "Selectable", "check_sql_subscriptions", "warn_if_sql_looking"]

_TYPES: Final = (pm.EXPRESSION_TYPE_TAG, pm.EXPRESSION_TYPE_SQL92)
# A plain string with these reads as SQL92 to a person but is a tag expression to RocketMQ, and
# would match nothing: it is still taken as tags (as Java does), with a warning naming the fix.
_SQL_LOOKING: Final = re.compile(r"[=<>()']|\b(AND|OR|NOT|IS|IN|BETWEEN)\b", re.IGNORECASE)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """An expression and its type, as Java's `org.apache.rocketmq.client.consumer.MessageSelector`.

    Build one with `by_tag` or `by_sql`.
    """

    expression_type: str
    expression: str

    def __post_init__(self) -> None:
        if self.expression_type not in _TYPES:
            raise ValueError(
                f"expression_type must be one of {', '.join(_TYPES)}, not {self.expression_type!r}"
            )
        if not isinstance(self.expression, str):
            raise TypeError(f"a selector expression is a str, not {type(self.expression).__name__}")
        if self.is_sql and not self.expression.strip():
            raise ValueError('a SQL92 selector needs an expression, e.g. by_sql("a > 5")')

    @classmethod
    def by_tag(cls, expression: str = pm.SUB_ALL) -> MessageSelector:
        """Messages whose tag is one of `expression` ("TagA || TagB"); "*" or "" for all."""
        return cls(pm.EXPRESSION_TYPE_TAG, expression.strip() or pm.SUB_ALL)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """Messages whose user properties (and TAGS) satisfy the SQL92 `expression`, e.g.
        "a > 5 AND b = 'x'". Needs `enablePropertyFilter=true` on the broker."""
        return cls(pm.EXPRESSION_TYPE_SQL92, expression.strip())

    @classmethod
    def of(cls, value: Selectable) -> MessageSelector:
        """`value` itself, or a plain string read as a tag expression."""
        if isinstance(value, MessageSelector):
            return value
        if isinstance(value, str):
            return cls.by_tag(value)
        raise TypeError(
            "expected a tag expression (str) or a MessageSelector, "
            f"not {type(value).__name__}: use MessageSelector.by_sql(...) for SQL92"
        )

    @property
    def is_sql(self) -> bool:
        return self.expression_type == pm.EXPRESSION_TYPE_SQL92

    def tag_filter(self) -> pm.TagFilter:
        """The filter the client re-applies to pulled messages: the tags, or all for SQL92."""
        return pm.parse_tag_expression(pm.SUB_ALL if self.is_sql else self.expression)


Selectable = str | MessageSelector


def warn_if_sql_looking(value: Selectable, topic: str) -> None:
    """Log a warning when a plain string subscription looks like SQL92 (see _SQL_LOOKING)."""
    if isinstance(value, str) and _SQL_LOOKING.search(value):
        logger.warning(
            "subscription of %s: %r is a tag expression (tags %s), so it matches only those "
            "tags; for a SQL92 filter pass MessageSelector.by_sql(%r)",
            topic,
            value,
            " || ".join(repr(t.strip()) for t in value.split("||")),
            value,
        )


class _Subscribed(Protocol):
    @property
    def selector(self) -> MessageSelector: ...


async def check_sql_subscriptions(
    instance: ClientInstance, subscriptions: Iterable[_Subscribed]
) -> None:
    """Ask every known master whether it takes this instance's SQL92 subscriptions (a checked
    heartbeat): a push consumer's start() fails with the broker's reason (bad syntax, or no
    enablePropertyFilter=true) instead of its pulls failing quietly in the background, as
    Java's checkClientInBroker does. A broker that does not answer is left to the pulls.

    Raises:
        SubscriptionParseFailedError: a broker refused one; the remark names group and topic.
    """
    if not any(s.selector.is_sql for s in subscriptions):
        return
    body = instance.heartbeat_data().to_json()
    for addr in instance.routes.all_addresses(slaves=False):
        try:
            await instance.heartbeat_to(addr, instance.request_timeout_ms, body)
        except SubscriptionParseFailedError:
            raise
        except (ClientError, BrokerError):
            continue  # logged by the heartbeat before; the pulls retry this broker
