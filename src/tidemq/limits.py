"""Named limits, each with its unit and its reason.

Relationships between limits are asserted at import, so an edit that breaks one fails at once.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB

# As RocketMQ's maxMessageSize; larger payloads belong in object storage.
MESSAGE_BODY_SIZE_MAX: Final = 4 * MIB
# The stored record keeps the properties length in a signed 16-bit field.
MESSAGE_PROPERTIES_SIZE_MAX: Final = 32_767
# The stored record keeps the topic length in one signed byte.
TOPIC_NAME_LENGTH_MAX: Final = 127
# Group names share the topic name rules (a group's retry topic is "%RETRY%" + group).
GROUP_NAME_LENGTH_MAX: Final = 120
# Header cap: extFields are small maps. A bigger header inside a well-formed frame is decoded
# (the frame cap bounds the cost) and answered, not served (remoting/inbound.py): in a send it
# means properties far over MESSAGE_PROPERTIES_SIZE_MAX.
FRAME_HEADER_SIZE_MAX: Final = 1 * MIB
# As Java's com.rocketmq.remoting.frameMaxLength. A batch of many messages must still fit.
FRAME_SIZE_MAX: Final = 16 * MIB
# A pull answers at most this many messages, whatever maxMsgNums asks (Java caps at 32 for push).
PULL_MESSAGE_COUNT_MAX: Final = 256
# And at most this many bytes of bodies, so one pull cannot pin a large buffer.
PULL_BYTES_MAX: Final = 4 * MIB + 256 * KIB

# Commit-log segment size (RocketMQ default); tests use tiny segments to cross rollovers.
COMMIT_LOG_FILE_SIZE_DEFAULT: Final = 1 * GIB
# 300,000 entries of 20 bytes, as RocketMQ.
CONSUME_QUEUE_ENTRY_SIZE: Final = 20
CONSUME_QUEUE_FILE_ENTRIES_DEFAULT: Final = 300_000

# Client-side: how long a producer waits for a send, as RocketMQ's sendMsgTimeout.
SEND_TIMEOUT_MS_DEFAULT: Final = 3_000
# Long-poll hold for push consumers; must stay under the client's pull timeout.
PULL_SUSPEND_MS_DEFAULT: Final = 15_000
PULL_TIMEOUT_MS_DEFAULT: Final = 30_000

# Brokers re-register every 30 s; a name server drops one silent for 120 s.
BROKER_REGISTER_INTERVAL_MS: Final = 30_000
BROKER_EXPIRY_MS: Final = 120_000
# Clients heartbeat every 30 s; a broker drops one silent for 120 s.
CLIENT_HEARTBEAT_INTERVAL_MS: Final = 30_000
CLIENT_EXPIRY_MS: Final = 120_000
# An orderly consumer's queue lock lives this long after its last renewal.
QUEUE_LOCK_EXPIRY_MS: Final = 60_000

assert FRAME_SIZE_MAX > MESSAGE_BODY_SIZE_MAX + FRAME_HEADER_SIZE_MAX
assert PULL_BYTES_MAX >= MESSAGE_BODY_SIZE_MAX  # one maximal message must fit in one pull
assert PULL_SUSPEND_MS_DEFAULT < PULL_TIMEOUT_MS_DEFAULT
assert BROKER_EXPIRY_MS >= 3 * BROKER_REGISTER_INTERVAL_MS
assert CLIENT_EXPIRY_MS >= 3 * CLIENT_HEARTBEAT_INTERVAL_MS
