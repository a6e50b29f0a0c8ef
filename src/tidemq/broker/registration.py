"""Registration with the name servers (remoting.md §3.2).

The broker sends REGISTER_BROKER (103) to every name server every registerNameServerPeriod
(30 s) and at once after a topic change, with its whole topic table as the body:

    {"filterServerList":[],
     "topicConfigSerializeWrapper":{"dataVersion":{...},"topicConfigTable":{...}}}

and `bodyCrc32` = CRC32(body) & 0x7FFFFFFF in the header. Name servers are independent: each gets
its own request concurrently, and one that is down or slow only produces a log line. A burst of
topic changes (a heartbeat creating several retry topics) is coalesced into one round, since
`trigger()` only wakes the periodic loop. At shutdown the broker unregisters (104) from each.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.service import PeriodicService
from tidemq.broker.topics import TopicTable
from tidemq.protocol.bodies import RegisterBrokerBody
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader
from tidemq.remoting.client import RemotingClient

log = logging.getLogger(__name__)

_CRC_MASK: Final = 0x7FFFFFFF
# RocketMQ advertises the HA (replication) port as listenPort + 1.
HA_PORT_OFFSET: Final = 1


class RegistrationService:
    def __init__(
        self,
        config: BrokerConfig,
        address: BrokerAddress,
        topics: TopicTable,
        client: RemotingClient,
        *,
        on_result: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._config = config
        self._address = address
        self._topics = topics
        self._client = client
        self._on_result = on_result
        self._periodic = PeriodicService(
            "namesrv-registration", config.register_interval_ms, self.register_all
        )
        self.rounds = 0

    def start(self) -> None:
        self._topics.add_change_listener(self.trigger)
        self._periodic.start()

    def trigger(self) -> None:
        """Register again as soon as possible (after a topic change)."""
        if self._periodic.running:
            self._periodic.trigger()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def register_all(self) -> None:
        addrs = self._config.namesrv_addrs
        if not addrs:
            return
        body = RegisterBrokerBody(topic_config_wrapper=self._topics.wrapper()).to_json()
        header = RegisterBrokerRequestHeader(
            broker_name=self._config.broker_name,
            broker_addr=self._address.text,
            cluster_name=self._config.broker_cluster_name,
            ha_server_addr=f"{self._address.host}:{self._address.port + HA_PORT_OFFSET}",
            broker_id=self._config.broker_id,
            body_crc32=zlib.crc32(body) & _CRC_MASK,
        )
        self.rounds += 1
        await asyncio.gather(
            *(
                self._send(addr, RequestCode.REGISTER_BROKER, header.to_fields(), body)
                for addr in addrs
            )
        )

    async def unregister_all(self) -> None:
        fields = UnregisterBrokerRequestHeader(
            broker_name=self._config.broker_name,
            broker_addr=self._address.text,
            cluster_name=self._config.broker_cluster_name,
            broker_id=self._config.broker_id,
        ).to_fields()
        await asyncio.gather(
            *(
                self._send(addr, RequestCode.UNREGISTER_BROKER, fields, b"")
                for addr in self._config.namesrv_addrs
            )
        )

    async def _send(self, addr: str, code: int, fields: dict[str, str], body: bytes) -> None:
        cmd = RemotingCommand(code=code, ext_fields=dict(fields), body=body, language="JAVA")
        what = RequestCode(code).name
        try:
            response = await self._client.invoke(addr, cmd, self._config.register_timeout_ms)
        except Exception as exc:
            log.warning("%s to name server %s failed: %s", what, addr, exc)
            ok = False
        else:
            ok = response.code == ResponseCode.SUCCESS
            if ok:
                log.debug("%s to %s done", what, addr)
            else:
                log.warning(
                    "%s to name server %s answered %d: %s",
                    what,
                    addr,
                    response.code,
                    response.remark,
                )
        if self._on_result is not None:
            self._on_result(addr, ok)
