"""The client side of a name server that knows no route (issue 19 item 3), in one process: an
empty name server stands for one that has just restarted, next to one the broker registered with.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemq.client.admin import Admin
from tidemq.client.instance import ClientInstance
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.clock import SystemClock
from tidemq.errors import TopicNotExistError
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol import message as pm
from tidemq.testing import LocalCluster, local_cluster

pytestmark = pytest.mark.integration


class _FirstInList(random.Random):
    def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        return 0


@pytest.fixture
async def empty_namesrv() -> AsyncIterator[NamesrvApp]:
    app = NamesrvApp(NamesrvConfig(listen_port=0), SystemClock())
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path) as running:
        yield running


def _listing(empty: NamesrvApp, cluster: LocalCluster) -> str:
    return f"127.0.0.1:{empty.port};{cluster.namesrv_addr}"


async def test_route_comes_from_the_next_namesrv_when_the_first_has_none(
    empty_namesrv: NamesrvApp, cluster: LocalCluster
) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("KnownTopic", broker_addr=cluster.broker_addr)
    instance = ClientInstance(_listing(empty_namesrv, cluster), rng=_FirstInList())
    admin = Admin("unused:1", instance=instance)
    async with admin:
        route = await instance.fetch_route("KnownTopic")
        assert [b.broker_name for b in route.broker_datas] == ["broker-a"]
        assert await admin.master_addresses() == [cluster.broker_addr]
        assert "KnownTopic" in await admin.topic_list()
        with pytest.raises(TopicNotExistError):  # only when no name server knows it
            await instance.fetch_route("NoSuchTopic")


async def test_new_producer_sends_through_tbw102_when_the_first_namesrv_has_none(
    empty_namesrv: NamesrvApp, cluster: LocalCluster
) -> None:
    instance = ClientInstance(_listing(empty_namesrv, cluster), rng=_FirstInList())
    async with Producer("FallbackPG", "unused:1", instance=instance) as producer:
        result = await producer.send(Message("AutoCreatedTopic", b"body"))
    assert result.message_queue.broker_name == "broker-a"
    assert pm.TBW102 in instance.routes.topics()


def test_clients_start_at_a_random_namesrv() -> None:
    listing = "127.0.0.1:1;127.0.0.1:2;127.0.0.1:3"
    starts = {ClientInstance(listing, rng=random.Random(seed))._namesrv_index for seed in range(30)}
    assert starts == {0, 1, 2}


async def test_a_hung_namesrv_is_not_asked_again_for_every_unknown_topic(
    cluster: LocalCluster,
) -> None:
    """A name server that accepts but never answers cost a request timeout on every lookup of a
    topic nobody knows (a consumer's retry topic each rebalance round; a new producer's first
    send, whose whole send timeout it used up). After it failed once, it is skipped for such a
    second opinion for a while (instance.NAMESRV_FAILURE_MEMORY_MS)."""
    frames_to_hung = 0

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal frames_to_hung
        while await reader.read(65536):
            frames_to_hung += 1
        writer.close()

    hung = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    hung_port = hung.sockets[0].getsockname()[1]
    listing = f"{cluster.namesrv_addr};127.0.0.1:{hung_port}"
    instance = ClientInstance(listing, rng=_FirstInList(), request_timeout_ms=1_000)
    try:
        with pytest.raises(TopicNotExistError):
            await instance.fetch_route("NoSuchTopic")  # learns that the second one hangs
        asked = frames_to_hung
        assert asked >= 1
        for _ in range(3):
            with pytest.raises(TopicNotExistError):
                await instance.fetch_route("NoSuchTopic")
        assert frames_to_hung == asked
    finally:
        await instance.remoting.close()
        hung.close()
        await hung.wait_closed()
