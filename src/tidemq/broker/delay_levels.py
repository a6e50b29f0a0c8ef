"""Delay levels and the delivery-time properties: what a delayed message asks for, in ms.

`messageDelayLevel` (remoting.md §9) is a space-separated list of durations, level 1 first:

    "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

Each item is a whole number followed by one unit: ms, s, m, h or d (TideMQ accepts ms so tests
can use a table of 100 ms steps). The arbitrary delivery time (RocketMQ 5) is one of three
properties: TIMER_DELIVER_MS (an absolute wall-clock ms timestamp), TIMER_DELAY_SEC or
TIMER_DELAY_MS (relative to the broker's arrival time); the first present, in that order, wins.
"""

from __future__ import annotations

import re
from typing import Final

from tidemq.protocol.message import DELAY, TIMER_DELAY_MS, TIMER_DELAY_SEC, TIMER_DELIVER_MS

DELAY_LEVELS_DEFAULT: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# How far ahead a delivery time may lie (RocketMQ 5's timerMaxDelaySec; its default is 3 days).
TIMER_MAX_DELAY_SEC_DEFAULT: Final = 7 * 24 * 3600
# One queue of SCHEDULE_TOPIC_XXXX per level; the topic is registered with 18 queues.
DELAY_LEVELS_MAX: Final = 18

TIMER_PROPERTIES: Final = (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
# The properties that make the DelayRouter park a message (any other passes it through).
PARKING_PROPERTIES: Final = frozenset((DELAY, *TIMER_PROPERTIES))

_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_ITEM: Final = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """The level durations in ms (index 0 = level 1). Raises ValueError naming the bad item."""
    items = text.split()
    if not items:
        raise ValueError("needs at least one level")
    if len(items) > DELAY_LEVELS_MAX:
        raise ValueError(f"at most {DELAY_LEVELS_MAX} levels (SCHEDULE_TOPIC_XXXX queues)")
    levels: list[int] = []
    for item in items:
        match = _ITEM.match(item.lower())
        if match is None:
            raise ValueError(f"bad level {item!r}: expected a number and ms|s|m|h|d")
        duration_ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
        if duration_ms <= 0:
            raise ValueError(f"bad level {item!r}: must be > 0")
        levels.append(duration_ms)
    return tuple(levels)


def requested_delivery_ms(properties: dict[str, str], arrival_ms: int) -> int | None:
    """The absolute delivery time the TIMER_* properties ask for; None when none is set.

    Raises ValueError when the property is present but not a non-negative integer.
    """
    for name in TIMER_PROPERTIES:
        text = properties.get(name)
        if text is None or not text.strip():
            continue
        text = text.strip()
        if not text.isdigit():
            raise ValueError(f"{name}={text!r} is not a non-negative integer")
        value = int(text)
        if name == TIMER_DELIVER_MS:
            return value
        return arrival_ms + (value * 1000 if name == TIMER_DELAY_SEC else value)
    return None
