"""Reserved topic and group names, and the name rules (remoting.md §4.1 step 2, §6.4, §9).

Transactions, delays and retries are built from system topics, so their names are protocol: a
client may read them and the broker must refuse sends to some of them.
"""

from __future__ import annotations

import re
from typing import Final

from tidemq.errors import ProtocolError
from tidemq.limits import GROUP_NAME_LENGTH_MAX, TOPIC_NAME_LENGTH_MAX

# The topic a broker auto-creates other topics from (perm 7, 8 queues).
TBW102: Final = "TBW102"
# Delayed messages wait here, queue = level - 1.
SCHEDULE_TOPIC_XXXX: Final = "SCHEDULE_TOPIC_XXXX"
RMQ_SYS_TRANS_HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
# Half messages checked too often or too old end up here.
TRANS_CHECK_MAX_TIME_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"
# Batch records of the exactly-once Spark sink (TIDEMQ_END_BATCH; broker/transaction/batch.py).
RMQ_SYS_TRANS_BATCH_TOPIC: Final = "RMQ_SYS_TRANS_BATCH_TOPIC"
RMQ_SYS_TRACE_TOPIC: Final = "RMQ_SYS_TRACE_TOPIC"
SELF_TEST_TOPIC: Final = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT: Final = "OFFSET_MOVED_EVENT"
BENCHMARK_TOPIC: Final = "BenchmarkTest"
SYSTEM_TOPIC_PREFIX: Final = "rmq_sys_"

RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX: Final = "%DLQ%"

DEFAULT_PRODUCER_GROUP: Final = "DEFAULT_PRODUCER"
DEFAULT_CONSUMER_GROUP: Final = "DEFAULT_CONSUMER"
CLIENT_INNER_PRODUCER_GROUP: Final = "CLIENT_INNER_PRODUCER"
# The transaction check service's consumer group: its offsets are the check progress.
TRANS_CHECK_GROUP: Final = "CID_RMQ_SYS_TRANS"
CID_RMQ_SYS_PREFIX: Final = "CID_RMQ_SYS_"

MASTER_BROKER_ID: Final = 0

# Sending to these is refused with NO_PERMISSION (Java TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET).
_NOT_ALLOWED_SEND_TOPICS: Final = frozenset(
    {
        SCHEDULE_TOPIC_XXXX,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        RMQ_SYS_TRANS_BATCH_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

_NAME_PATTERN: Final = re.compile(r"[%|a-zA-Z0-9_-]+")


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def group_of_retry_topic(topic: str) -> str | None:
    """The consumer group of "%RETRY%<group>", else None."""
    if not is_retry_topic(topic):
        return None
    return topic[len(RETRY_GROUP_TOPIC_PREFIX) :] or None


def is_system_topic(topic: str) -> bool:
    """True for the system topics clients may not send to (the broker answers NO_PERMISSION)."""
    return topic in _NOT_ALLOWED_SEND_TOPICS


def _validate_name(kind: str, name: str, length_max: int) -> None:
    if not name or not name.strip():
        raise ProtocolError(f"the {kind} name is blank")
    if len(name) > length_max:
        raise ProtocolError(
            f"the {kind} name {name[:32]!r}… is longer than {length_max} characters"
        )
    if not _NAME_PATTERN.fullmatch(name):
        raise ProtocolError(f"the {kind} name {name!r} contains characters outside [%|a-zA-Z0-9_-]")


def validate_topic(name: str) -> None:
    """Raise ProtocolError unless `name` is a legal topic (^[%|a-zA-Z0-9_-]+$, ≤127 chars)."""
    _validate_name("topic", name, TOPIC_NAME_LENGTH_MAX)


def validate_group(name: str) -> None:
    """Raise ProtocolError unless `name` is a legal group name (same characters as topics)."""
    _validate_name("group", name, GROUP_NAME_LENGTH_MAX)
