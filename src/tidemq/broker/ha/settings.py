"""HASettings: the knobs of replication, with RocketMQ's defaults; the broker builds it from
BrokerConfig (haListenPort, haSendHeartbeatInterval, haHousekeepingInterval, haTransferBatchSize,
haMaxGapNotInSync, syncFlushTimeout, and TideMQ's haSecret), and TLS: the master's HA port speaks
what its client ports speak (tls.server.*, `tls`), a slave dials it in TLS with tls.enable
(`client_ssl`)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final

from tidemq.limits import KIB, MESSAGE_PROPERTIES_SIZE_MAX, MIB, TOPIC_NAME_LENGTH_MAX
from tidemq.protocol.ha import FRAME_DATA_SIZE_MAX
from tidemq.protocol.record import RECORD_FIXED_SIZE
from tidemq.security.tls import TlsServerSettings

# Log bytes a slave may be sent beyond what it acknowledged, plus one largest record (a slave
# holding the head of a record must get its end): enough to keep a loopback or LAN link busy
# between two reports, and the most a stalled slave costs the master in buffers.
WINDOW_BYTES: Final = 4 * MIB


def window_bytes(message_size_max: int) -> int:
    """WINDOW_BYTES plus the largest record a store with this maxMessageSize writes."""
    record_max = (
        RECORD_FIXED_SIZE + message_size_max + TOPIC_NAME_LENGTH_MAX + MESSAGE_PROPERTIES_SIZE_MAX
    )
    return WINDOW_BYTES + record_max


@dataclass(frozen=True, slots=True, kw_only=True)
class HASettings:
    secret: bytes
    listen_host: str = "0.0.0.0"  # the master serves slaves on other machines
    listen_port: int = 10912
    # A master with nothing to send sends a heartbeat frame this often; a slave reports its
    # offset at least this often (haSendHeartbeatInterval).
    heartbeat_interval_ms: int = 5_000
    # A peer silent for this long is dropped (haHousekeepingInterval); also the time a
    # connection has to finish its handshake.
    housekeeping_interval_ms: int = 20_000
    # Log bytes per frame (haTransferBatchSize).
    transfer_batch_size: int = 32 * KIB
    # A SYNC send gets SLAVE_NOT_AVAILABLE at once when the best slave is more than this
    # behind its end (haMaxGapNotInSync).
    max_gap_not_in_sync: int = 256 * MIB
    # A SYNC send waits this long for a slave's acknowledgement (syncFlushTimeout).
    sync_timeout_ms: int = 5_000
    # The master's HA port: disabled, permissive or enforcing TLS (None: plaintext).
    tls: TlsServerSettings | None = None
    # A slave's connection to its master's HA port (None: plaintext).
    client_ssl: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        if not self.secret:
            # No secret, no HA: the broker starts no listener and no slave without one (a short
            # secret is the broker config's warning, not an error).
            raise ValueError("haSecret is empty")
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"haListenPort {self.listen_port} outside 0..65535")
        if self.heartbeat_interval_ms <= 0:
            raise ValueError("haSendHeartbeatInterval must be > 0")
        if self.housekeeping_interval_ms <= self.heartbeat_interval_ms:
            # Else a healthy idle peer is dropped between two heartbeats.
            raise ValueError("haHousekeepingInterval must exceed haSendHeartbeatInterval")
        if not 0 < self.transfer_batch_size <= FRAME_DATA_SIZE_MAX:
            raise ValueError(f"haTransferBatchSize outside 1..{FRAME_DATA_SIZE_MAX}")
        if self.max_gap_not_in_sync <= 0:
            raise ValueError("haMaxGapNotInSync must be > 0")
        if self.sync_timeout_ms <= 0:
            raise ValueError("syncFlushTimeout must be > 0")
