from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from console_harness import Served, console_on_cluster


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with console_on_cluster(tmp_path) as s:
        yield s
