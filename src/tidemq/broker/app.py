"""BrokerApp: the broker's composition root: builds every part, wires, starts and stops them.

    start:  store (recover) ─▶ topic / group / offset / delay / timer tables (load)
            ─▶ replication (replication.py: a master's HA listener; a slave's replica mode and
               metadata copy) ─▶ a master's transaction ledger (rebuilt from the store)
            ─▶ pull hold, flush service ─▶ durability (the flush and a SYNC_MASTER's slave ack)
            ─▶ handler table ─▶ RemotingServer (listenPort, and listenPort-2 for the VIP channel)
            ─▶ address known (port 0 → the bound port) ─▶ register with name servers (a slave
               learns its master from their answers)
            ─▶ periodic services: offset persistence, client expiry, file cleanup, and on a
               master the transaction check-back, delay levels and timers
    stop:   the reverse: unregister, release held pulls, close the server, stop replication and
            the services, final flush, persist offsets, shut the store (removes `abort`: a clean
            stop)

Parts receive exactly what they use; nothing here is a service locator, and no part reaches into
another's state. The store is synchronous and runs on the event-loop thread, except the flush,
which the FlushService runs in a worker thread (the store makes flush safe against appends).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from tidemq.broker.access import NO_ACL, AccessGate, BrokerAcl, inner_signer
from tidemq.broker.clients import ClientRegistry, ConsumerIdsNotifier, QueueLockTable
from tidemq.broker.config import BrokerConfig, StorePathError
from tidemq.broker.durability import Durability
from tidemq.broker.flush import FlushService
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.handlers.admin import AdminHandlers
from tidemq.broker.handlers.client import ClientHandlers
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.handlers.end_batch import EndBatchHandler
from tidemq.broker.handlers.end_transaction import EndTransactionHandler
from tidemq.broker.handlers.offsets import OffsetHandlers
from tidemq.broker.handlers.pull import PullHandler
from tidemq.broker.handlers.query import QueryHandlers
from tidemq.broker.handlers.send import SendHandler
from tidemq.broker.handlers.send_back import SendBackHandler
from tidemq.broker.metrics import BrokerMetrics
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.pull_hold import PullHoldService
from tidemq.broker.registration import RegistrationService
from tidemq.broker.replication import ControlledRole, Replication
from tidemq.broker.schedule import DelayRouter, ScheduleService
from tidemq.broker.service import PeriodicService
from tidemq.broker.stats import SAMPLE_INTERVAL_MS, BrokerStats
from tidemq.broker.timer import TimerWheel
from tidemq.broker.tls_setup import check_tls_files, outbound_ssl
from tidemq.broker.topic_adopt import TopicAdopter
from tidemq.broker.topics import TopicTable
from tidemq.broker.trace import broker_trace, start_trace, stop_trace
from tidemq.broker.transaction.admin import TransactionAdminHandlers
from tidemq.broker.transaction.batch import SinkBatchResolver
from tidemq.broker.transaction.check_back import CheckBackConfig, CheckBackService
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.broker.visibility import VisibilityGate
from tidemq.clock import Clock
from tidemq.remoting import TURN_BUDGET, Connection
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer
from tidemq.security.permissions import Perm
from tidemq.store.config import CorruptPolicy, FlushDiskType, StoreConfig
from tidemq.store.dispatch_retry import DISPATCH_RETRY_INTERVAL_MS_MIN
from tidemq.store.message_store import DiskUsageProbe, FileMessageStore

log = logging.getLogger(__name__)

CONFIG_DIR = "config"
# How often silent client registrations are looked for (RocketMQ scans every 10 s).
CLIENT_SCAN_INTERVAL_MS = 10_000


def _nothing_visible() -> int:
    """A controller-mode slave's read limit: it serves no record (the master serves reads)."""
    return 0


def store_config(config: BrokerConfig) -> StoreConfig:
    """The store's settings from the broker's (broker.conf names them as RocketMQ does)."""
    return StoreConfig(
        root_dir=Path(config.store_path_root_dir),
        commit_log_file_size=config.commit_log_file_size,
        consume_queue_file_entries=config.consume_queue_file_entries,
        flush_disk_type=FlushDiskType(config.flush_disk_type),
        file_reserved_time_hours=config.file_reserved_time_hours,
        delete_when_hour=config.delete_when_hours[0],
        disk_max_used_space_ratio_percent=config.disk_max_used_space_ratio_percent,
        message_size_max=config.max_message_size,
        corrupt_policy=CorruptPolicy(config.corrupt_policy),
        commit_log_resident_bytes=config.commit_log_resident_bytes,
    )


class BrokerApp:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        *,
        disk_usage_probe: DiskUsageProbe | None = None,
        controlled: ControlledRole | None = None,
    ) -> None:
        """`disk_usage_probe` replaces the store's disk measurement (tests of a full disk);
        `controlled`: the role the controller gave this broker (failover.py), None outside
        controller mode. Raises TlsConfigError for a TLS file that is missing or does not fit
        (tls_setup.py), before anything is opened."""
        check_tls_files(config)
        self.config = config
        self.controlled = controlled
        self.clock = clock
        self.advertised = BrokerAddress(config.broker_ip, config.listen_port)
        root = Path(config.store_path_root_dir)
        config_dir = root / CONFIG_DIR
        self.store = FileMessageStore(
            store_config(config), clock, disk_usage_probe=disk_usage_probe
        )
        self.topics = TopicTable(
            config_dir,
            clock,
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            auto_create_topic_enable=config.auto_create_topic_enable,
            default_topic_queue_nums=config.default_topic_queue_nums,
        )
        self.groups = SubscriptionGroupTable(
            config_dir, clock, auto_create=config.auto_create_subscription_group
        )
        store = self.store
        self.offsets = ConsumerOffsetTable(config_dir, log_end=lambda: store.max_physical_offset)
        self._notifier = ConsumerIdsNotifier()
        self.clients = ClientRegistry(
            clock, expiry_ms=config.client_expiry_ms, on_consumer_ids_changed=self._notifier
        )
        self.locks = QueueLockTable(clock)
        self.pull_hold = PullHoldService(long_polling=config.long_polling_enable)
        self.schedule = ScheduleService(self.store, config.delay_levels_ms, clock, config_dir)
        self.timer = TimerWheel(self.store, clock, config_dir)
        self.delays = DelayRouter(
            config.delay_levels_ms,
            clock,
            timer=self.timer,
            timer_max_delay_ms=config.timer_max_delay_sec * 1000,
        )
        self.transaction_stats = TransactionStats()
        self.stats = BrokerStats(config.broker_cluster_name, clock.now_ms)
        self.metrics = BrokerMetrics(config)  # loop lag, the PROM exporter
        self.trace = broker_trace(config, store, self.topics, self.clients, clock, self.advertised)
        self.transactions, self.sink_batches = self._transaction_parts()
        self.check_back: CheckBackService | None = None
        self.visibility: VisibilityGate | None = None
        self._namesrv_client: RemotingClient | None = None
        self._server: RemotingServer | None = None
        self.flush: FlushService | None = None
        self.durability: Durability | None = None
        self.replication = self._replication()
        # aclEnable: the request hook and the file reload (access.py); a bad file stops here.
        self.acl = BrokerAcl(config) if config.acl_enable else None
        self.registration: RegistrationService | None = None
        self._periodic: list[PeriodicService] = []
        self._started = False

    def _transaction_parts(self) -> tuple[TransactionResolver, SinkBatchResolver]:
        """The resolver of END_TRANSACTION answers and the Spark sink's batch ends beside it."""
        transactions = TransactionResolver(
            self.store,
            TransactionLedger(),
            self.transaction_stats,
            self.clock,
            (self.advertised.host, self.advertised.port),
            route=self.delays.route,
        )
        sink_batches = SinkBatchResolver(
            transactions,
            self.clock,
            orphan_timeout_ms=int(self.config.spark_orphan_timeout_hours * 3_600_000),
        )
        transactions.prepare_listeners.append(sink_batches.on_prepare)
        return transactions, sink_batches

    def _replication(self) -> Replication:
        """The HA parts of this broker's role (replication.py); nothing runs before `start`."""
        return Replication(
            self.config,
            self.store,
            self.clock,
            self.advertised,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            schedule=self.schedule,
            timer=self.timer,
            controlled=self.controlled,
        )

    # -- properties --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound client port (the real one when listenPort is 0)."""
        assert self._server is not None, "broker not started"
        return self._server.port

    @property
    def ports(self) -> list[int]:
        assert self._server is not None, "broker not started"
        return self._server.ports

    @property
    def server(self) -> RemotingServer:
        """The remoting server of the client port (what it serves: `server.handlers.codes()`)."""
        assert self._server is not None, "broker not started"
        return self._server

    @property
    def address(self) -> str:
        """ "ip:port" as clients dial it and name servers publish it."""
        return self.advertised.text

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        assert not self._started, "broker already started"
        config = self.config
        log.info(
            "starting broker %s (cluster %s, id %d) on %s",
            config.broker_name,
            config.broker_cluster_name,
            config.broker_id,
            config.store_path_root_dir,
        )
        check_store_root(config.store_path_root_dir)
        # Recovery may scan a lot of log: keep the loop responsive (nothing else runs yet).
        await asyncio.to_thread(self.store.start)
        try:
            await self._start_services()
        except BaseException:
            await self._stop_services()
            self.store.shutdown()
            raise
        self._started = True
        log.info("broker %s serving at %s", config.broker_name, self.advertised.text)

    async def _start_services(self) -> None:
        config = self.config
        self.topics.load()
        self.topics.persist()
        self.groups.load()
        self.offsets.load()
        self.schedule.load()
        self.timer.load()
        # From here a slave's store takes no local write; a master's HA port listens.
        await self.replication.start()
        if not config.is_slave:
            # A slave's log is its master's copy: the rebuild's repair would write op messages
            # into it. Its ledger stays empty: it answers no END_TRANSACTION, runs no check-back.
            self.transactions.rebuild(self.offsets)
            self.sink_batches.rebuild()
        self.pull_hold.start()
        self._listen_to_dispatch()
        start_trace(config, self.topics, self.trace)
        self.flush = FlushService(
            self.store.flush,
            sync=config.flush_disk_type == "SYNC_FLUSH",
            interval_ms=config.flush_interval_ms,
            sync_timeout_ms=config.sync_flush_timeout_ms,
            flush_log=functools.partial(self.store.flush, log_only=True),
        )
        self.flush.start()
        controlled = self.controlled
        self.durability = Durability(
            self.flush,
            self.replication.master,
            config.is_sync_master,
            sync_flush_timeout_ms=config.sync_flush_timeout_ms,
            group=controlled is not None and config.is_master,
            fence=controlled.fence if controlled is not None and config.is_master else None,
        )
        self._server = self._remoting_server(self.durability)
        await self._server.start()
        self.advertised.port = self._server.port
        self.transactions.set_store_host((self.advertised.host, self.advertised.port))
        self.sink_batches.set_store_host((self.advertised.host, self.advertised.port))
        self._namesrv_client = RemotingClient(
            clock=self.clock, signer=inner_signer(config), ssl=outbound_ssl(config)
        )
        self.registration = RegistrationService(
            config,
            self.advertised,
            self.topics,
            self._namesrv_client,
            ha_address=self.replication.ha_address,
            on_master=self.replication.on_master,
        )
        await self.registration.register_all()
        self.registration.start()
        self._periodic = self._periodic_services()
        for service in self._periodic:
            service.start()
        await self.metrics.start(self)
        self.check_back = CheckBackService(
            CheckBackConfig.from_broker(config),
            self.transactions,
            self.offsets,
            self._check_back_producers,
            self.clock,
            sink_batches=self.sink_batches,
        )
        if config.is_master:
            self.check_back.start()
            self.schedule.start()
            self.timer.start()

    def _listen_to_dispatch(self) -> None:
        """The parts that follow the store's dispatch: held pulls (through the visibility
        gate), delay levels, timers, and on a controller-mode master the topics its table
        lacks (topic_adopt.py)."""
        self._gate_reads()
        self.store.add_dispatch_listener(self.schedule.on_dispatch, self.schedule.wants_topic)
        self.store.add_dispatch_listener(self.timer.on_dispatch, self.timer.wants_topic)
        if self.controlled is not None and self.config.is_master:
            adopter = TopicAdopter(self.topics)
            adopter.adopt_all(self.store.topics_and_queues())
            self.store.add_dispatch_listener(adopter.on_dispatch, adopter.wants_topic)

    def _gate_reads(self) -> None:
        """Held pulls hear of new records through the visibility gate: at once, except on a
        controller-mode master, where a record is shown once every in-sync replica has it
        (visibility.py); a controller-mode slave shows nothing (the master serves reads)."""
        controlled = self.controlled
        limited = controlled is not None and self.config.is_master
        gate = VisibilityGate(
            self.pull_hold.on_dispatch, self.pull_hold.wants_topic, limited=limited
        )
        self.store.add_dispatch_listener(gate.on_dispatch, gate.wants_topic)
        master = self.replication.master
        if limited and master is not None:
            master.add_confirm_listener(gate.advance)
        self.visibility = gate

    def _visible_end(self) -> Callable[[], int] | None:
        """The pull handler's read limit: None outside controller mode (see `_gate_reads`)."""
        if self.controlled is None:
            return None
        if self.config.is_master:
            assert self.visibility is not None, "reads are gated before handlers are built"
            return self.visibility.visible_end
        return _nothing_visible

    def _remoting_server(self, durability: Durability) -> RemotingServer:
        """The server on the listen port (and the VIP port), with every handler."""
        config = self.config
        vip = config.vip_port
        return RemotingServer(
            self._handler_table(durability),
            config.listen_host,
            config.listen_port,
            name=f"broker-{config.broker_name}",
            idle_timeout_ms=config.client_expiry_ms,
            extra_ports=[vip] if vip is not None else [],
            clock=self.clock,
            request_hook=self.acl.hook if self.acl is not None else None,
            tls=config.tls_server_settings,
            # Under SYNC_FLUSH an answer waits for the disk anyway (and under SYNC_MASTER for a
            # slave): starting a read's sends in slices would only split them over more
            # group-commit rounds (pipelined SYNC sends measured 6 % slower with slices).
            turn_budget=None if durability.waits else TURN_BUDGET,
            limits=config.connection_limits,
        )

    def _periodic_services(self) -> list[PeriodicService]:
        """The broker's timed chores (started by `_start_services`, stopped on shutdown)."""
        config = self.config
        acl = [self.acl.reload_service()] if self.acl is not None else []
        return [
            *acl,
            PeriodicService(
                "consumer-offset-persist",
                config.consumer_offset_persist_interval_ms,
                self.offsets.persist_if_dirty,
            ),
            PeriodicService("client-expiry", CLIENT_SCAN_INTERVAL_MS, self._expire_clients),
            PeriodicService("stats-sample", SAMPLE_INTERVAL_MS, self.stats.sample),
            PeriodicService("file-cleanup", config.cleanup_interval_ms, self._clean_files),
            # After a failed dispatch (a full disk), re-dispatch once space is back; the store
            # keeps the backoff, so a tick with nothing due costs one comparison.
            PeriodicService(
                "dispatch-retry", DISPATCH_RETRY_INTERVAL_MS_MIN, self.store.retry_dispatch
            ),
            PeriodicService(
                "delay-offset-persist",
                config.consumer_offset_persist_interval_ms,
                self.schedule.persist_if_dirty,
            ),
            PeriodicService(
                "timer-progress-persist",
                config.consumer_offset_persist_interval_ms,
                self.timer.persist_if_dirty,
            ),
        ]

    def _handler_table(self, durability: Durability) -> HandlerTable:
        table = HandlerTable()
        table.observer = self.metrics.rpc
        gate = self.acl.gate if self.acl is not None else NO_ACL
        SendHandler(
            self.config,
            self.advertised,
            self.store,
            self.topics,
            self.groups,
            durability,
            self.transactions,
            self.delays,
            clock=self.clock,
            stats=self.stats,
            trace=self.trace,
        ).register(table)
        SendBackHandler(
            self.config,
            self.advertised,
            self.store,
            self.topics,
            self.groups,
            durability,
            self.delays,
            gate,
            stats=self.stats,
        ).register(table)
        self._register_transaction_handlers(table, durability, gate)
        self._register_consume_handlers(table)
        ClientHandlers(
            self.clock,
            self.clients,
            self.locks,
            self.groups,
            self.topics,
            property_filter_enabled=self.config.enable_property_filter,
        ).register(table)
        AdminHandlers(
            self.config,
            self.advertised,
            self.clock,
            self.store,
            self.topics,
            self.offsets,
            self.clients,
            groups=self.groups,
            delay_offsets=self.schedule.to_json,
            timer_progress=self.timer.progress_doc,
            ha_fields=self.replication.runtime_fields,
            stats=self.stats,  # with groups: also the operations of admin_ops.py
        ).register(table)
        QueryHandlers(self.store, self.clock, gate).register(table)
        return table

    def _register_consume_handlers(self, table: HandlerTable) -> None:
        PullHandler(
            self.config,
            self.store,
            self.topics,
            self.groups,
            self.offsets,
            self.clients,
            self.pull_hold,
            visible_end=self._visible_end(),
            stats=self.stats,
            trace=self.trace,
        ).register(table)
        OffsetHandlers(
            self.store,
            self.offsets,
            self.topics,
            is_slave=self.config.is_slave,
            visible_end=self._visible_end(),
            trace=self.trace,
        ).register(table)

    def _register_transaction_handlers(
        self, table: HandlerTable, durability: Durability, gate: AccessGate
    ) -> None:
        EndTransactionHandler(
            self.config, self.transactions, durability.wait_durable, gate, trace=self.trace
        ).register(table)
        EndBatchHandler(
            self.config,
            self.sink_batches,
            durability.wait_durable,
            ledger=self.transactions.ledger,
            gate=gate,
        ).register(table)
        TransactionAdminHandlers(
            self.transactions.ledger, self.transaction_stats, self.clock
        ).register(table)

    def _check_back_producers(self, group: str, topic: str) -> list[Connection]:
        """The producers of `group` a check-back about a half of `topic` may go to: under ACL
        only those whose heartbeat's account has PUB on the topic (the check carries the
        half's body)."""
        channels = self.clients.producer_channels(group)
        acl = self.acl
        if acl is None:
            return [c.connection for c in channels]
        permits = acl.authorizer.permits
        return [
            c.connection
            for c in channels
            if permits(c.access_key, c.connection.peer[0], topic, Perm.PUB)
        ]

    def _expire_clients(self) -> None:
        self.clients.expire()
        swept = self.locks.sweep()
        if swept:
            log.info("swept %d expired queue locks", swept)

    def _clean_files(self) -> None:
        now_ms = self.clock.now_ms()
        # The store knows one deletion hour; deleteWhen may list several ("04;16").
        hour = time.localtime(now_ms / 1000).tm_hour
        self.store.clean_expired_files(now_ms, force=hour in self.config.delete_when_hours)

    async def stop(self) -> None:
        """Stop everything in reverse order; safe to call once after start."""
        if not self._started:
            return
        self._started = False
        log.info("stopping broker %s", self.config.broker_name)
        await self._stop_services()
        self.store.shutdown()
        log.info("broker %s stopped", self.config.broker_name)

    async def _stop_services(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
            if self._server is not None and self._server.ports:
                await self.registration.unregister_all()
        await self.metrics.stop()
        await self.pull_hold.stop()
        if self._server is not None:
            await self._server.stop()
        await self._notifier.stop()
        await self.replication.stop()
        if self.check_back is not None:
            await self.check_back.stop()
        await self.schedule.stop()
        await self.timer.stop()
        await stop_trace(self.trace)
        for service in reversed(self._periodic):
            await service.stop()
        self._periodic = []
        if self.flush is not None:
            await self.flush.stop()
        try:
            self.offsets.persist()
        except OSError:
            log.exception("could not persist consumer offsets at shutdown")
        for table in (self.topics, self.groups):
            try:
                await table.flush()
            except OSError:
                log.exception("could not persist %s at shutdown", type(table).__name__)
        if self._namesrv_client is not None:
            await self._namesrv_client.close()


def check_store_root(root: Path) -> None:
    """storePathRootDir exists (created if missing) and is a directory this process can write:
    checked before the store opens it, so an unusable path is one error naming the setting.

    Raises:
        StorePathError: it is not.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorePathError(root, exc.strerror or str(exc)) from exc
    if not os.access(root, os.W_OK | os.X_OK):  # also EROFS: a read-only file system
        raise StorePathError(root, "not writable by this user")
