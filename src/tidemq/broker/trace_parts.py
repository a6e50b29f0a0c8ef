"""Small parts of the broker's message trace (broker/trace.py), apart to keep that module to
the writer: which groups are not traced, record clean-up, and what the writer reads of a
record and of the producers."""

from __future__ import annotations

import dataclasses
from typing import Final, NamedTuple

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.groups import SYSTEM_GROUPS
from tidemq.protocol import trace as tr
from tidemq.protocol.message import (
    CID_RMQ_SYS_PREFIX,
    CLIENT_INNER_PRODUCER_GROUP,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SYSTEM_TOPIC_PREFIX,
    TBW102,
    is_system_topic,
)

# Consumer groups that browse (admin tools, upstream's system groups, TideMQ's readers).
_UNTRACED_GROUP_PREFIXES: Final = (CID_RMQ_SYS_PREFIX, "TOOLS_CONSUMER", "TIDEMQ_")
_NOT_TRACED_PREFIXES: Final = (
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPIC_PREFIX.upper(),
    RETRY_GROUP_TOPIC_PREFIX,
    DLQ_GROUP_TOPIC_PREFIX,
)


def traced_topics(text: str) -> frozenset[str] | None:
    """brokerTraceTopics: a comma list; empty means every topic that is not a system one."""
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    return names or None


class Head(NamedTuple):
    """A record's fixed fields the writer reads (`BrokerTrace._head`)."""

    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int
    body_length: int


class Producers:
    """Producer group by connection address, built once per writer turn when first asked."""

    def __init__(self, clients: ClientRegistry, senders: dict[tuple[str, int], str]) -> None:
        self._clients = clients
        self._senders = senders
        self._by_peer: dict[tuple[str, int], str] | None = None

    def group_of(self, born_host: tuple[str, int]) -> str:
        sender = self._senders.get(born_host)
        if sender is not None:
            return sender
        if self._by_peer is None:
            self._by_peer = {}
            for group in self._clients.producer_groups():
                if group == CLIENT_INNER_PRODUCER_GROUP:
                    continue
                for channel in self._clients.producer_channels(group):
                    self._by_peer.setdefault(channel.connection.peer, group)
        return self._by_peer.get(born_host, "")


def is_untraced_topic(topic: str) -> bool:
    return is_system_topic(topic) or topic == TBW102 or topic.startswith(_NOT_TRACED_PREFIXES)


def untraced_group(group: str) -> bool:
    """A group whose pulls and commits are not traced: upstream's system groups, the admin
    tools' and TideMQ's readers (they browse; their commits never name a consumed message)."""
    return group in SYSTEM_GROUPS or group.startswith(_UNTRACED_GROUP_PREFIXES)


_TEXT_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(tr.TraceRecord) if f.type in ("str", str)
)


def clean(record: tr.TraceRecord) -> tr.TraceRecord:
    """Separators in any text (keys, tags, ids a client chose) would break the record:
    replaced by spaces."""
    fields: dict[str, str] = {}
    for name in _TEXT_FIELDS:
        value = getattr(record, name)
        if tr.CONTENT_SEPARATOR in value or tr.FIELD_SEPARATOR in value:
            fields[name] = value.replace(tr.CONTENT_SEPARATOR, " ").replace(tr.FIELD_SEPARATOR, " ")
    return dataclasses.replace(record, **fields) if fields else record  # type: ignore[arg-type]
