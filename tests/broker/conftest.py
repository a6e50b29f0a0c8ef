"""Fixtures of the broker tests (helpers live in broker_harness.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from broker_harness import Harness, running_broker


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_broker(tmp_path / "store") as harness:
        yield harness
