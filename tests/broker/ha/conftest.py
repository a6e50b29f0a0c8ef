"""Run every HA test on both event loops the process roots may pick (asyncio, uvloop): uvloop's
transports differ in details (not subclasses of asyncio.Transport, write buffering)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Mapping

import pytest


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories
