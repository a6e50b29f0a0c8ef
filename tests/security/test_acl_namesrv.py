"""A name server with an ACL file: a broker holding the cluster's admin credentials registers,
a rogue one (no credentials, or an account that is not admin) is refused and never appears in
a route; reads need a valid signature of any account, QUERY_DATA_VERSION an admin's."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from acl_samples import ACL_YAML, ADMIN, PRODUCER

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.security.acl_file import AclFileError
from tidemq.security.signing import Credentials, sign
from tidemq.testing.cluster import TEST_BROKER_SETTINGS
from tidemq.testing.wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def namesrv(tmp_path: Path) -> AsyncIterator[NamesrvApp]:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    app = NamesrvApp(NamesrvConfig(listen_port=0, acl_file=path), SystemClock(), host="127.0.0.1")
    await app.start()
    yield app
    await app.stop()


def broker_settings(
    namesrv: NamesrvApp, root: Path, name: str, credentials: Credentials | None
) -> dict[str, str]:
    settings = {
        "namesrvAddr": f"127.0.0.1:{namesrv.port}",
        "listenPort": "0",
        "storePathRootDir": str(root / name),
        "brokerName": name,
        "brokerIP1": "127.0.0.1",
        **TEST_BROKER_SETTINGS,
    }
    if credentials is not None:
        settings["innerClientAuthenticationCredentials"] = json.dumps(
            {"accessKey": credentials.access_key, "secretKey": credentials.secret_key}
        )
    return settings


async def start_broker(settings: dict[str, str]) -> BrokerApp:
    app = BrokerApp(load_broker_config(None, {}, settings), SystemClock())
    await app.start()
    return app


@pytest.mark.parametrize("rogue_credentials", [None, PRODUCER], ids=["unsigned", "not-admin"])
async def test_a_rogue_broker_is_refused_and_never_routed(
    namesrv: NamesrvApp,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    rogue_credentials: Credentials | None,
) -> None:
    good = await start_broker(broker_settings(namesrv, tmp_path, "broker-good", ADMIN))
    try:
        await eventually(lambda: good.address in namesrv.routes.broker_addrs())
        with caplog.at_level(logging.WARNING, logger="tidemq.remoting.connection"):
            rogue = await start_broker(
                broker_settings(namesrv, tmp_path, "broker-rogue", rogue_credentials)
            )
        try:
            # start() awaits the first registration, so it has been answered by now.
            assert any("ACL refused code 103" in r.getMessage() for r in caplog.records)
            assert rogue.address not in namesrv.routes.broker_addrs()
            route = namesrv.routes.route("TBW102")
            assert route is not None
            assert [b.broker_name for b in route.broker_datas] == ["broker-good"]
        finally:
            await rogue.stop()
    finally:
        await good.stop()
    assert good.address not in namesrv.routes.broker_addrs()


READS = [
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}),
    (RequestCode.GET_BROKER_CLUSTER_INFO, {}),
    (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {}),
    (RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}),
    (RequestCode.GET_KV_CONFIG, {"namespace": "ns", "key": "k"}),
    (RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ns"}),
]


async def test_reads_need_a_signature_and_writes_an_admin(namesrv: NamesrvApp) -> None:
    client = RemotingClient()
    addr = f"127.0.0.1:{namesrv.port}"

    async def ask(code: int, fields: dict[str, str], who: Credentials | None) -> RemotingCommand:
        request = RemotingCommand(code=code, ext_fields=dict(fields))
        if who is not None:
            sign(request, who)
        return await client.invoke(addr, request, 5_000)

    try:
        put = {"namespace": "ns", "key": "k", "value": "v"}
        answer = await ask(RequestCode.PUT_KV_CONFIG, put, None)
        assert (answer.code, answer.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "No accessKey is configured",
        )
        assert (await ask(RequestCode.PUT_KV_CONFIG, put, ADMIN)).code == ResponseCode.SUCCESS
        for code, fields in READS:
            # The topic lists name every topic: an unknown party learns none of them.
            answer = await ask(code, fields, None)
            assert (code, answer.code, answer.remark) == (
                code,
                ResponseCode.SYSTEM_ERROR,
                "No accessKey is configured",
            )
            assert (await ask(code, fields, PRODUCER)).code != ResponseCode.SYSTEM_ERROR, code
        assert (await ask(*READS[-1], PRODUCER)).code == ResponseCode.SUCCESS
    finally:
        await client.close()


async def test_query_data_version_needs_an_admin(namesrv: NamesrvApp, tmp_path: Path) -> None:
    """It refreshes a broker's liveness: open, anyone could keep a dead broker routed."""
    good = await start_broker(broker_settings(namesrv, tmp_path, "broker-good", ADMIN))
    client = RemotingClient()
    try:
        await eventually(lambda: good.address in namesrv.routes.broker_addrs())
        fields = {
            "brokerAddr": good.address,
            "brokerName": "broker-good",
            "brokerId": "0",
            "clusterName": "DefaultCluster",
        }
        body = good.topics.data_version.to_json()

        async def ask(who: Credentials | None) -> tuple[int, str | None]:
            request = RemotingCommand(
                code=RequestCode.QUERY_DATA_VERSION, ext_fields=dict(fields), body=body
            )
            if who is not None:
                sign(request, who)
            answer = await client.invoke(f"127.0.0.1:{namesrv.port}", request, 5_000)
            return answer.code, answer.remark

        assert await ask(None) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
        code, remark = await ask(PRODUCER)
        assert code == ResponseCode.NO_PERMISSION
        assert "Need admin permission for request code=322" in (remark or "")
        assert (await ask(ADMIN))[0] == ResponseCode.SUCCESS
    finally:
        await client.close()
        await good.stop()


def test_a_bad_acl_file_stops_the_name_server(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts: nope\n")
    with pytest.raises(AclFileError, match="line 1"):
        NamesrvApp(NamesrvConfig(listen_port=0, acl_file=path), SystemClock())
