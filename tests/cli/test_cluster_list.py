"""`tidemq cluster list` against fake name server and broker answers served by real
RemotingServers: roles, lag from the runtime-info keys of issue 13, unreachable brokers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tidemq.cli.cluster import BrokerAnswer, SlaveSeen, cluster_rows, parse_ha_slaves
from tidemq.cli.main import main as cli_main
from tidemq.protocol.bodies import BrokerData, ClusterInfo, KVTable
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer
from tidemq.testing import local_cluster
from tidemq.testing.processes import free_port

MASTER_INFO = {
    "brokerRole": "SYNC_MASTER",
    "commitLogMaxOffset": "5000",
    "commitLogMinOffset": "0",
    "haSlaveCount": "1",
    "haSlaves": "127.0.0.1:40001,1,4000,1000,250;127.0.0.1:40002,2,3000,2000,1500",
}
SLAVE_INFO = {
    "brokerRole": "SLAVE",
    "commitLogMaxOffset": "4000",
    "commitLogMinOffset": "0",
    "haMasterAddr": "127.0.0.1:30001",
    "haConnected": "true",
    "haReplicaOffset": "4000",
    "haMasterMaxOffset": "5000",
    "haLagBytes": "1000",
    "haLagMs": "1250",
    "haRefusedReason": "",
}


async def _serve(handlers: HandlerTable) -> RemotingServer:
    server = RemotingServer(handlers, "127.0.0.1", 0)
    await server.start()
    return server


async def _broker(info: Mapping[str, str] | None) -> RemotingServer:
    """A fake broker answering GET_BROKER_RUNTIME_INFO with `info` (None: never answers)."""

    async def runtime_info(connection: Any, request: RemotingCommand) -> RemotingCommand:
        if info is None:
            await asyncio.sleep(3600)  # a paused broker: the connection is open, no answer
        body = KVTable(table=dict(info or {})).to_json()
        return request.response(ResponseCode.SUCCESS, body=body)

    handlers = HandlerTable()
    handlers.register(RequestCode.GET_BROKER_RUNTIME_INFO, runtime_info)
    return await _serve(handlers)


async def _namesrv(info: ClusterInfo) -> RemotingServer:
    async def cluster_info(connection: Any, request: RemotingCommand) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=info.to_json())

    handlers = HandlerTable()
    handlers.register(RequestCode.GET_BROKER_CLUSTER_INFO, cluster_info)
    return await _serve(handlers)


@pytest.fixture
async def fake_cluster() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A name server listing broker-a (master + slave 1 + slave 2 on a dead port) and broker-b
    (a master that never answers). Yields (namesrv address, {name: address})."""
    master, slave, silent = (
        await _broker(MASTER_INFO),
        await _broker(SLAVE_INFO),
        await _broker(None),
    )
    addrs = {
        "a-master": f"127.0.0.1:{master.port}",
        "a-slave": f"127.0.0.1:{slave.port}",
        "a-dead": f"127.0.0.1:{free_port()}",
        "b-master": f"127.0.0.1:{silent.port}",
    }
    info = ClusterInfo(
        broker_addr_table={
            "broker-a": BrokerData(
                "C1", "broker-a", {0: addrs["a-master"], 1: addrs["a-slave"], 2: addrs["a-dead"]}
            ),
            "broker-b": BrokerData("C1", "broker-b", {0: addrs["b-master"]}),
        },
        cluster_addr_table={"C1": ["broker-b", "broker-a"]},
    )
    namesrv = await _namesrv(info)
    try:
        yield f"127.0.0.1:{namesrv.port}", addrs
    finally:
        for server in (namesrv, master, slave, silent):
            await server.stop()


def _table(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


async def test_cluster_list_shows_roles_lag_and_unreachable_brokers(
    fake_cluster: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    namesrv, addrs = fake_cluster
    argv = ["cluster", "list", "-n", namesrv, "--timeout-ms", "500"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    rows = _table(capsys.readouterr().out)
    assert rows[0] == [
        "CLUSTER", "BROKER", "ID", "ROLE", "ADDRESS", "MAX", "OFFSET", "LAG", "BYTES", "LAG", "S",
        "STATE",
    ]  # fmt: skip
    assert rows[1] == [
        "C1", "broker-a", "0", "SYNC_MASTER", addrs["a-master"], "5000", "-", "-", "1", "slave(s)",
    ]  # fmt: skip
    assert rows[2] == [
        "C1", "broker-a", "1", "SLAVE", addrs["a-slave"], "4000", "1000", "1.2", "following",
        "127.0.0.1:30001",
    ]  # fmt: skip
    # The dead slave's row: unreachable, with the lag its master last saw.
    assert rows[3][:8] == ["C1", "broker-a", "2", "-", addrs["a-dead"], "-", "2000", "1.5"]
    assert rows[3][8] == "unreachable"
    # The silent master times out on its own; the listing still comes back.
    assert rows[4][:7] == ["C1", "broker-b", "0", "-", addrs["b-master"], "-", "-"]
    assert "unreachable" in rows[4]
    assert len(rows) == 5


def test_rows_say_why_a_slave_does_not_follow() -> None:
    refused = {**SLAVE_INFO, "haConnected": "false", "haRefusedReason": "DIVERGED"}
    alone = {**SLAVE_INFO, "haConnected": "false", "haMasterAddr": ""}
    connecting = {**SLAVE_INFO, "haConnected": "false"}
    answers = [
        BrokerAnswer("C", "g", 1, "h:1", refused),
        BrokerAnswer("C", "h", 1, "h:2", alone),
        BrokerAnswer("C", "i", 1, "h:3", connecting),
    ]
    states = [row[-1] for row in cluster_rows(answers)[1:]]
    assert states == [
        "refused by 127.0.0.1:30001: DIVERGED",
        "no master known",
        "connecting to 127.0.0.1:30001",
    ]


def test_rows_of_controller_mode_brokers_show_epoch_and_in_sync_set() -> None:
    controller = {"controllerEpoch": "3", "syncStateSet": "1,2", "controllerRole": "MASTER"}
    master = {"brokerRole": "SYNC_MASTER", "haSlaveCount": "1", **controller}
    follower = {**SLAVE_INFO, **controller, "controllerRole": "SLAVE"}
    standby = {
        **SLAVE_INFO,
        "haConnected": "false",
        "haMasterAddr": "",
        "controllerRole": "STANDBY",
    }
    answers = [
        BrokerAnswer("C", "g", 0, "h:1", master),
        BrokerAnswer("C", "g", 2, "h:2", follower),
        BrokerAnswer("C", "g", 3, "h:3", standby),
    ]
    states = [row[-1] for row in cluster_rows(answers)[1:]]
    assert states == [
        "1 slave(s), epoch 3, in-sync 1,2",
        "following 127.0.0.1:30001, epoch 3",
        "standby: waiting for the controller",
    ]


def test_rows_of_brokers_without_replication_keys() -> None:
    """A broker from before issue 13 (no brokerRole, no ha* keys) still gets a row."""
    answers = [BrokerAnswer("C", "g", 0, "h:1", {"commitLogMaxOffset": "7"})]
    assert cluster_rows(answers)[1] == ["C", "g", "0", "-", "h:1", "7", "-", "-", "-"]


def test_ha_slaves_parse_skips_malformed_entries() -> None:
    text = "a:1,1,10,2,3;;broken;b:2,x,1,1,1;c:3,2,20,4,5"
    assert parse_ha_slaves(text) == {
        1: SlaveSeen("a:1", 1, 10, 2, 3),
        2: SlaveSeen("c:3", 2, 20, 4, 5),
    }
    assert parse_ha_slaves("") == {}


@pytest.mark.integration
async def test_cluster_list_against_a_local_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with local_cluster(tmp_path, brokers=2) as cluster:
        argv = ["cluster", "list", "-n", cluster.namesrv_addr]
        assert await asyncio.to_thread(cli_main, argv) == 0
    rows = _table(capsys.readouterr().out)[1:]
    assert [row[1:3] for row in rows] == [["broker-a", "0"], ["broker-b", "0"]]
    assert [row[4] for row in rows] == [b.address for b in cluster.brokers]
    assert all("unreachable" not in row for row in rows)
