"""Replication: the broker's HA parts for its role, built and wired in one place (issue 13).

    ASYNC_MASTER, no haSecret   nothing: no HA listener, no slave can follow (the start log says
                                so); sends answer after the local write
    ASYNC_MASTER + haSecret     HAMaster on haListenPort; sends still answer after the local write
    SYNC_MASTER                 HAMaster; sends wait for a slave's ack (durability.py)
    SLAVE                       the store in replica mode (writes come from the master only);
                                HASlave follows the HA address the name servers name; SlaveSync
                                copies the master's metadata (slave_sync.py)

The name servers' answers reach `on_master` through registration.py (one call per answer). A
slave with no name server never learns its master: it serves what it has (a standalone read-only
copy).

Which master a slave follows (MasterChoice): name servers can disagree (one still holds a stale
registration), and following each answer would drop a healthy link every round. So an answer
that names another master than the one followed switches the slave (HASlave and SlaveSync
together) at once only when its HA link is not following (not connected, or not past the
handshake: the master is gone or refuses it); while the link follows, the new master must be
named by MASTER_SWITCH_ROUNDS times (number of name servers) answers in a row, none naming the
current master or a third one: all name servers, for MASTER_SWITCH_ROUNDS registration rounds.
The first answer after start is followed at once.

Controller mode (issue 14, broker/failover.py): the controller, not the name servers, names the
master. A `ControlledRole` pins it (`pin_master`; name servers' answers are ignored), a master's
HAMaster acknowledges by the in-sync set the controller keeps, and `fence` tells Durability
whether the master's lease still holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidemq.broker.access import inner_signer
from tidemq.broker.config import HA_PORT_OFFSET, BrokerConfig
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.ha import HAMaster, HASettings, HASlave
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.handlers.ha_info import master_fields, slave_fields
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import ScheduleService
from tidemq.broker.slave_sync import SlaveSync
from tidemq.broker.timer import TimerWheel
from tidemq.broker.tls_setup import outbound_ssl
from tidemq.broker.topics import TopicTable
from tidemq.clock import Clock
from tidemq.remoting.client import RemotingClient
from tidemq.store.message_store import FileMessageStore

log = logging.getLogger(__name__)

# Registration rounds for which every name server must name a new master before a slave whose
# link still follows the current one switches (module doc).
MASTER_SWITCH_ROUNDS: Final = 3

# (the master's client address, its HA address or None when the answer had none)
MasterAddrs = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class ControlledRole:
    """What the controller tells a BrokerApp it runs under controller mode (failover.py).

    Args:
        replica_id: this broker's stable id in its group (its brokerId in broker.conf; a master
            registers as 0 but acknowledges by replica ids).
        fence: a master's lease check: False once the lease may have expired (then no answer
            may claim a message acknowledged).
        master: a slave's master as (client address, HA address); None: a standby that follows
            no one until the controller names a master.
        fields: the controller's keys for GET_BROKER_RUNTIME_INFO (epoch, in-sync set, ...).
    """

    replica_id: int
    fence: Callable[[], bool]
    master: tuple[str, str] | None = None
    fields: Callable[[], dict[str, str]] | None = None


class MasterChoice:
    """The master a slave follows, from the name servers' answers (the rule in the module doc).

    Args:
        answers_to_switch: answers in a row naming one new master that switch a following slave.
    """

    def __init__(self, answers_to_switch: int) -> None:
        assert answers_to_switch >= 1
        self.current: MasterAddrs | None = None
        self._answers_to_switch = answers_to_switch
        self._candidate: MasterAddrs | None = None
        self._count = 0
        self._reported: set[MasterAddrs] = set()  # held-back candidates already logged

    def heard(self, named: MasterAddrs, following: bool) -> bool:
        """One answer named `named`; `following`: the slave's link to the current master
        follows. True when `named` is the master to follow (now `current`)."""
        master_addr, ha_addr = named
        current = self.current
        if ha_addr is None and current is not None and current[0] == master_addr:
            named = current  # an answer without an HA address: the one we know
        if named == current:
            self._candidate, self._count = None, 0
            return True
        if named != self._candidate:
            self._candidate, self._count = named, 0
        self._count += 1
        if current is None or not following or self._count >= self._answers_to_switch:
            self.current, self._candidate, self._count = named, None, 0
            self._reported.clear()
            return True
        if named not in self._reported:
            self._reported.add(named)
            log.warning(
                "a name server names master %s (HA %s) while this slave follows %s (HA %s): "
                "the name servers disagree; switching needs %d answers in a row naming it",
                master_addr,
                ha_addr,
                current[0],
                current[1],
                self._answers_to_switch,
            )
        return False


def ha_settings(config: BrokerConfig) -> HASettings:
    """The HA services' settings from broker.conf's keys (the slave's ack timeout is
    syncFlushTimeout, as in RocketMQ 4.x)."""
    return HASettings(
        secret=config.ha_secret.encode(),
        listen_host=config.listen_host,
        listen_port=config.ha_port,
        heartbeat_interval_ms=config.ha_send_heartbeat_interval_ms,
        housekeeping_interval_ms=config.ha_housekeeping_interval_ms,
        transfer_batch_size=config.ha_transfer_batch_size,
        max_gap_not_in_sync=config.ha_max_gap_not_in_sync,
        sync_timeout_ms=config.sync_flush_timeout_ms,
        tls=config.tls_server_settings,
        client_ssl=outbound_ssl(config),
    )


class Replication:
    """The HA master, or the HA slave and the metadata copy, of one broker."""

    def __init__(
        self,
        config: BrokerConfig,
        store: FileMessageStore,
        clock: Clock,
        address: BrokerAddress,
        *,
        topics: TopicTable,
        groups: SubscriptionGroupTable,
        offsets: ConsumerOffsetTable,
        schedule: ScheduleService,
        timer: TimerWheel | None = None,
        controlled: ControlledRole | None = None,
    ) -> None:
        self._config = config
        self._controlled = controlled
        self._store = store
        self._address = address
        self.master: HAMaster | None = None
        self.slave: HASlave | None = None
        self.sync: SlaveSync | None = None
        self._client: RemotingClient | None = None
        self.choice = MasterChoice(MASTER_SWITCH_ROUNDS * max(1, len(config.namesrv_addrs)))
        if config.is_slave:
            self.slave = HASlave(
                store,
                ha_settings(config),
                clock,
                broker_id=config.broker_id,
                message_size_max=config.max_message_size,
            )
            # Signed with innerClientAuthenticationCredentials: a master with aclEnable
            # answers the metadata copies to admin accounts only (security/resources.py).
            self._client = RemotingClient(
                clock=clock, signer=inner_signer(config), ssl=outbound_ssl(config)
            )
            self.sync = SlaveSync(
                self._client,
                topics,
                groups,
                offsets,
                schedule,
                clock,
                interval_ms=config.slave_sync_interval_ms,
                timer=timer,
            )
        elif config.ha_secret:
            self.master = HAMaster(
                store, ha_settings(config), clock, message_size_max=config.max_message_size
            )

    async def start(self) -> None:
        """Before the broker serves: the slave's store refuses local writes; the master's HA
        port listens (so registration can advertise it)."""
        if self.slave is not None:
            self._store.set_replica_mode(True)
        if self.sync is not None:
            self.sync.start()
        controlled = self._controlled
        if controlled is not None and controlled.master is not None:
            self.pin_master(*controlled.master)
        if self.master is not None:
            if controlled is not None:
                # Until the controller says more (a new epoch's set is this master alone): acks
                # need only us, and the confirm offset starts at the recovered log's end, so
                # the first pulls and offset queries see the whole log, not nothing.
                self.master.set_sync_set(frozenset({controlled.replica_id}), controlled.replica_id)
            await self.master.start()
        elif not self._config.is_slave:
            log.info("no haSecret: no HA listener, slaves cannot replicate from this broker")

    async def stop(self) -> None:
        """Stop following / serving slaves (before the store shuts down)."""
        if self.sync is not None:
            await self.sync.stop()
        if self.slave is not None:
            await self.slave.stop()
        if self.master is not None:
            await self.master.stop()
        if self._client is not None:
            await self._client.close()

    def ha_address(self) -> str:
        """haServerAddr as registered: brokerIP1 and the bound HA port (the configured one, or
        listenPort + 1, when no listener runs)."""
        if self.master is not None:
            port = self.master.port
        else:
            port = self._config.ha_port or self._address.port + HA_PORT_OFFSET
        return f"{self._address.host}:{port}"

    def on_master(self, master_addr: str, ha_addr: str | None) -> None:
        """A name server named this slave's master (registration.py): followed per the
        MasterChoice rule (module doc). Under controller mode the controller names it."""
        if self._controlled is not None:
            return
        following = self.slave is not None and self.slave.following
        if not self.choice.heard((master_addr, ha_addr), following):
            return
        if self.sync is not None:
            self.sync.set_master(master_addr)
        if self.slave is not None and ha_addr is not None:
            self.slave.set_master(ha_addr)

    def pin_master(self, master_addr: str, ha_addr: str) -> None:
        """Controller mode: follow this master (client and HA address) until told otherwise."""
        self.choice.current = (master_addr, ha_addr)
        if self.sync is not None:
            self.sync.set_master(master_addr)
        if self.slave is not None:
            self.slave.set_master(ha_addr)

    def runtime_fields(self) -> dict[str, str]:
        """The replication keys of GET_BROKER_RUNTIME_INFO (handlers/ha_info.py)."""
        if self.slave is not None:
            fields = slave_fields(self.slave.state())
        else:
            fields = master_fields(self.master.slaves() if self.master is not None else [])
        controlled = self._controlled
        if controlled is not None and controlled.fields is not None:
            fields.update(controlled.fields())
        return fields
