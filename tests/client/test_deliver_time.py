"""The producer's delivery-time setter: Message.deliver_time_ms becomes TIMER_DELIVER_MS."""

from __future__ import annotations

import pytest

from tidemq.client.message import Message
from tidemq.client.sending import message_properties
from tidemq.protocol import message as pm
from tidemq.protocol.message import TIMER_DELIVER_MS


def test_deliver_time_becomes_the_timer_property() -> None:
    props = message_properties(Message("T", b"x", deliver_time_ms=1_700_000_000_123), "K")
    assert props[TIMER_DELIVER_MS] == "1700000000123"
    assert pm.DELAY not in props


def test_without_deliver_time_no_timer_property() -> None:
    message = Message("T", b"x")
    assert message.deliver_time_ms is None
    assert TIMER_DELIVER_MS not in message_properties(message, "K")


def test_positional_fields_are_unchanged() -> None:
    message = Message("T", b"x", "tag", "k1 k2", {"a": "1"}, 3, 7)
    assert (message.delay_level, message.flag, message.deliver_time_ms) == (3, 7, None)


@pytest.mark.parametrize(
    ("delay_level", "deliver_time_ms"),
    [(0, -1), (2, 1_700_000_000_000)],
)
def test_bad_delivery_settings_are_refused(delay_level: int, deliver_time_ms: int) -> None:
    with pytest.raises(ValueError, match=r"deliver_time_ms"):
        Message("T", b"x", delay_level=delay_level, deliver_time_ms=deliver_time_ms)


def test_message_stays_frozen() -> None:
    message = Message("T", b"x", deliver_time_ms=5)
    with pytest.raises(AttributeError):
        message.deliver_time_ms = 6  # type: ignore[misc]
