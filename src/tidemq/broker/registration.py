"""Registration with the name servers (remoting.md §3.2).

The broker sends REGISTER_BROKER (103) to every name server every registerNameServerPeriod
(30 s) and at once after a topic change, with its whole topic table as the body:

    {"filterServerList":[],
     "topicConfigSerializeWrapper":{"dataVersion":{...},"topicConfigTable":{...}}}

and `bodyCrc32` = CRC32(body) & 0x7FFFFFFF in the header. Name servers are independent: each gets
its own request concurrently, and one that is down or slow only produces a log line. A burst of
topic changes (a heartbeat creating several retry topics) is coalesced into one round, since
`trigger()` only wakes the periodic loop. A round costs the name servers O(topics) (they decode
the whole table). With a table of fewer than ROUND_SPACING_MIN_TOPICS topics a round is cheap and
a change re-registers at once: a producer must not fall back to TBW102's queues because a new
topic's route waits. With a larger table rounds are spaced by ROUND_GAP_FACTOR times the last
round's duration (at most ROUND_GAP_MAX_S; about a second with 10,000 topics), since a burst of
auto-created topics would otherwise keep the name servers decoding, clients' route lookups queued
behind. At shutdown the broker unregisters (104) from each.

A name server keeps its route table in memory only: one that restarts knows no broker until it
hears from each again, and meanwhile answers TOPIC_NOT_EXIST to clients that ask it. So the
broker does not wait for its next round to tell it:

    registered ──(connection to it closes: it stopped or restarted)──▶ retrying
    retrying ── REGISTER_BROKER after RETRY_DELAY_MS_MIN, doubling up to RETRY_DELAY_MS_MAX ──┐
        ├─ refused / timed out / error answer ──▶ retrying (one log line when it starts)    │
        └─ SUCCESS ──▶ registered (one log line saying how long it took) ◀──────────────────┘

A name server that is down when a round runs enters `retrying` the same way. A restarted name
server thus has this broker's routes at most RETRY_DELAY_MS_MAX (plus one request) after its port
accepts again, instead of up to registerNameServerPeriod (30 s) later.

Replication: the header's haServerAddr is brokerIP1 and the bound HA port (`ha_address`). A
name server answers a slave's registration with its master's client address (masterAddr) and HA
address (haServerAddr); each answer that names a master goes to `on_master(master_addr,
ha_addr)` (the slave's HASlave and SlaveSync). An answer without one changes nothing: a name
server that has not heard from the master yet must not make a slave forget it.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidemq.broker.config import HA_PORT_OFFSET, BrokerConfig
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.service import PeriodicService
from tidemq.broker.topics import TopicTable
from tidemq.errors import ProtocolError, QueueError
from tidemq.protocol.bodies import RegisterBrokerBody
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import Connection

log = logging.getLogger(__name__)

_CRC_MASK: Final = 0x7FFFFFFF
# Called with a name server's answer to a slave: the master's client address and HA address.
MasterListener = Callable[[str, str | None], None]
# First retry after a name server's connection closed or a registration with it failed: a name
# server restarted by its supervisor needs at least this long to listen again.
RETRY_DELAY_MS_MIN: Final = 100
# Retries back off to this: the most a restarted name server waits for our routes once it accepts
# again. A refused connect costs microseconds, so one attempt a second is cheap while it is down.
RETRY_DELAY_MS_MAX: Final = 1_000
# A round starts no sooner than this many times the last round's duration after it ended: the
# name servers spend at most 1 / (1 + factor) of their time on this broker's rounds.
ROUND_GAP_FACTOR: Final = 4.0
# ... and never more than this (a round that timed out says nothing of the table's cost).
ROUND_GAP_MAX_S: Final = 2.0
# Rounds are spaced only for a table at least this large (~140 KB of body): below it a round
# costs the name servers about a millisecond, and a slow round means load, not table size.
ROUND_SPACING_MIN_TOPICS: Final = 1_000


@dataclass(frozen=True, slots=True)
class _Outcome:
    ok: bool
    detail: str = ""


class RegistrationService:
    def __init__(
        self,
        config: BrokerConfig,
        address: BrokerAddress,
        topics: TopicTable,
        client: RemotingClient,
        *,
        on_result: Callable[[str, bool], None] | None = None,
        ha_address: Callable[[], str] | None = None,
        on_master: MasterListener | None = None,
    ) -> None:
        """`ha_address` gives the advertised HA address (default: brokerIP1:haListenPort or
        listenPort+1); `on_master` hears the master a name server names (see module doc)."""
        self._config = config
        self._address = address
        self._topics = topics
        self._client = client
        self._on_result = on_result
        self._ha_address = ha_address
        self._on_master = on_master
        self._periodic = PeriodicService(
            "namesrv-registration", config.register_interval_ms, self.register_all
        )
        # Per name server: the connection whose close means "register again", and the retry
        # loop running while it is down or restarting.
        self._watched: dict[str, Connection] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self.rounds = 0
        self._next_round_at = 0.0  # loop time before which no round starts (ROUND_GAP_FACTOR)
        # Listening from here, not from start(): the broker awaits its first round before
        # start(), with its port open, and a topic an admin creates meanwhile (once a name
        # server has published this broker) must not wait registerNameServerPeriod.
        topics.add_change_listener(self.trigger)

    def start(self) -> None:
        self._periodic.start()

    def trigger(self) -> None:
        """Register again as soon as possible (after a topic change). Before start() the wake-up
        is kept: the periodic loop's first round then runs at once."""
        self._periodic.trigger()

    async def stop(self) -> None:
        self._stopping = True
        await self._periodic.stop()
        retries = list(self._retries.values())
        self._retries.clear()
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)

    @property
    def retrying(self) -> list[str]:
        """The name servers this broker is re-registering with (down or restarting)."""
        return sorted(self._retries)

    async def register_all(self) -> None:
        addrs = self._config.namesrv_addrs
        if not addrs:
            return
        loop = asyncio.get_running_loop()
        if (wait := self._next_round_at - loop.time()) > 0:
            await asyncio.sleep(wait)
        self.rounds += 1
        started = loop.time()
        await asyncio.gather(*(self._register(addr) for addr in addrs))
        ended = loop.time()
        if len(self._topics) >= ROUND_SPACING_MIN_TOPICS:
            gap = min(ROUND_GAP_MAX_S, ROUND_GAP_FACTOR * (ended - started))
            self._next_round_at = ended + gap
        else:
            self._next_round_at = 0.0

    async def _register(self, addr: str) -> None:
        """One REGISTER_BROKER to `addr`; on failure the retry loop takes `addr` over."""
        outcome = await self._send(addr, RequestCode.REGISTER_BROKER, *self._registration())
        if outcome.ok:
            self._watch(addr)
        elif addr not in self._retries:
            log.warning("REGISTER_BROKER to name server %s failed: %s", addr, outcome.detail)
            self._retry(addr)

    def _registration(self) -> tuple[dict[str, str], bytes]:
        """The REGISTER_BROKER header fields and body, from the topic table as it is now."""
        body = RegisterBrokerBody(topic_config_wrapper=self._topics.wrapper()).to_json()
        header = RegisterBrokerRequestHeader(
            broker_name=self._config.broker_name,
            broker_addr=self._address.text,
            cluster_name=self._config.broker_cluster_name,
            ha_server_addr=self._ha_server_addr(),
            broker_id=self._config.broker_id,
            body_crc32=zlib.crc32(body) & _CRC_MASK,
        )
        return header.to_fields(), body

    def _ha_server_addr(self) -> str:
        if self._ha_address is not None:
            return self._ha_address()
        port = self._config.ha_listen_port
        if port is None:
            port = self._address.port + HA_PORT_OFFSET
        return f"{self._address.host}:{port}"

    def _heard(self, response: RemotingCommand) -> None:
        """Pass the master a REGISTER_BROKER answer names to `on_master`."""
        if self._on_master is None:
            return
        try:
            header = RegisterBrokerResponseHeader.from_fields(response.ext_fields)
        except ProtocolError as exc:
            log.warning("REGISTER_BROKER answer with a bad header: %s", exc)
            return
        if header.master_addr is not None:
            self._on_master(header.master_addr, header.ha_server_addr)

    def _watch(self, addr: str) -> None:
        """Register again with `addr` when the connection just used for it closes."""
        connection = self._client.connections.get(addr)
        if connection is None or self._watched.get(addr) is connection:
            return
        self._watched[addr] = connection
        connection.add_close_listener(lambda closed: self._on_closed(addr, closed))

    def _on_closed(self, addr: str, connection: Connection) -> None:
        if self._watched.get(addr) is connection:
            del self._watched[addr]
        if not self._stopping and addr not in self._retries:
            log.info("connection to name server %s closed; registering again", addr)
            self._retry(addr)

    def _retry(self, addr: str) -> None:
        if self._stopping:
            return
        task = asyncio.get_running_loop().create_task(
            self._retry_loop(addr), name=f"namesrv-registration-retry-{addr}"
        )
        self._retries[addr] = task
        task.add_done_callback(lambda done: self._retry_done(addr, done))

    def _retry_done(self, addr: str, task: asyncio.Task[None]) -> None:
        if self._retries.get(addr) is task:
            del self._retries[addr]

    async def _retry_loop(self, addr: str) -> None:
        """REGISTER_BROKER to `addr` with backoff until it succeeds (one log line each way)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        delay_ms: float = RETRY_DELAY_MS_MIN
        attempts = 0
        while True:
            await asyncio.sleep(delay_ms / 1000)
            attempts += 1
            try:
                # Connect first: the body (the whole topic table) is built only for a name
                # server that accepts, not once a second for one that is down.
                await self._client.connection(addr)
            except QueueError as exc:
                log.debug("name server %s still unreachable: %s", addr, exc)
                delay_ms = min(delay_ms * 2, RETRY_DELAY_MS_MAX)
                continue
            outcome = await self._send(addr, RequestCode.REGISTER_BROKER, *self._registration())
            if outcome.ok:
                log.info(
                    "registered with name server %s again after %.1f s (%d attempts)",
                    addr,
                    loop.time() - began,
                    attempts,
                )
                self._watch(addr)
                return
            log.debug("REGISTER_BROKER retry %d to %s: %s", attempts, addr, outcome.detail)
            delay_ms = min(delay_ms * 2, RETRY_DELAY_MS_MAX)

    async def unregister_all(self) -> None:
        fields = UnregisterBrokerRequestHeader(
            broker_name=self._config.broker_name,
            broker_addr=self._address.text,
            cluster_name=self._config.broker_cluster_name,
            broker_id=self._config.broker_id,
        ).to_fields()
        outcomes = await asyncio.gather(
            *(
                self._send(addr, RequestCode.UNREGISTER_BROKER, fields, b"")
                for addr in self._config.namesrv_addrs
            )
        )
        for addr, outcome in zip(self._config.namesrv_addrs, outcomes, strict=True):
            if not outcome.ok:
                log.warning("UNREGISTER_BROKER to name server %s failed: %s", addr, outcome.detail)

    async def _send(self, addr: str, code: int, fields: dict[str, str], body: bytes) -> _Outcome:
        cmd = RemotingCommand(code=code, ext_fields=dict(fields), body=body, language="JAVA")
        try:
            response = await self._client.invoke(addr, cmd, self._config.register_timeout_ms)
        except Exception as exc:
            outcome = _Outcome(False, str(exc) or type(exc).__name__)
        else:
            ok = response.code == ResponseCode.SUCCESS
            outcome = _Outcome(ok, "" if ok else f"answered {response.code}: {response.remark}")
            if ok:
                log.debug("%s to %s done", RequestCode(code).name, addr)
                if code == RequestCode.REGISTER_BROKER:
                    self._heard(response)
        if self._on_result is not None:
            self._on_result(addr, outcome.ok)
        return outcome
