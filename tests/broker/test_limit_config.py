"""The limit keys of broker.conf (maxConnections, maxConnectionsPerAddress,
maxInFlightBytesPerConnection, brokerFastFailureEnable, waitTimeMillsInSendQueue) and the name
server's caps reach the servers they configure."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_harness import running_broker

from tidemq.broker.config import ConfigError
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.caps import (
    CONNECTIONS_MAX_DEFAULT,
    CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
    ConnectionLimits,
)
from tidemq.remoting.connection import IN_FLIGHT_BYTES_MAX
from tidemq.testing import eventually


def test_defaults_and_keys() -> None:
    assert load_broker_config(None, {}, {}).connection_limits == ConnectionLimits(
        connections_max=CONNECTIONS_MAX_DEFAULT,
        connections_per_address_max=CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
        in_flight_bytes_max=IN_FLIGHT_BYTES_MAX,
        send_wait_ms_max=200,
    )
    config = load_broker_config(
        None,
        {},
        {
            "maxConnections": "0",
            "maxConnectionsPerAddress": "7",
            "maxInFlightBytesPerConnection": "1048576",
            "waitTimeMillsInSendQueue": "50",
        },
    )
    assert config.connection_limits == ConnectionLimits(0, 7, 1 << 20, 50)
    off = load_broker_config(None, {}, {"brokerFastFailureEnable": "false"})
    assert off.connection_limits.send_wait_ms_max is None


@pytest.mark.parametrize(
    "key",
    [
        "maxConnections",
        "maxConnectionsPerAddress",
        "maxInFlightBytesPerConnection",
        "waitTimeMillsInSendQueue",
    ],
)
def test_a_negative_limit_is_refused_naming_its_key(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_broker_config(None, {}, {key: "-1"})


async def _closed(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionResetError:
        return True
    finally:
        writer.close()


async def test_the_broker_caps_connections_per_address(tmp_path: Path) -> None:
    async with running_broker(tmp_path, maxConnectionsPerAddress="1") as broker:
        await broker.send("CapTopic", b"x")  # the harness's client holds the one place
        assert await _closed(broker.app.port)
        assert (await broker.send("CapTopic", b"y")).code == ResponseCode.SUCCESS


async def test_the_name_server_caps_connections(tmp_path: Path) -> None:
    limits = ConnectionLimits(connections_max=1, connections_per_address_max=0)
    app = NamesrvApp(NamesrvConfig(listen_port=0, limits=limits), SystemClock())
    await app.start()
    try:
        first = await asyncio.open_connection("127.0.0.1", app.port)
        await eventually(lambda: len(app.server.connections) == 1, what="one served")
        assert await _closed(app.port)
        first[1].close()
    finally:
        await app.stop()
