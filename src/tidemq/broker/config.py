"""BrokerConfig: the broker's settings and their checks (the loader of broker.conf files is
config_file.py, the key table config_keys.py).

Users arrive with Java properties files using RocketMQ's camelCase keys (brokerName, namesrvAddr,
flushDiskType, ...). Those keys are accepted at the edge and mapped onto one frozen dataclass whose
field names carry their units (`flush_interval_ms`, `file_reserved_time_hours`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidemq.broker.delay_levels import (
    DELAY_LEVELS_DEFAULT,
    TIMER_MAX_DELAY_SEC_DEFAULT,
    parse_delay_levels,
)
from tidemq.errors import QueueError
from tidemq.limits import (
    BROKER_REGISTER_INTERVAL_MS,
    CLIENT_EXPIRY_MS,
    COMMIT_LOG_FILE_SIZE_DEFAULT,
    CONSUME_QUEUE_FILE_ENTRIES_DEFAULT,
    MESSAGE_BODY_SIZE_MAX,
)
from tidemq.protocol.ha import FRAME_DATA_SIZE_MAX
from tidemq.protocol.message import MASTER_BROKER_ID
from tidemq.remoting.caps import (
    CONNECTIONS_MAX_DEFAULT,
    CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
    ConnectionLimits,
)
from tidemq.remoting.connection import IN_FLIGHT_BYTES_MAX
from tidemq.security.signing import Credentials
from tidemq.security.tls import (
    TlsClientSettings,
    TlsServerSettings,
    default_mode,
    parse_client_auth,
    parse_mode,
)
from tidemq.store.config import COMMIT_LOG_RESIDENT_BYTES_DEFAULT

log = logging.getLogger(__name__)

ENV_PREFIX: Final = "TIDEMQ_"
FLUSH_DISK_TYPES: Final = ("ASYNC_FLUSH", "SYNC_FLUSH")
BROKER_ROLES: Final = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
METRICS_EXPORTER_TYPES: Final = ("DISABLE", "PROM")
# Roles that cannot run without the HA secret: a SLAVE must prove itself to its master, and a
# SYNC_MASTER's acknowledgements mean nothing unless only authenticated slaves can report
# offsets (upstream's open HA port lets anyone fake an ack: spec/ha.md §2, #3015, #1155).
ROLES_NEEDING_SECRET: Final = ("SYNC_MASTER", "SLAVE")
# The HA (replication) port is listenPort plus this by default (RocketMQ: 10911 → 10912).
HA_PORT_OFFSET: Final = 1
# A secret shorter than this is accepted with a warning: it is the only thing between the HA
# port and anyone who can reach it.
HA_SECRET_SIZE_MIN: Final = 16
# The largest haTransferBatchSize is the HA stream's frame limit (protocol/ha.py): the slave
# buffers one frame.
HA_TRANSFER_BATCH_SIZE_MAX: Final = FRAME_DATA_SIZE_MAX
# The VIP channel listens on listenPort minus this (RocketMQ: 10911 → 10909).
VIP_CHANNEL_PORT_OFFSET: Final = 2
_DELETE_WHEN = re.compile(r"^\d{1,2}(;\d{1,2})*$")
_PERM_ALL: Final = 0xF


class ConfigError(QueueError, ValueError):
    """A configuration value or combination that the broker cannot run with."""


class StorePathError(ConfigError):
    """storePathRootDir cannot be created or written (found when the broker starts)."""

    def __init__(self, root: Path, why: str) -> None:
        super().__init__(
            f"storePathRootDir={str(root)!r}: {why}: set storePathRootDir (--data-dir) to a"
            " directory this user can create and write"
        )
        self.root = root


def _bad(key: str, value: object, why: str) -> ConfigError:
    """The error for one setting, named by its broker.conf key as the user wrote it."""
    return ConfigError(f"{key}={value!r}: {why}")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Every broker setting. Sizes are bytes unless the name says otherwise."""

    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_role: str = "ASYNC_MASTER"
    namesrv_addrs: tuple[str, ...] = ()
    # Address the listener binds; broker_ip is what clients are told to dial.
    listen_host: str = "0.0.0.0"
    listen_port: int = 10911
    vip_channel_enabled: bool = True
    # Advertised IPv4 (C++ clients dial AF_INET only). 127.0.0.1 suits a single-host dev setup.
    broker_ip: str = "127.0.0.1"
    store_path_root_dir: Path = field(default_factory=lambda: Path.home() / "store")
    flush_disk_type: str = "ASYNC_FLUSH"
    commit_log_file_size: int = COMMIT_LOG_FILE_SIZE_DEFAULT
    consume_queue_file_entries: int = CONSUME_QUEUE_FILE_ENTRIES_DEFAULT
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    auto_create_subscription_group: bool = True
    long_polling_enable: bool = True
    short_polling_ms: int = 1_000
    flush_interval_ms: int = 500
    sync_flush_timeout_ms: int = 5_000
    consumer_offset_persist_interval_ms: int = 5_000
    register_interval_ms: int = BROKER_REGISTER_INTERVAL_MS
    register_timeout_ms: int = 6_000
    client_expiry_ms: int = CLIENT_EXPIRY_MS
    cleanup_interval_ms: int = 10_000
    file_reserved_time_hours: float = 72.0
    delete_when: str = "04"
    disk_max_used_space_ratio_percent: int = 75
    max_message_size: int = MESSAGE_BODY_SIZE_MAX
    # Limits (issue 15; remoting/caps.py, turns.py; 0: no cap): connections served in all and
    # per remote address, body bytes of one connection's requests in flight before it reads no
    # more, and upstream's fast failure: with brokerFastFailureEnable a send that waited
    # waitTimeMillsInSendQueue in its connection's backlog is answered SYSTEM_BUSY.
    connections_max: int = CONNECTIONS_MAX_DEFAULT
    connections_per_address_max: int = CONNECTIONS_PER_ADDRESS_MAX_DEFAULT
    in_flight_bytes_per_connection_max: int = IN_FLIGHT_BYTES_MAX
    broker_fast_failure_enable: bool = True
    send_queue_wait_ms_max: int = 200
    broker_permission: int = 6
    reject_transaction_message: bool = False
    transaction_timeout_ms: int = 6_000
    transaction_check_max: int = 15
    transaction_check_interval_ms: int = 60_000
    # Check passes that found no live producer of a half message's group before it is discarded
    # anyway. Such passes do not count toward transaction_check_max (after a restart producers
    # are unknown until their next heartbeat, up to 30 s); this bounds how long a group gone for
    # good keeps its halves (and a copy per pass): 60 passes at the default interval is an hour,
    # past a restart's heartbeat window and a redeploy. fileReservedTime bounds them as well.
    transaction_unreached_check_max: int = 60
    # Spark sink halves no batch record resolves are rolled back after this long (a stopped
    # query may restart late, so hours; below fileReservedTime, which discards them).
    spark_orphan_timeout_hours: float = 24.0
    message_delay_level: str = DELAY_LEVELS_DEFAULT
    timer_max_delay_sec: int = TIMER_MAX_DELAY_SEC_DEFAULT
    enable_property_filter: bool = False
    # Message trace (broker/trace.py): upstream's traceTopicEnable and msgTraceTopicName, and
    # TideMQ's broker-side trace; brokerTraceTopics "" = every non-system topic, else a list.
    trace_topic_enable: bool = False
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    broker_trace_enable: bool = False
    broker_trace_topics: str = ""
    # What start-up does with commit-log corruption that is not a torn tail (store/recovery.py):
    # "refuse" to start, or "quarantine" the damaged segments and start from the valid prefix.
    corrupt_policy: str = "refuse"
    commit_log_resident_bytes: int = COMMIT_LOG_RESIDENT_BYTES_DEFAULT
    # Replication (issue 13): RocketMQ's keys and defaults, plus TideMQ's haSecret and
    # slaveSyncIntervalMs. None: listenPort + 1 (0, a free port, when listenPort is 0).
    ha_listen_port: int | None = None
    ha_send_heartbeat_interval_ms: int = 5_000
    ha_housekeeping_interval_ms: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024
    slave_read_enable: bool = False
    # With slaveReadEnable, a master steers a pull to a slave when the pull is further behind
    # the log's end than this percentage of physical memory (RocketMQ's rule: such reads miss
    # the page cache and compete with the writes).
    access_message_in_memory_max_ratio_percent: int = 40
    # Shared by a master and its slaves; authenticates both ends of the HA connection.
    ha_secret: str = field(default="", repr=False)
    # How often a slave copies topics, groups, consumer offsets and delay progress from its
    # master (upstream: 10 s, fixed).
    slave_sync_interval_ms: int = 1_000
    # Controller mode (issue 14, RocketMQ 5's enableControllerMode): the group's master, epoch
    # and in-sync set live in etcd; the role is the controller's, brokerId is the replica's
    # stable id (>= 1), the master registers as 0. broker/failover.py runs it.
    enable_controller_mode: bool = False
    controller_etcd_endpoints: tuple[str, ...] = ()
    controller_etcd_prefix: str = "/tidemq"
    controller_lease_ttl_seconds: int = 2
    # A sync-set slave that has not reached the master's log end for this long is removed from
    # the set (one compare-and-swap in etcd) so sends stop waiting for it (RocketMQ 5 default:
    # 15 s; below syncFlushTimeout here, so a send waiting for it is answered in time).
    ha_max_time_slave_not_catchup_ms: int = 3_000
    all_ack_in_sync_state_set: bool = True
    # ACL (issue 15, RocketMQ's aclEnable): requests are signed and checked against
    # plain_acl.yml (security/acl.py). The file's default is plain_acl.yml beside broker.conf
    # (config_file.py); without a broker.conf it must be given.
    acl_enable: bool = False
    acl_file_path: Path | None = None
    # RocketMQ 5's innerClientAuthenticationCredentials, JSON {"accessKey": .., "secretKey": ..}:
    # what this broker signs its own requests with (registration with name servers, a slave's
    # requests to its master). Redacted wherever the config is shown.
    inner_client_authentication_credentials: str = field(default="", repr=False)
    # TLS (issue 15), upstream's keys (security/tls.py). tls.server.mode empty: permissive when
    # a certificate and key are given, else disabled. tls.enable: this broker's own connections
    # (to name servers, a slave's to its master, and its HA link) are TLS, with tls.client.*.
    tls_server_mode: str = ""
    tls_server_cert_path: Path | None = None
    tls_server_key_path: Path | None = None
    tls_server_key_password: str = field(default="", repr=False)
    tls_server_need_client_auth: str = "none"
    tls_server_trust_cert_path: Path | None = None
    tls_enable: bool = False
    tls_client_cert_path: Path | None = None
    tls_client_key_path: Path | None = None
    tls_client_key_password: str = field(default="", repr=False)
    tls_client_trust_cert_path: Path | None = None
    tls_client_auth_server: bool = True
    # Metrics (issue 17), RocketMQ 5's keys: DISABLE, or PROM (Prometheus text over HTTP on
    # metricsPromExporterHost:Port; empty host: brokerIP1, as upstream). OTLP_GRPC and LOG are
    # upstream's too, refused here (not implemented).
    metrics_exporter_type: str = "DISABLE"
    metrics_prom_exporter_host: str = ""
    metrics_prom_exporter_port: int = 5557

    def __post_init__(self) -> None:
        self._check_identity()
        self._check_store()
        self._check_periods()
        self._check_delays_and_transactions()
        self._check_replication()
        self._check_tls()
        self._check_acl()
        if self.metrics_exporter_type not in METRICS_EXPORTER_TYPES:
            raise _bad(
                "metricsExporterType",
                self.metrics_exporter_type,
                f"must be {' or '.join(METRICS_EXPORTER_TYPES)} (OTLP_GRPC and LOG: not in TideMQ)",
            )
        if not 0 <= self.metrics_prom_exporter_port <= 65535:
            raise _bad("metricsPromExporterPort", self.metrics_prom_exporter_port, "not a port")
        for addr in self.namesrv_addrs:
            _check_addr("namesrvAddr", addr)

    def _check_identity(self) -> None:
        """Who the broker is and what it serves: names, id, role, ports, permission."""
        if not self.broker_cluster_name:
            raise _bad("brokerClusterName", self.broker_cluster_name, "must not be empty")
        if not self.broker_name:
            raise _bad("brokerName", self.broker_name, "must not be empty")
        if self.broker_id < 0:
            raise _bad("brokerId", self.broker_id, "must be >= 0 (0 is the master)")
        if self.broker_role not in BROKER_ROLES:
            raise _bad("brokerRole", self.broker_role, f"must be one of {', '.join(BROKER_ROLES)}")
        if not 0 <= self.listen_port <= 65535:
            raise _bad("listenPort", self.listen_port, "must be a TCP port (0 picks a free one)")
        if self.vip_channel_enabled and 0 < self.listen_port <= VIP_CHANNEL_PORT_OFFSET:
            raise _bad("listenPort", self.listen_port, "leaves no room for the VIP port (port-2)")
        try:
            ipaddress.IPv4Address(self.broker_ip)
        except ValueError:
            raise _bad(
                "brokerIP1",
                self.broker_ip,
                "must be an IPv4 address (clients dial it; stored messages carry it as storeHost)",
            ) from None
        if not 0 <= self.broker_permission <= _PERM_ALL:
            raise _bad("brokerPermission", self.broker_permission, "must be 0..15")

    def _check_store(self) -> None:
        """The store's shape and retention: flushing, file sizes, topics' queues, disk use."""
        if self.flush_disk_type not in FLUSH_DISK_TYPES:
            raise _bad("flushDiskType", self.flush_disk_type, "must be ASYNC_FLUSH or SYNC_FLUSH")
        if self.commit_log_file_size < 4096:
            raise _bad("mappedFileSizeCommitLog", self.commit_log_file_size, "must be >= 4096")
        if self.commit_log_file_size > 2**31 - 1:
            raise _bad("mappedFileSizeCommitLog", self.commit_log_file_size, "must be < 2 GiB")
        if self.max_message_size < 1:
            raise _bad("maxMessageSize", self.max_message_size, "must be >= 1")
        if self.consume_queue_file_entries < 1:
            raise _bad("mappedFileSizeConsumeQueue", self.consume_queue_file_entries, "too small")
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise _bad("defaultTopicQueueNums", self.default_topic_queue_nums, "must be 1..1024")
        if not _DELETE_WHEN.match(self.delete_when) or any(
            int(h) > 23 for h in self.delete_when.split(";")
        ):
            raise _bad("deleteWhen", self.delete_when, "must be hours 00..23 joined by ';'")
        if not 0 <= self.disk_max_used_space_ratio_percent <= 100:
            # RocketMQ clamps to 10..95; 0 is allowed here so tests can simulate a full disk.
            raise _bad("diskMaxUsedSpaceRatio", self.disk_max_used_space_ratio_percent, "0..100")
        if self.file_reserved_time_hours <= 0:
            raise _bad("fileReservedTime", self.file_reserved_time_hours, "must be > 0")
        if self.corrupt_policy not in ("refuse", "quarantine"):
            raise _bad("corruptPolicy", self.corrupt_policy, "must be refuse or quarantine")
        if self.commit_log_resident_bytes < 0:
            raise _bad("commitLogResidentBytes", self.commit_log_resident_bytes, "must be >= 0")
        for key, value in (
            ("maxConnections", self.connections_max),
            ("maxConnectionsPerAddress", self.connections_per_address_max),
            ("maxInFlightBytesPerConnection", self.in_flight_bytes_per_connection_max),
            ("waitTimeMillsInSendQueue", self.send_queue_wait_ms_max),
        ):
            if value < 0:
                raise _bad(key, value, "must be >= 0 (0: no limit)")

    def _check_periods(self) -> None:
        """Every period and timeout in ms is positive: zero would spin a service or never wait."""
        for key, value in (
            ("shortPollingTimeMills", self.short_polling_ms),
            ("flushIntervalCommitLog", self.flush_interval_ms),
            ("syncFlushTimeout", self.sync_flush_timeout_ms),
            ("flushConsumerOffsetInterval", self.consumer_offset_persist_interval_ms),
            ("registerNameServerPeriod", self.register_interval_ms),
            ("registerBrokerTimeoutMills", self.register_timeout_ms),
            ("channelExpiredTimeout", self.client_expiry_ms),
            ("cleanResourceInterval", self.cleanup_interval_ms),
            ("transactionTimeOut", self.transaction_timeout_ms),
            ("transactionCheckInterval", self.transaction_check_interval_ms),
            ("haSendHeartbeatInterval", self.ha_send_heartbeat_interval_ms),
            ("haHousekeepingInterval", self.ha_housekeeping_interval_ms),
            ("slaveSyncIntervalMs", self.slave_sync_interval_ms),
        ):
            if value <= 0:
                raise _bad(key, value, "must be > 0 ms")

    def _check_delays_and_transactions(self) -> None:
        """Delay levels, timers, check-back limits and the Spark sink's orphan timeout."""
        try:
            parse_delay_levels(self.message_delay_level)
        except ValueError as exc:
            raise _bad("messageDelayLevel", self.message_delay_level, str(exc)) from None
        if self.timer_max_delay_sec <= 0:
            raise _bad("timerMaxDelaySec", self.timer_max_delay_sec, "must be > 0 s")
        if self.transaction_check_max < 0:
            raise _bad("transactionCheckMax", self.transaction_check_max, "must be >= 0")
        if self.transaction_unreached_check_max < 1:
            raise _bad(
                "transactionUnreachedCheckMax", self.transaction_unreached_check_max, "must be >= 1"
            )
        if self.spark_orphan_timeout_hours <= 0:
            raise _bad("sparkOrphanTimeoutHours", self.spark_orphan_timeout_hours, "must be > 0")

    def _check_replication(self) -> None:
        """Role and id agree, the secret is there when needed, HA limits are sane."""
        if self.enable_controller_mode:
            self._check_controller_mode()
        elif self.broker_role == "SLAVE" and self.broker_id < 1:
            raise _bad("brokerId", self.broker_id, "a SLAVE needs brokerId >= 1 (0 is the master)")
        elif self.broker_role != "SLAVE" and self.broker_id != MASTER_BROKER_ID:
            raise _bad(
                "brokerId",
                self.broker_id,
                f"brokerRole={self.broker_role} needs brokerId=0 (ids above 0 name slaves)",
            )
        if (
            self.broker_role in ROLES_NEEDING_SECRET or self.enable_controller_mode
        ) and not self.ha_secret:
            raise _bad(
                "haSecret",
                self.ha_secret,
                "required for "
                + (
                    "enableControllerMode"
                    if self.enable_controller_mode
                    else f"brokerRole={self.broker_role}"
                )
                + " (the same value on the master and its slaves)",
            )
        port = self.ha_listen_port
        if port is not None and not 0 <= port <= 65535:
            raise _bad("haListenPort", port, "must be a TCP port (0 picks a free one)")
        if self.ha_port > 65535:
            raise _bad(
                "listenPort", self.listen_port, "leaves no room for the HA port (set haListenPort)"
            )
        if port and port in (self.listen_port, self.vip_port):
            raise _bad("haListenPort", port, "must differ from listenPort and the VIP port")
        if not 1024 <= self.ha_transfer_batch_size <= HA_TRANSFER_BATCH_SIZE_MAX:
            raise _bad(
                "haTransferBatchSize",
                self.ha_transfer_batch_size,
                f"must be 1024..{HA_TRANSFER_BATCH_SIZE_MAX}",
            )
        if self.ha_max_gap_not_in_sync <= 0:
            raise _bad("haMaxGapNotInSync", self.ha_max_gap_not_in_sync, "must be > 0")
        if self.ha_housekeeping_interval_ms <= self.ha_send_heartbeat_interval_ms:
            raise _bad(
                "haHousekeepingInterval",
                self.ha_housekeeping_interval_ms,
                "must exceed haSendHeartbeatInterval (a healthy peer would be dropped)",
            )
        if not 1 <= self.access_message_in_memory_max_ratio_percent <= 100:
            raise _bad(
                "accessMessageInMemoryMaxRatio",
                self.access_message_in_memory_max_ratio_percent,
                "must be 1..100",
            )
        if self.ha_secret and len(self.ha_secret.encode()) < HA_SECRET_SIZE_MIN:
            log.warning("haSecret has fewer than %d bytes: use a longer one", HA_SECRET_SIZE_MIN)

    def _check_acl(self) -> None:
        """The ACL file is named when ACL is on; inner credentials parse; a replica that must
        read its master's metadata over remoting has credentials to sign with."""
        if self.inner_client_authentication_credentials:
            self.inner_credentials  # noqa: B018 (parses, or raises ConfigError)
        if not self.acl_enable:
            return
        if self.acl_file_path is None:
            raise _bad("aclFilePath", "", "required by aclEnable=true (the plain_acl.yml to use)")
        if (
            self.broker_role == "SLAVE" or self.enable_controller_mode
        ) and not self.inner_client_authentication_credentials:
            raise _bad(
                "innerClientAuthenticationCredentials",
                "",
                "required by aclEnable=true for "
                + ("enableControllerMode" if self.enable_controller_mode else "brokerRole=SLAVE")
                + ": a slave signs its metadata copies from the master with an admin account"
                " of the master's plain_acl.yml",
            )

    @property
    def inner_credentials(self) -> Credentials | None:
        """innerClientAuthenticationCredentials parsed; None when not set."""
        text = self.inner_client_authentication_credentials
        if not text:
            return None
        return parse_inner_credentials(text)

    def _check_tls(self) -> None:
        """The TLS settings are complete (files are read when the broker starts)."""
        self.tls_server_settings  # noqa: B018 (builds, or raises TlsConfigError)
        self.tls_client_settings  # noqa: B018

    @property
    def tls_server_settings(self) -> TlsServerSettings:
        """What the client ports (listenPort, the VIP port) speak: tls.server.*."""
        client_auth = parse_client_auth(self.tls_server_need_client_auth)
        if self.tls_server_mode:
            mode = parse_mode(self.tls_server_mode)
        else:
            given = self.tls_server_cert_path is not None and self.tls_server_key_path is not None
            mode = default_mode(certificate=given, client_auth=client_auth)
        return TlsServerSettings(
            mode=mode,
            cert_path=self.tls_server_cert_path,
            key_path=self.tls_server_key_path,
            key_password=self.tls_server_key_password,
            client_auth=client_auth,
            trust_cert_path=self.tls_server_trust_cert_path,
        )

    @property
    def tls_client_settings(self) -> TlsClientSettings | None:
        """How this broker dials (tls.client.*); None unless tls.enable."""
        if not self.tls_enable:
            return None
        return TlsClientSettings(
            trust_cert_path=self.tls_client_trust_cert_path,
            cert_path=self.tls_client_cert_path,
            key_path=self.tls_client_key_path,
            key_password=self.tls_client_key_password,
            verify_server=self.tls_client_auth_server,
        )

    def _check_controller_mode(self) -> None:
        """Controller mode: the controller decides the role; what it needs is there."""
        if self.broker_id < 1:
            raise _bad(
                "brokerId",
                self.broker_id,
                "enableControllerMode needs brokerId >= 1: the replica's own id in its group "
                "(whichever replica is master registers as 0)",
            )
        if self.broker_role != "ASYNC_MASTER":
            raise _bad(
                "brokerRole",
                self.broker_role,
                "the controller decides the role under enableControllerMode: remove brokerRole",
            )
        if self.listen_port == 0 or self.ha_listen_port == 0:
            raise _bad(
                "listenPort" if self.listen_port == 0 else "haListenPort",
                0,
                "enableControllerMode needs fixed ports: a replica keeps its address across "
                "role changes (clients, name servers and the other replicas dial it)",
            )
        if not self.controller_etcd_endpoints:
            raise _bad(
                "controllerEtcdEndpoints", "", "required by enableControllerMode (host:port;...)"
            )
        for addr in self.controller_etcd_endpoints:
            _check_addr("controllerEtcdEndpoints", addr)
        if not self.controller_etcd_prefix.startswith("/"):
            raise _bad("controllerEtcdPrefix", self.controller_etcd_prefix, "must start with /")
        if not 1 <= self.controller_lease_ttl_seconds <= 60:
            raise _bad("controllerLeaseTtlSeconds", self.controller_lease_ttl_seconds, "1..60")
        if not 0 < self.ha_max_time_slave_not_catchup_ms < self.sync_flush_timeout_ms:
            raise _bad(
                "haMaxTimeSlaveNotCatchup",
                self.ha_max_time_slave_not_catchup_ms,
                "must be > 0 and below syncFlushTimeout (a send waiting for a lagging slave "
                "must see it leave the in-sync set before the send times out)",
            )
        if not self.all_ack_in_sync_state_set:
            raise _bad(
                "allAckInSyncStateSet",
                False,
                "controller mode acknowledges only what every in-sync replica has (false would "
                "let a failover lose acknowledged messages; not supported)",
            )
        if self.slave_read_enable:
            raise _bad(
                "slaveReadEnable",
                True,
                "not supported with enableControllerMode (reads are the "
                "master's, up to the confirm offset)",
            )

    @property
    def connection_limits(self) -> ConnectionLimits:
        """The client ports' connection caps and per-connection limits (remoting/caps.py)."""
        return ConnectionLimits(
            connections_max=self.connections_max,
            connections_per_address_max=self.connections_per_address_max,
            in_flight_bytes_max=self.in_flight_bytes_per_connection_max,
            send_wait_ms_max=(
                self.send_queue_wait_ms_max if self.broker_fast_failure_enable else None
            ),
        )

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    @property
    def is_sync_master(self) -> bool:
        return self.broker_role == "SYNC_MASTER"

    @property
    def ha_port(self) -> int:
        """The HA port to bind: haListenPort, else listenPort + 1 (0 when listenPort is 0)."""
        if self.ha_listen_port is not None:
            return self.ha_listen_port
        return self.listen_port + HA_PORT_OFFSET if self.listen_port else 0

    @property
    def vip_port(self) -> int | None:
        """The VIP channel port, or None when disabled or when the main port is chosen at bind."""
        if not self.vip_channel_enabled or self.listen_port == 0:
            return None
        return self.listen_port - VIP_CHANNEL_PORT_OFFSET

    @property
    def delete_when_hours(self) -> tuple[int, ...]:
        return tuple(int(h) for h in self.delete_when.split(";"))

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def is_master(self) -> bool:
        return self.broker_id == MASTER_BROKER_ID and self.broker_role != "SLAVE"


def parse_inner_credentials(text: str) -> Credentials:
    """RocketMQ 5's `{"accessKey":"..","secretKey":".."}`. Errors never quote the value.

    Raises:
        ConfigError: not that JSON object.
    """
    key = "innerClientAuthenticationCredentials"
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(f'{key}: not JSON (expected {{"accessKey":..,"secretKey":..}})') from None
    if not isinstance(value, dict):
        raise ConfigError(f'{key}: expected a JSON object {{"accessKey":..,"secretKey":..}}')
    access_key, secret_key = value.get("accessKey"), value.get("secretKey")
    if not isinstance(access_key, str) or not isinstance(secret_key, str):
        raise ConfigError(f"{key}: needs string fields accessKey and secretKey")
    try:
        return Credentials(access_key, secret_key)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _check_addr(key: str, addr: str) -> None:
    if "," in addr:
        # RocketMQ's separator is ';': "a:1,b:2" would parse as host "a:1,b" and never connect.
        fixed = ";".join(part.strip() for part in addr.split(","))
        raise ConfigError(f"{key}={addr!r}: separate addresses with ';', not ',' ({fixed})")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{key}={addr!r}: expected host:port")
