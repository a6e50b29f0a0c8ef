"""Fixtures of the controller tests: a real etcd per test, and sessions on it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq.controller.etcd import EtcdSession
from tidemq.testing.etcd import ETCD_BINARY, EtcdProcess


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdProcess]:
    if shutil.which(ETCD_BINARY) is None:
        pytest.skip(f"{ETCD_BINARY} is not installed (Debian etcd-server)")
    process = EtcdProcess(tmp_path / "etcd")
    await process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
async def session(etcd: EtcdProcess) -> AsyncIterator[EtcdSession]:
    session = EtcdSession([etcd.endpoint], call_timeout_s=1.0)
    await session.connect()
    try:
        yield session
    finally:
        await session.close()
