"""Registration with name servers: body and CRC, re-register on topic change, one dead namesrv."""

from __future__ import annotations

import socket
import zlib
from pathlib import Path
from typing import Any

from broker_harness import eventually, running_broker

from tidemq.protocol.bodies import RegisterBrokerBody
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import RegisterBrokerRequestHeader
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_registers_and_reregisters_after_a_topic_change(tmp_path: Path) -> None:
    registrations: list[tuple[RegisterBrokerRequestHeader, RegisterBrokerBody]] = []
    unregistered: list[dict[str, str]] = []

    async def on_register(connection: Any, request: RemotingCommand) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_fields(request.ext_fields)
        assert header.body_crc32 == zlib.crc32(request.body) & 0x7FFFFFFF
        registrations.append((header, RegisterBrokerBody.from_json(request.body)))
        return request.response(ResponseCode.SUCCESS)

    async def on_unregister(connection: Any, request: RemotingCommand) -> RemotingCommand:
        unregistered.append(request.ext_fields)
        return request.response(ResponseCode.SUCCESS)

    handlers = HandlerTable()
    handlers.register(RequestCode.REGISTER_BROKER, on_register)
    handlers.register(RequestCode.UNREGISTER_BROKER, on_unregister)
    namesrv = RemotingServer(handlers, "127.0.0.1", 0)
    await namesrv.start()
    try:
        addrs = f"127.0.0.1:{_dead_port()};127.0.0.1:{namesrv.port}"
        async with running_broker(tmp_path, namesrvAddr=addrs) as broker:
            assert len(registrations) == 1
            header, body = registrations[0]
            assert header.broker_addr == broker.addr
            assert (header.broker_name, header.cluster_name, header.broker_id) == (
                "broker-a",
                "DefaultCluster",
                0,
            )
            tables = body.topic_config_wrapper.topic_config_table
            assert tables["TBW102"].perm == 7
            await broker.send("TopicReg", b"x")
            await eventually(lambda: len(registrations) >= 2)
            _, latest = registrations[-1]
            assert "TopicReg" in latest.topic_config_wrapper.topic_config_table
            assert latest.topic_config_wrapper.data_version.counter > (
                body.topic_config_wrapper.data_version.counter
            )
        assert unregistered
        assert unregistered[0]["brokerName"] == "broker-a"
    finally:
        await namesrv.stop()
