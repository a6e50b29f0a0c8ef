"""The broker.conf key table: each RocketMQ key, the BrokerConfig field it sets, how its value
parses and renders, and the comment it gets in conf/broker.example.conf.

Kept apart from config.py, which owns the settings (the dataclass and its checks), and from
config_file.py, the layered loader: this table changes whenever a setting is added, the loader
does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tidemq.broker.properties import parse_bool


def parse_int(text: str) -> int:
    return int(text.strip().replace("_", ""), 10)


def _parse_float(text: str) -> float:
    return float(text.strip())


def _parse_str(text: str) -> str:
    return text.strip()


def parse_path(text: str) -> Path:
    stripped = text.strip()
    if not stripped:
        raise ValueError("empty path")
    return Path(stripped).expanduser()


def _parse_addrs(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(";") if part.strip())


def _parse_upper(text: str) -> str:
    return text.strip().upper()


def _render_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse_optional_port(text: str) -> int | None:
    stripped = text.strip()
    return parse_int(stripped) if stripped else None


def _parse_optional_path(text: str) -> Path | None:
    return parse_path(text) if text.strip() else None


def _render_optional(value: object) -> str:
    return "" if value is None else str(value)


# What a set secret renders as: GET_BROKER_CONFIG (26) answers any client, and --print-config
# output ends up in tickets and logs.
SECRET_REDACTED: Final = "<redacted>"


def _render_secret(value: object) -> str:
    return SECRET_REDACTED if value else ""


def _render_addrs(value: object) -> str:
    assert isinstance(value, tuple)
    return ";".join(value)


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str  # the RocketMQ key, as rendered
    field: str  # the BrokerConfig field
    parse: Callable[[str], Any]
    comment: str
    aliases: tuple[str, ...] = ()
    render: Callable[[object], str] = _render_default


KEYS: Final[tuple[ConfigKey, ...]] = (
    ConfigKey(
        "brokerClusterName", "broker_cluster_name", _parse_str, "Cluster this broker belongs to."
    ),
    ConfigKey("brokerName", "broker_name", _parse_str, "Name shared by a master and its slaves."),
    ConfigKey(
        "brokerId",
        "broker_id",
        parse_int,
        "0 = master; a SLAVE needs an id >= 1 (its place in brokerAddrs of the routes).",
    ),
    ConfigKey(
        "brokerRole",
        "broker_role",
        _parse_upper,
        "ASYNC_MASTER (answer after the local write) | SYNC_MASTER (answer once a slave has the"
        " message) | SLAVE (copies its master; refuses writes).",
    ),
    ConfigKey(
        "namesrvAddr",
        "namesrv_addrs",
        _parse_addrs,
        "Name servers, host:port separated by ';'. Empty: do not register.",
        render=_render_addrs,
    ),
    ConfigKey("listenHost", "listen_host", _parse_str, "Address to bind (TideMQ extension)."),
    ConfigKey(
        "listenPort",
        "listen_port",
        parse_int,
        "Client port; 0 picks a free port. The broker also binds listenPort-2 (the VIP channel,"
        " unless vipChannelEnabled=false) and, with haSecret, listenPort+1 (HA; haListenPort"
        " moves it).",
    ),
    ConfigKey(
        "vipChannelEnabled",
        "vip_channel_enabled",
        parse_bool,
        "Also listen on listenPort-2 (Java 4.4/4.5 clients send there by default).",
    ),
    ConfigKey(
        "brokerIP1",
        "broker_ip",
        _parse_str,
        "IPv4 address advertised to clients and written into stored messages (storeHost).",
    ),
    ConfigKey(
        "storePathRootDir",
        "store_path_root_dir",
        parse_path,
        "Store directory: commitlog/, consumequeue/, index/, config/ (default ~/store).",
    ),
    ConfigKey(
        "flushDiskType",
        "flush_disk_type",
        _parse_upper,
        "ASYNC_FLUSH (flush every flushIntervalCommitLog) | SYNC_FLUSH (ack after fsync).",
    ),
    ConfigKey(
        "mappedFileSizeCommitLog",
        "commit_log_file_size",
        parse_int,
        "Bytes per commit-log segment file.",
        aliases=("mapedFileSizeCommitLog",),
    ),
    ConfigKey(
        "autoCreateTopicEnable",
        "auto_create_topic_enable",
        parse_bool,
        "Create unknown topics on first send (registers TBW102; needed by the C++ client).",
    ),
    ConfigKey(
        "defaultTopicQueueNums",
        "default_topic_queue_nums",
        parse_int,
        "Queues of TBW102, the template for auto-created topics.",
    ),
    ConfigKey(
        "autoCreateSubscriptionGroup",
        "auto_create_subscription_group",
        parse_bool,
        "Create unknown consumer groups on first use.",
    ),
    ConfigKey(
        "longPollingEnable", "long_polling_enable", parse_bool, "Hold empty pulls until data."
    ),
    ConfigKey(
        "shortPollingTimeMills",
        "short_polling_ms",
        parse_int,
        "Hold time (ms) of an empty pull when long polling is off.",
    ),
    ConfigKey("flushIntervalCommitLog", "flush_interval_ms", parse_int, "ASYNC_FLUSH period (ms)."),
    ConfigKey(
        "syncFlushTimeout",
        "sync_flush_timeout_ms",
        parse_int,
        "SYNC_FLUSH: answer FLUSH_DISK_TIMEOUT after this many ms (the message stays stored).",
    ),
    ConfigKey(
        "flushConsumerOffsetInterval",
        "consumer_offset_persist_interval_ms",
        parse_int,
        "Period (ms) for writing config/consumerOffset.json.",
    ),
    ConfigKey(
        "registerNameServerPeriod",
        "register_interval_ms",
        parse_int,
        "Period (ms) of re-registration with every name server.",
    ),
    ConfigKey(
        "registerBrokerTimeoutMills",
        "register_timeout_ms",
        parse_int,
        "Timeout (ms) of one REGISTER_BROKER request.",
    ),
    ConfigKey(
        "channelExpiredTimeout",
        "client_expiry_ms",
        parse_int,
        "Drop a producer/consumer registration after this many ms without a heartbeat.",
    ),
    ConfigKey(
        "cleanResourceInterval",
        "cleanup_interval_ms",
        parse_int,
        "Period (ms) of the expired-file check.",
    ),
    ConfigKey(
        "fileReservedTime",
        "file_reserved_time_hours",
        _parse_float,
        "Hours a commit-log file is kept after its last write.",
    ),
    ConfigKey(
        "deleteWhen", "delete_when", _parse_str, "Hour(s) of day to delete expired files, 04;16."
    ),
    ConfigKey(
        "diskMaxUsedSpaceRatio",
        "disk_max_used_space_ratio_percent",
        parse_int,
        "Refuse writes (and delete early) above this disk usage, percent.",
    ),
    ConfigKey("maxMessageSize", "max_message_size", parse_int, "Largest message body, bytes."),
    ConfigKey(
        "maxConnections",
        "connections_max",
        parse_int,
        "Connections served at once on the client ports; one more is closed at accept, with a"
        " log line (TideMQ extension; 0 = no cap).",
    ),
    ConfigKey(
        "maxConnectionsPerAddress",
        "connections_per_address_max",
        parse_int,
        "Of those, from one remote address (TideMQ extension; 0 = no cap).",
    ),
    ConfigKey(
        "maxInFlightBytesPerConnection",
        "in_flight_bytes_per_connection_max",
        parse_int,
        "Body bytes of one connection's requests being handled before the broker reads no more"
        " of its requests (backpressure, not a refusal; TideMQ extension; 0 = no bound).",
    ),
    ConfigKey(
        "brokerFastFailureEnable",
        "broker_fast_failure_enable",
        parse_bool,
        "Answer SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] to a send that waited waitTimeMillsInSendQueue"
        " before the broker could start it; the producer retries it elsewhere.",
    ),
    ConfigKey(
        "waitTimeMillsInSendQueue",
        "send_queue_wait_ms_max",
        parse_int,
        "How long a send may wait in its connection's queue, ms (brokerFastFailureEnable).",
    ),
    ConfigKey(
        "brokerPermission",
        "broker_permission",
        parse_int,
        "6 = read+write, 4 = read only, 2 = write only.",
    ),
    ConfigKey(
        "rejectTransactionMessage",
        "reject_transaction_message",
        parse_bool,
        "Refuse transactional (half) messages with NO_PERMISSION.",
    ),
    ConfigKey(
        "transactionTimeOut",
        "transaction_timeout_ms",
        parse_int,
        "A half message becomes eligible for check-back after this many ms.",
    ),
    ConfigKey(
        "transactionCheckMax",
        "transaction_check_max",
        parse_int,
        "Check-backs that reached a producer, per half message, before it is discarded.",
    ),
    ConfigKey(
        "transactionCheckInterval",
        "transaction_check_interval_ms",
        parse_int,
        "Period (ms) of the transaction check-back scan.",
    ),
    ConfigKey(
        "transactionUnreachedCheckMax",
        "transaction_unreached_check_max",
        parse_int,
        "Check passes finding no live producer of the group (not counted in"
        " transactionCheckMax) before a half message is discarded anyway (TideMQ extension).",
    ),
    ConfigKey(
        "sparkOrphanTimeoutHours",
        "spark_orphan_timeout_hours",
        _parse_float,
        "Hours after which a Spark sink half message no batch record resolves is rolled back.",
    ),
    ConfigKey(
        "messageDelayLevel", "message_delay_level", _parse_str, "Delay levels 1..N (s m h d)."
    ),
    ConfigKey("timerMaxDelaySec", "timer_max_delay_sec", parse_int, "Latest TIMER_DELIVER_MS, s."),
    ConfigKey("enablePropertyFilter", "enable_property_filter", parse_bool, "Allow SQL92 filters."),
    ConfigKey("traceTopicEnable", "trace_topic_enable", parse_bool, "Create the trace topic."),
    ConfigKey("msgTraceTopicName", "msg_trace_topic_name", _parse_str, "Topic of trace records."),
    ConfigKey(
        "brokerTraceEnable",
        "broker_trace_enable",
        parse_bool,
        "Write message trace records from the broker (TideMQ extension; docs/operations.md).",
    ),
    ConfigKey(
        "brokerTraceTopics",
        "broker_trace_topics",
        _parse_str,
        "Comma list of traced topics; empty: every non-system topic (TideMQ extension).",
    ),
    ConfigKey(
        "corruptPolicy",
        "corrupt_policy",
        _parse_str,
        "refuse | quarantine: commit-log corruption other than a torn tail stops the start, or"
        " moves the damaged segments to <root>/quarantine/.",
    ),
    ConfigKey(
        "commitLogResidentBytes",
        "commit_log_resident_bytes",
        parse_int,
        "Commit-log bytes behind the write position kept in the broker's memory (RSS) for tail"
        " readers; older pages are released to the page cache once flushed (TideMQ extension).",
    ),
    ConfigKey(
        "haListenPort",
        "ha_listen_port",
        _parse_optional_port,
        "Master: port slaves replicate from. Empty: listenPort+1 (a free port if listenPort=0).",
        render=_render_optional,
    ),
    ConfigKey(
        "haSecret",
        "ha_secret",
        _parse_str,
        "Shared secret of a master and its slaves (HMAC-authenticated handshake, both ways)."
        " Required for SYNC_MASTER and SLAVE; an ASYNC_MASTER without one accepts no slaves"
        " (TideMQ extension).",
        render=_render_secret,
    ),
    ConfigKey(
        "haSendHeartbeatInterval",
        "ha_send_heartbeat_interval_ms",
        parse_int,
        "Replication heartbeat period (ms) of an idle master and a slave's offset reports.",
    ),
    ConfigKey(
        "haHousekeepingInterval",
        "ha_housekeeping_interval_ms",
        parse_int,
        "Drop a replication peer silent for this many ms.",
    ),
    ConfigKey(
        "haTransferBatchSize",
        "ha_transfer_batch_size",
        parse_int,
        "Most commit-log bytes in one replication frame.",
    ),
    ConfigKey(
        "haMaxGapNotInSync",
        "ha_max_gap_not_in_sync",
        parse_int,
        "SYNC_MASTER: a slave further behind (bytes) does not count; with no slave in sync a send"
        " answers SLAVE_NOT_AVAILABLE at once (the message stays stored).",
    ),
    ConfigKey(
        "slaveReadEnable",
        "slave_read_enable",
        parse_bool,
        "Master: steer consumers reading far behind the log's end to the slave.",
    ),
    ConfigKey(
        "accessMessageInMemoryMaxRatio",
        "access_message_in_memory_max_ratio_percent",
        parse_int,
        "slaveReadEnable: 'far behind' is more than this percent of physical memory.",
    ),
    ConfigKey(
        "slaveSyncIntervalMs",
        "slave_sync_interval_ms",
        parse_int,
        "Slave: period (ms) of copying topics, groups, consumer offsets and delay progress from"
        " the master (TideMQ extension; upstream copies every 10 s).",
    ),
    ConfigKey(
        "enableControllerMode",
        "enable_controller_mode",
        parse_bool,
        "Automatic failover: the group's master, epoch and in-sync set are kept in etcd; the"
        " role is the controller's (brokerRole may not be set; brokerId >= 1 is the replica's id).",
    ),
    ConfigKey(
        "controllerEtcdEndpoints",
        "controller_etcd_endpoints",
        _parse_addrs,
        "Controller mode: etcd client endpoints, host:port separated by ';' (TideMQ extension).",
        render=_render_addrs,
    ),
    ConfigKey(
        "controllerEtcdPrefix",
        "controller_etcd_prefix",
        _parse_str,
        "Controller mode: the etcd key prefix of this cluster's groups (TideMQ extension).",
    ),
    ConfigKey(
        "controllerLeaseTtlSeconds",
        "controller_lease_ttl_seconds",
        parse_int,
        "Controller mode: a broker's etcd lease; a master that cannot renew it stops"
        " acknowledging before a successor can be elected (TideMQ extension).",
    ),
    ConfigKey(
        "haMaxTimeSlaveNotCatchup",
        "ha_max_time_slave_not_catchup_ms",
        parse_int,
        "Controller mode: a slave behind the master's log end for this many ms leaves the"
        " in-sync set (sends stop waiting for it); it rejoins once caught up.",
    ),
    ConfigKey(
        "allAckInSyncStateSet",
        "all_ack_in_sync_state_set",
        parse_bool,
        "Controller mode: a send is acknowledged once every in-sync replica has it (only true).",
    ),
    ConfigKey(
        "aclEnable",
        "acl_enable",
        parse_bool,
        "Check every request's signature and permissions against aclFilePath (RocketMQ's plain"
        " ACL; docs/security.md).",
    ),
    ConfigKey(
        "aclFilePath",
        "acl_file_path",
        _parse_optional_path,
        "The plain_acl.yml of aclEnable, reloaded when it changes. Empty: plain_acl.yml beside"
        " the broker.conf file (TideMQ extension).",
        render=_render_optional,
    ),
    ConfigKey(
        "innerClientAuthenticationCredentials",
        "inner_client_authentication_credentials",
        _parse_str,
        'What the broker signs its own requests with, {"accessKey":"..","secretKey":".."}: an'
        " admin account of the name servers' and the master's ACL files. Required with aclEnable"
        " on a SLAVE.",
        render=_render_secret,
    ),
    ConfigKey(
        "tls.server.mode",
        "tls_server_mode",
        _parse_str,
        "disabled | permissive (TLS and plaintext on one port, by the first byte) | enforcing"
        " (TLS only). Empty: enforcing with tls.server.need.client.auth=require, else permissive"
        " when tls.server.certPath and keyPath are set, else disabled.",
    ),
    ConfigKey(
        "tls.server.certPath",
        "tls_server_cert_path",
        _parse_optional_path,
        "PEM certificate (chain) of the client ports.",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.server.keyPath",
        "tls_server_key_path",
        _parse_optional_path,
        "PEM private key of tls.server.certPath.",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.server.keyPassword",
        "tls_server_key_password",
        _parse_str,
        "Password of an encrypted tls.server.keyPath.",
        render=_render_secret,
    ),
    ConfigKey(
        "tls.server.need.client.auth",
        "tls_server_need_client_auth",
        _parse_str,
        "Client certificates (mutual TLS): none | optional | require; verified against"
        " tls.server.trustCertPath. require needs tls.server.mode=enforcing (its default).",
    ),
    ConfigKey(
        "tls.server.trustCertPath",
        "tls_server_trust_cert_path",
        _parse_optional_path,
        "PEM CA certificates client certificates are verified against.",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.enable",
        "tls_enable",
        parse_bool,
        "The broker's own connections (to name servers, a slave's to its master, the HA link)"
        " use TLS with tls.client.*.",
    ),
    ConfigKey(
        "tls.client.certPath",
        "tls_client_cert_path",
        _parse_optional_path,
        "PEM client certificate the broker shows when a server asks (mutual TLS).",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.client.keyPath",
        "tls_client_key_path",
        _parse_optional_path,
        "PEM private key of tls.client.certPath.",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.client.keyPassword",
        "tls_client_key_password",
        _parse_str,
        "Password of an encrypted tls.client.keyPath.",
        render=_render_secret,
    ),
    ConfigKey(
        "tls.client.trustCertPath",
        "tls_client_trust_cert_path",
        _parse_optional_path,
        "PEM CA certificates servers are verified against. Empty: the system's CA store.",
        render=_render_optional,
    ),
    ConfigKey(
        "tls.client.authServer",
        "tls_client_auth_server",
        parse_bool,
        "Verify the server's certificate and its name or IP address (upstream's default is"
        " false; TideMQ's is true).",
    ),
    ConfigKey(
        "metricsExporterType",
        "metrics_exporter_type",
        _parse_upper,
        "DISABLE | PROM: serve Prometheus metrics over HTTP (docs/operations.md). Upstream's"
        " OTLP_GRPC and LOG are refused.",
    ),
    ConfigKey(
        "metricsPromExporterHost",
        "metrics_prom_exporter_host",
        _parse_str,
        "Address the PROM exporter listens on. Empty: brokerIP1 (as upstream); 0.0.0.0: all.",
    ),
    ConfigKey(
        "metricsPromExporterPort",
        "metrics_prom_exporter_port",
        parse_int,
        "Port of the PROM exporter (GET /metrics).",
    ),
)
