from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tx_harness import World

from tidemq.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    w = World(tmp_path, clock)
    yield w
    w.close()
