"""TLS and ACL tests: network tests run on both event loops the process roots may pick (asyncio,
uvloop); the TLS certificates are made once per session in a temporary directory
(tidemq.testing.tls_certs), never committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tidemq.testing.loops import loop_factories
from tidemq.testing.tls_certs import Pki, make_pki


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return loop_factories()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory: Path = tmp_path_factory.mktemp("pki")
    return make_pki(directory)
