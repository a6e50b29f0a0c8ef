from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from client_fakes import FakeBroker, FakeCluster


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster([FakeBroker("broker-a"), FakeBroker("broker-b")])
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()
