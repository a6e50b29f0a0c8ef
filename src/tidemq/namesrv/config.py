"""NamesrvConfig: the name server's settings, with units in the names.

RocketMQ's namesrv properties map onto it at the edge (cli): listenPort → listen_port,
kvConfigPath → kv_config_path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tidemq.limits import BROKER_EXPIRY_MS, FRAME_SIZE_MAX
from tidemq.remoting.caps import ConnectionLimits
from tidemq.remoting.inbound import (
    FRAME_COMPLETION_TIMEOUT_MS,
    INCOMPLETE_FRAME_BYTES_MAX,
    frame_bytes_held_max,
)
from tidemq.security.tls import TlsServerSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class NamesrvConfig:
    # As RocketMQ; 0 picks a free port (tests).
    listen_port: int = 9876
    # Where PUT_KV_CONFIG entries persist; None keeps them in memory only.
    kv_config_path: Path | None = None
    # How often silent brokers are looked for (RocketMQ scans every 10 s).
    scan_interval_ms: int = 10_000
    # A broker silent this long is dropped; brokers register every 30 s.
    broker_expiry_ms: int = BROKER_EXPIRY_MS
    # Bytes incomplete frames may hold across all connections, and how long one frame may take
    # to arrive (remoting/inbound.py): what hostile clients can pin.
    incomplete_frame_bytes_max: int = INCOMPLETE_FRAME_BYTES_MAX
    frame_completion_timeout_ms: int = FRAME_COMPLETION_TIMEOUT_MS
    # Connections served in all and per remote address (remoting/caps.py; 0: no cap), and each
    # connection's in-flight bytes bound: `tidemq namesrv --max-connections ...`.
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # plain_acl.yml (RocketMQ's format): when set, REGISTER_BROKER, UNREGISTER_BROKER and the
    # other writes need an admin account's signature (namesrv/access.py); None: no ACL.
    acl_file: Path | None = None
    # TLS on the port (security/tls.py): disabled, permissive or enforcing; None: plaintext.
    tls: TlsServerSettings | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.listen_port < 65536:
            raise ValueError(f"listen_port {self.listen_port} out of range")
        if self.scan_interval_ms <= 0:
            raise ValueError("scan_interval_ms must be positive")
        if self.broker_expiry_ms < self.scan_interval_ms:
            raise ValueError("broker_expiry_ms must be at least scan_interval_ms")
        if self.incomplete_frame_bytes_max < frame_bytes_held_max(FRAME_SIZE_MAX):
            raise ValueError("incomplete_frame_bytes_max must hold at least one maximal frame")
        if self.frame_completion_timeout_ms <= 0:
            raise ValueError("frame_completion_timeout_ms must be positive")
