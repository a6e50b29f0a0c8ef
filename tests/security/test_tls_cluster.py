"""A whole cluster over TLS: a name server that requires client certificates, a SYNC_MASTER and
its slave with tls.server.mode=enforcing and tls.enable=true (registration, the slave's metadata
copies and its HA link are TLS with the brokers' client certificate), a producer and a push
consumer given `tls=`, and the Spark connector's clients built from its tls* options. A
SYNC_MASTER answers a send only once the slave has it: every acknowledged send crossed the TLS
HA link. Plaintext is refused on every port, the VIP port too; and a broker's registration
verifies the name server's certificate."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from tidemq import ConsumeFromWhere, Message, Producer, PushConsumer
from tidemq.errors import ConnectionClosedError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand, encode
from tidemq.remoting import RemotingClient
from tidemq.security.tls import (
    ClientAuth,
    TlsClientSettings,
    TlsMode,
    TlsServerSettings,
    client_context,
)
from tidemq.spark.broker_access import ClientCache
from tidemq.spark.options import parse_sink_options
from tidemq.testing import eventually, local_cluster
from tidemq.testing.tls_certs import Pki

pytestmark = pytest.mark.integration


def _broker_settings(pki: Pki) -> dict[str, str]:
    return {
        "brokerRole": "SYNC_MASTER",  # the slave's own overrides make it SLAVE
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(pki.server_cert),
        "tls.server.keyPath": str(pki.server_key),
        "tls.enable": "true",
        "tls.client.trustCertPath": str(pki.ca),
        "tls.client.certPath": str(pki.client_cert),
        "tls.client.keyPath": str(pki.client_key),
    }


def _namesrv_config(pki: Pki) -> NamesrvConfig:
    tls = TlsServerSettings(
        mode=TlsMode.ENFORCING,
        cert_path=pki.server_cert,
        key_path=pki.server_key,
        client_auth=ClientAuth.REQUIRE,
        trust_cert_path=pki.ca,
    )
    return NamesrvConfig(listen_port=0, tls=tls)


async def _refuses_plaintext(port: int) -> bool:
    """A plaintext frame to `port` gets no answer: the connection is closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode(RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)))
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(65536), 5) == b""
        except ConnectionResetError:
            return True
    finally:
        writer.close()


async def test_producer_and_consumer_through_a_tls_cluster(pki: Pki, tmp_path: Path) -> None:
    context = client_context(
        TlsClientSettings(
            trust_cert_path=pki.ca, cert_path=pki.client_cert, key_path=pki.client_key
        )
    )
    async with local_cluster(
        tmp_path,
        slaves=1,
        broker_settings=_broker_settings(pki),
        namesrv_config=_namesrv_config(pki),
    ) as cluster:
        master, slave = cluster.brokers[0], cluster.slaves[0][0]
        assert slave.replication.slave is not None
        ha = slave.replication.slave
        await eventually(lambda: ha.following, what="the slave follows over TLS")
        async with Producer("TlsPG", cluster.namesrv_addr, tls=context) as producer:
            for i in range(20):
                await producer.send(Message("TlsTopic", f"m{i}".encode()))
        got: list[bytes] = []
        consumer = PushConsumer(
            "TlsCG",
            cluster.namesrv_addr,
            tls=context,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        consumer.subscribe("TlsTopic")
        consumer.register_listener(lambda messages: got.extend(m.body for m in messages))
        await consumer.start()
        try:
            await eventually(lambda: len(set(got)) == 20, what="every message consumed")
        finally:
            await consumer.shutdown()
        assert sorted(set(got)) == sorted(f"m{i}".encode() for i in range(20))
        assert ha.state().replica_offset == master.store.max_physical_offset
        # The Spark connector's clients (built on an executor from the parsed options).
        settings = parse_sink_options(
            {
                "nameServer": cluster.namesrv_addr,
                "tlsTrustCertPath": str(pki.ca),
                "tlsCertPath": str(pki.client_cert),
                "tlsKeyPath": str(pki.client_key),
            }
        ).tls
        cache = ClientCache()
        try:
            clients = await asyncio.to_thread(cache.get, cluster.namesrv_addr, tls=settings)
            assert "TlsTopic" in await asyncio.to_thread(clients.admin.topic_list)
        finally:
            await asyncio.to_thread(cache.close)
        assert master.replication.master is not None
        for port in (cluster.namesrv.port, master.port, master.replication.master.port):
            assert await _refuses_plaintext(port), port
        plain = RemotingClient()
        try:
            with pytest.raises(ConnectionClosedError):
                await plain.invoke(
                    cluster.namesrv_addr,
                    RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO),
                    3_000,
                )
        finally:
            await plain.close()


def _free_port_pair() -> int:
    """A free port P whose VIP port P-2 is free too (the VIP port needs a fixed listenPort)."""
    for _ in range(50):
        with socket.socket() as main, socket.socket() as vip:
            main.bind(("127.0.0.1", 0))
            port = int(main.getsockname()[1])
            try:
                vip.bind(("127.0.0.1", port - 2))
            except OSError:
                continue
            return port
    raise AssertionError("no free port pair")


async def test_the_vip_port_is_enforcing_too(pki: Pki, tmp_path: Path) -> None:
    port = _free_port_pair()
    settings = {**_broker_settings(pki), "listenPort": str(port)}
    del settings["brokerRole"]  # no slave here
    async with local_cluster(
        tmp_path, broker_settings=settings, namesrv_config=_namesrv_config(pki)
    ) as cluster:
        broker = cluster.brokers[0]
        assert broker.ports == [port, port - 2]
        assert await _refuses_plaintext(port - 2)
        context = client_context(TlsClientSettings(trust_cert_path=pki.ca))
        client = RemotingClient(ssl=context)
        try:  # and serves TLS
            request = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
            response = await client.invoke(f"127.0.0.1:{port - 2}", request, 3_000)
        finally:
            await client.close()
        assert response.code == ResponseCode.SUCCESS


async def test_registration_verifies_the_name_servers_certificate(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq.broker")
    untrusted = TlsServerSettings(  # signed by a CA the broker does not trust
        mode=TlsMode.ENFORCING, cert_path=pki.other_server_cert, key_path=pki.other_server_key
    )
    settings = {"tls.enable": "true", "tls.client.trustCertPath": str(pki.ca)}
    async with local_cluster(
        tmp_path,
        broker_settings=settings,
        namesrv_config=NamesrvConfig(listen_port=0, tls=untrusted),
    ) as cluster:
        await eventually(
            lambda: "REGISTER_BROKER to name server" in caplog.text, what="the failure logged"
        )
        assert "certificate did not verify" in caplog.text
        assert cluster.namesrv.routes.broker_addrs() == []
        registration = cluster.brokers[0].registration
        assert registration is not None
        assert registration.retrying == [cluster.namesrv_addr]
