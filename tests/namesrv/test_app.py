"""The name server over a real socket: registration, routes, expiry, connection close, KV, admin."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tidemq.clock import FakeClock
from tidemq.namesrv import NamesrvApp, NamesrvConfig
from tidemq.namesrv.kv import KVStore
from tidemq.protocol.bodies import (
    ClusterInfo,
    DataVersion,
    KVTable,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    DeleteTopicRequestHeader,
    GetKVConfigRequestHeader,
    GetKVListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    PutKVConfigRequestHeader,
    QueryDataVersionRequestHeader,
    RegisterBrokerRequestHeader,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
)
from tidemq.remoting import RemotingClient

TIMEOUT_MS = 2_000
BROKER_A = "127.0.0.1:10911"
BROKER_B = "127.0.0.1:20911"
VERSION = DataVersion(timestamp=1_700_000_000_000, counter=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def app(tmp_path: Path, clock: FakeClock) -> AsyncIterator[NamesrvApp]:
    config = NamesrvConfig(listen_port=0, kv_config_path=tmp_path / "kvConfig.json")
    app = NamesrvApp(config, clock, host="127.0.0.1")
    await app.start()
    yield app
    await app.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    client = RemotingClient()
    yield client
    await client.close()


def register_command(
    name: str, addr: str, *topics: str, crc: bool = True, version: DataVersion = VERSION
) -> RemotingCommand:
    body = RegisterBrokerBody(
        topic_config_wrapper=TopicConfigSerializeWrapper(
            topic_config_table={
                t: TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4, perm=6)
                for t in topics
            },
            data_version=version,
        ),
        filter_server_list=[],
    ).to_json()
    header = RegisterBrokerRequestHeader(
        broker_name=name,
        broker_addr=addr,
        cluster_name="DefaultCluster",
        ha_server_addr=addr.replace("10911", "10912"),
        broker_id=0,
        body_crc32=zlib.crc32(body) & 0x7FFFFFFF if crc else 0,
    )
    return RemotingCommand(
        code=RequestCode.REGISTER_BROKER, ext_fields=header.to_fields(), body=body
    )


def route_command(topic: str) -> RemotingCommand:
    return RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
        ext_fields=GetRouteInfoRequestHeader(topic=topic).to_fields(),
    )


async def call(client: RemotingClient, app: NamesrvApp, cmd: RemotingCommand) -> RemotingCommand:
    return await client.invoke(f"127.0.0.1:{app.port}", cmd, TIMEOUT_MS)


async def test_register_then_route(app: NamesrvApp, client: RemotingClient) -> None:
    missing = await call(client, app, route_command("TopicA"))
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    assert missing.remark == "No topic route info in name server for the topic: TopicA"

    registered = await call(client, app, register_command("broker-a", BROKER_A, "TopicA", "TBW102"))
    assert registered.code == ResponseCode.SUCCESS

    found = await call(client, app, route_command("TopicA"))
    assert found.code == ResponseCode.SUCCESS
    assert found.ext_fields == {}
    route = TopicRouteData.from_json(found.body)
    assert [(q.broker_name, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
        ("broker-a", 4, 6)
    ]
    assert route.broker_datas[0].broker_addrs == {0: BROKER_A}
    assert b'"0":"127.0.0.1:10911"' in found.body  # standard JSON, quoted key (§3.1)
    assert b"orderTopicConf" not in found.body

    info = ClusterInfo.from_json(
        (await call(client, app, RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO))).body
    )
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    topics = TopicList.from_json(
        (
            await call(
                client, app, RemotingCommand(code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            )
        ).body
    )
    assert topics.topic_list == ["TBW102", "TopicA"]
    by_cluster = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.GET_TOPICS_BY_CLUSTER,
            ext_fields=GetTopicsByClusterRequestHeader(cluster="DefaultCluster").to_fields(),
        ),
    )
    assert TopicList.from_json(by_cluster.body).topic_list == ["TBW102", "TopicA"]


async def test_bad_crc_and_bad_header(app: NamesrvApp, client: RemotingClient) -> None:
    cmd = register_command("broker-a", BROKER_A, "TopicA")
    cmd.ext_fields["bodyCrc32"] = "12345"
    answer = await call(client, app, cmd)
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert answer.remark == "crc32 not match"
    unchecked = await call(client, app, register_command("broker-a", BROKER_A, "TopicA", crc=False))
    assert unchecked.code == ResponseCode.SUCCESS
    no_name = register_command("broker-a", BROKER_A, "TopicA")
    del no_name.ext_fields["brokerName"]
    assert (await call(client, app, no_name)).code == ResponseCode.SYSTEM_ERROR
    assert (await call(client, app, RemotingCommand(code=9999))).code == 3


async def test_expiry_drops_broker_and_closes_its_connection(
    app: NamesrvApp, client: RemotingClient, clock: FakeClock
) -> None:
    await call(client, app, register_command("broker-a", BROKER_A, "TopicA"))
    connection = await client.connection(f"127.0.0.1:{app.port}")
    clock.advance(app.config.broker_expiry_ms - 1)
    assert app.housekeeping.run_once() == []
    clock.advance(1)
    dropped = app.housekeeping.run_once()
    assert [d.broker_addr for d in dropped] == [BROKER_A]
    await asyncio.wait_for(connection.wait_closed(), 2)
    assert (await call(client, app, route_command("TopicA"))).code == ResponseCode.TOPIC_NOT_EXIST


async def test_connection_close_drops_broker(app: NamesrvApp, client: RemotingClient) -> None:
    await call(client, app, register_command("broker-a", BROKER_A, "TopicA"))
    other = RemotingClient()
    other_connection = await other.connection(f"127.0.0.1:{app.port}")
    await other_connection.request(register_command("broker-b", BROKER_B, "TopicB"), TIMEOUT_MS)
    (server_side,) = [c for c in app.server.connections if c.peer == other_connection.local]
    await other.close()
    await asyncio.wait_for(server_side.wait_closed(), 2)
    assert (await call(client, app, route_command("TopicB"))).code == ResponseCode.TOPIC_NOT_EXIST
    assert (await call(client, app, route_command("TopicA"))).code == ResponseCode.SUCCESS


async def test_unregister_and_admin(app: NamesrvApp, client: RemotingClient) -> None:
    await call(client, app, register_command("broker-a", BROKER_A, "TopicA", "TopicB"))
    wipe = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.WIPE_WRITE_PERM_OF_BROKER,
            ext_fields=WipeWritePermOfBrokerRequestHeader(broker_name="broker-a").to_fields(),
        ),
    )
    assert wipe.ext_fields == {"wipeTopicCount": "2"}
    route = TopicRouteData.from_json((await call(client, app, route_command("TopicA"))).body)
    assert route.queue_datas[0].perm == 4
    add = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.ADD_WRITE_PERM_OF_BROKER,
            ext_fields=WipeWritePermOfBrokerRequestHeader(broker_name="broker-a").to_fields(),
        ),
    )
    assert add.ext_fields == {"addTopicCount": "2"}

    version_query = QueryDataVersionRequestHeader(
        broker_name="broker-a", broker_addr=BROKER_A, cluster_name="DefaultCluster", broker_id=0
    )
    same = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.QUERY_DATA_VERSION,
            ext_fields=version_query.to_fields(),
            body=VERSION.to_json(),
        ),
    )
    assert same.ext_fields == {"changed": "false"}
    assert DataVersion.from_json(same.body) == VERSION

    deleted = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.DELETE_TOPIC_IN_NAMESRV,
            ext_fields=DeleteTopicRequestHeader(topic="TopicB").to_fields(),
        ),
    )
    assert deleted.code == ResponseCode.SUCCESS
    assert (await call(client, app, route_command("TopicB"))).code == ResponseCode.TOPIC_NOT_EXIST

    unregister = UnregisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr=BROKER_A, cluster_name="DefaultCluster", broker_id=0
    )
    await call(
        client,
        app,
        RemotingCommand(code=RequestCode.UNREGISTER_BROKER, ext_fields=unregister.to_fields()),
    )
    assert (await call(client, app, route_command("TopicA"))).code == ResponseCode.TOPIC_NOT_EXIST


async def test_kv_config_round_trip_and_persistence(
    app: NamesrvApp, client: RemotingClient, tmp_path: Path
) -> None:
    put = PutKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="TopicA", value="broker-a:4")
    assert (
        await call(
            client, app, RemotingCommand(code=RequestCode.PUT_KV_CONFIG, ext_fields=put.to_fields())
        )
    ).code == 0
    key = GetKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="TopicA").to_fields()
    got = await call(client, app, RemotingCommand(code=RequestCode.GET_KV_CONFIG, ext_fields=key))
    assert got.ext_fields == {"value": "broker-a:4"}
    listed = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.GET_KVLIST_BY_NAMESPACE,
            ext_fields=GetKVListByNamespaceRequestHeader(
                namespace="ORDER_TOPIC_CONFIG"
            ).to_fields(),
        ),
    )
    assert KVTable.from_json(listed.body).table == {"TopicA": "broker-a:4"}
    # REGISTER_BROKER answers with the ORDER_TOPIC_CONFIG namespace.
    registered = await call(client, app, register_command("broker-a", BROKER_A, "TopicA"))
    assert KVTable.from_json(registered.body).table == {"TopicA": "broker-a:4"}

    persisted = orjson.loads((tmp_path / "kvConfig.json").read_bytes())
    assert persisted == {"configTable": {"ORDER_TOPIC_CONFIG": {"TopicA": "broker-a:4"}}}
    reloaded = KVStore(tmp_path / "kvConfig.json")
    reloaded.load()
    assert reloaded.get("ORDER_TOPIC_CONFIG", "TopicA") == "broker-a:4"

    await call(client, app, RemotingCommand(code=RequestCode.DELETE_KV_CONFIG, ext_fields=key))
    gone = await call(client, app, RemotingCommand(code=RequestCode.GET_KV_CONFIG, ext_fields=key))
    assert gone.code == ResponseCode.QUERY_NOT_FOUND
    empty = await call(
        client,
        app,
        RemotingCommand(
            code=RequestCode.GET_KVLIST_BY_NAMESPACE,
            ext_fields=GetKVListByNamespaceRequestHeader(
                namespace="ORDER_TOPIC_CONFIG"
            ).to_fields(),
        ),
    )
    assert empty.code == ResponseCode.QUERY_NOT_FOUND


def test_corrupt_kv_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.write_bytes(b"{not json")
    store = KVStore(path)
    store.load()
    assert store.namespace("any") is None


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="listen_port"):
        NamesrvConfig(listen_port=70_000)
    with pytest.raises(ValueError, match="broker_expiry_ms"):
        NamesrvConfig(scan_interval_ms=10_000, broker_expiry_ms=5_000)
