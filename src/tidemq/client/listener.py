"""How a push consumer calls user code: subscriptions, listener results, the retry-topic view.

A listener takes list[MessageExt] and returns a status; it may be a plain function (run in the
consumer's thread pool, so blocking work does not stall the event loop) or a coroutine function
(awaited on the loop). None, CONSUME_SUCCESS and SUCCESS mean success; anything else, or an
exception, means "consume these again" (RECONSUME_LATER / SUSPEND_CURRENT_QUEUE_A_MOMENT).

Messages re-delivered through `%RETRY%<group>` carry their first topic in RETRY_TOPIC; the
listener sees that topic, as in every RocketMQ client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Final

from tidemq.protocol import message as pm
from tidemq.protocol.bodies import SubscriptionData

from .message import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, ConsumeResult, MessageExt
from .selector import MessageSelector, Selectable, warn_if_sql_looking

logger = logging.getLogger(__name__)

Listener = Callable[[list[MessageExt]], ConsumeResult | Awaitable[ConsumeResult]]

_SUCCESS: Final = (None, ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One subscribed topic: the selector (tag expression or SQL92), the filter the client
    re-applies (tags only), its version (ms)."""

    topic: str
    selector: MessageSelector
    filter: pm.TagFilter
    sub_version: int

    @classmethod
    def parse(cls, topic: str, expression: Selectable, now_ms: int) -> Subscription:
        selector = MessageSelector.of(expression)
        return cls(topic, selector, selector.tag_filter(), now_ms)

    @property
    def expression(self) -> str:
        return self.selector.expression

    @property
    def expression_type(self) -> str:
        return self.selector.expression_type

    def to_data(self) -> SubscriptionData:
        return SubscriptionData(
            topic=self.topic,
            sub_string=self.expression,
            tags_set=self.filter.tags if self.filter.tags is not None else frozenset(),
            code_set=self.filter.codes,
            sub_version=self.sub_version,
            expression_type=self.expression_type,
        )


def subscription_table(
    subscriptions: Mapping[str, Selectable], now_ms: int
) -> dict[str, Subscription]:
    """The subscriptions given to a consumer's constructor, checked as `subscribe` checks."""
    table = {}
    for topic, expression in subscriptions.items():
        pm.validate_topic(topic)
        warn_if_sql_looking(expression, topic)
        table[topic] = Subscription.parse(topic, expression, now_ms)
    return table


def is_success(result: object) -> bool:
    return result in _SUCCESS


def restore_retry_topic(message: MessageExt, group: str) -> MessageExt:
    """The message as the listener sees it: a retried message under its original topic."""
    original = message.properties.get(pm.RETRY_TOPIC)
    if original and message.topic == pm.retry_topic(group):
        return dataclasses.replace(message, topic=original)
    return message


async def call_listener(
    listener: Listener, messages: list[MessageExt], executor: Executor, group: str
) -> bool:
    """Run `listener` on `messages`; True on success (see the module docstring)."""
    try:
        if inspect.iscoroutinefunction(listener):
            result = await listener(messages)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(executor, listener, messages)
            if inspect.isawaitable(result):
                result = await result
    except Exception:
        logger.exception("%s: listener raised; the messages will be consumed again", group)
        return False
    return is_success(result)
