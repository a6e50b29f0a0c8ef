"""The event loops a test suite runs on: the ones the process roots may pick (asyncio, and uvloop
when it is installed). uvloop's transports differ in details (not subclasses of
asyncio.Transport, write buffering), so network code is tested on both. A conftest returns this
from pytest-asyncio's `pytest_asyncio_loop_factories` hook."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories
