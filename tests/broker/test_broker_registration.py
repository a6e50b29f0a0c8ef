"""Registration with name servers: body and CRC, re-register on topic change, one dead namesrv."""

from __future__ import annotations

import socket
import zlib
from pathlib import Path
from typing import Any

from broker_harness import eventually, running_broker

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.registration import RegistrationService
from tidemq.broker.topics import TopicTable
from tidemq.clock import SystemClock
from tidemq.protocol.bodies import RegisterBrokerBody
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import RegisterBrokerRequestHeader, RegisterBrokerResponseHeader
from tidemq.remoting.client import RemotingClient
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


async def test_a_slave_hears_its_master_from_the_answer(tmp_path: Path) -> None:
    """haServerAddr goes out as the broker's HA address; an answer naming a master reaches
    `on_master`, one without a master changes nothing."""
    answers = [
        RegisterBrokerResponseHeader(),
        RegisterBrokerResponseHeader(master_addr="10.0.0.1:10911", ha_server_addr="10.0.0.1:10912"),
    ]
    sent: list[RegisterBrokerRequestHeader] = []

    async def on_register(connection: Any, request: RemotingCommand) -> RemotingCommand:
        sent.append(RegisterBrokerRequestHeader.from_fields(request.ext_fields))
        return request.response(ResponseCode.SUCCESS, answers[min(len(sent), 2) - 1].to_fields())

    handlers = HandlerTable()
    handlers.register(RequestCode.REGISTER_BROKER, on_register)
    namesrv = RemotingServer(handlers, "127.0.0.1", 0)
    await namesrv.start()
    client = RemotingClient()
    heard: list[tuple[str, str | None]] = []
    try:
        config = BrokerConfig(
            broker_role="SLAVE",
            broker_id=1,
            ha_secret="s" * 16,
            namesrv_addrs=(f"127.0.0.1:{namesrv.port}",),
        )
        service = RegistrationService(
            config,
            BrokerAddress("127.0.0.1", 20911),
            TopicTable(
                tmp_path,
                SystemClock(),
                cluster_name="c",
                broker_name="b",
                auto_create_topic_enable=False,
                default_topic_queue_nums=1,
            ),
            client,
            ha_address=lambda: "127.0.0.1:31000",
            on_master=lambda master, ha: heard.append((master, ha)),
        )
        await service.register_all()
        assert heard == []
        await service.register_all()
        assert heard == [("10.0.0.1:10911", "10.0.0.1:10912")]
        assert {h.ha_server_addr for h in sent} == {"127.0.0.1:31000"}
        assert {h.broker_id for h in sent} == {1}
    finally:
        await client.close()
        await namesrv.stop()
