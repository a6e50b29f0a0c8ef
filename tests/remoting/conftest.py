"""Run every remoting test on both event loops the process roots may pick (asyncio, uvloop):
uvloop's transports differ in details (not subclasses of asyncio.Transport, write buffering)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from tidemq.testing.loops import loop_factories


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return loop_factories()
