"""A name server that restarts (issue 19 item 3), with real processes: two name servers, a broker.

A restarted name server knows no route until the broker registers with it again. Two things keep
clients from seeing "no route" meanwhile: the broker re-registers as soon as the name server's
connection closes and its port accepts again (broker/registration.py), and clients that get
TOPIC_NOT_EXIST from one name server ask the next (ClientInstance.invoke_namesrv).
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import Final

import pytest

from tidemq.client.admin import Admin
from tidemq.client.instance import ClientInstance
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import GetRouteInfoRequestHeader
from tidemq.remoting.client import RemotingClient
from tidemq.testing import eventually_async
from tidemq.testing.processes import ProcessCluster, process_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

logger = logging.getLogger(__name__)

TOPIC: Final = "NamesrvRestartTopic"
# Well under registerNameServerPeriod: the broker must not wait for its next round. The bound is
# the registration retry's cap (1 s) plus a loaded machine's scheduling and one request.
ROUTES_BACK_WITHIN_S: Final = 5.0
# The broker's periodic round is made long, so only the reconnect registration can beat the bound.
BROKER_SETTINGS: Final = {"registerNameServerPeriod": "60000"}


class _FirstInList(random.Random):
    """Makes a ClientInstance start at the first name server of its list."""

    def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        return 0


async def _route_code(addr: str, topic: str) -> int:
    """GET_ROUTEINFO_BY_TOPIC asked of one name server only: its answer code."""
    client = RemotingClient()
    try:
        header = GetRouteInfoRequestHeader(topic=topic)
        cmd = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields=header.to_fields()
        )
        return (await client.invoke(addr, cmd, 3_000)).code
    finally:
        await client.close()


async def _knows(addr: str) -> bool:
    return await _route_code(addr, TOPIC) == ResponseCode.SUCCESS


async def _cluster_with_topic(pc: ProcessCluster) -> None:
    async with Admin(pc.namesrv_addr) as admin:

        async def broker_registered() -> bool:
            return bool(await admin.master_addresses())

        await eventually_async(broker_registered, 30.0)
        await admin.create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)
    for namesrv in pc.namesrvs:
        await eventually_async(lambda addr=namesrv.address: _knows(addr), 30.0)


async def test_client_listing_the_restarted_namesrv_first_gets_the_route(tmp_path: Path) -> None:
    async with process_cluster(
        tmp_path, namesrvs=2, brokers=1, broker_settings=BROKER_SETTINGS
    ) as pc:
        await _cluster_with_topic(pc)
        restarted, other = pc.namesrvs
        # A paused broker cannot register: the restarted name server surely knows nothing yet,
        # while the other keeps the route (the broker's connection to it stays open).
        pc.brokers[0].pause()
        try:
            await restarted.stop()
            await restarted.start()
            assert await _route_code(restarted.address, TOPIC) == ResponseCode.TOPIC_NOT_EXIST
            listing = f"{restarted.address};{other.address}"
            instance = ClientInstance(listing, rng=_FirstInList())
            admin = Admin(listing, instance=instance)
            async with admin:
                route = await instance.fetch_route(TOPIC)
                assert [b.broker_name for b in route.broker_datas] == ["broker-a"]
                assert (await admin.topic_route(TOPIC)).broker_datas == route.broker_datas
                assert "broker-a" in (await admin.cluster_info()).broker_addr_table
                assert TOPIC in await admin.topic_list()
        finally:
            pc.brokers[0].resume()
        # Once the broker runs again it registers with the restarted name server at once.
        await eventually_async(lambda: _knows(restarted.address), ROUTES_BACK_WITHIN_S)


async def test_restarted_namesrv_has_the_routes_within_seconds(tmp_path: Path) -> None:
    async with process_cluster(
        tmp_path, namesrvs=2, brokers=1, broker_settings=BROKER_SETTINGS
    ) as pc:
        await _cluster_with_topic(pc)
        restarted = pc.namesrvs[0]
        loop = asyncio.get_running_loop()
        for _ in range(2):  # a second restart: the broker watches the new connection too
            await restarted.stop()
            await restarted.start()
            accepting_at = loop.time()
            await eventually_async(lambda: _knows(restarted.address), ROUTES_BACK_WITHIN_S)
            without_routes_s = loop.time() - accepting_at
            logger.warning("restarted name server without routes for %.2f s", without_routes_s)
