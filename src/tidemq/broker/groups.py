"""Subscription group configs: per consumer group, whether it may consume and how it retries.

Persisted as `<root>/config/subscriptionGroup.json` in RocketMQ's shape (remoting.md §7):

    {"dataVersion":{"counter":N,"timestamp":T},
     "subscriptionGroupTable":{"G":{"groupName":"G","consumeEnable":true,"consumeFromMinEnable":true,
        "consumeBroadcastEnable":true,"retryQueueNums":1,"retryMaxTimes":16,"brokerId":0,
        "whichBrokerWhenConsumeSlowly":1,"notifyConsumerIdsChangedEnable":true}}}

A group is created with those defaults the first time it heartbeats or sends back, when
autoCreateSubscriptionGroup is on (RocketMQ's default); otherwise only admin-created groups exist
and the others get SUBSCRIPTION_GROUP_NOT_EXIST. A pull only looks (`lookup`): it is served with
the defaults but creates nothing, so a stream of pulls with made-up names cannot grow the table.
At most GROUPS_MAX groups are auto-created.

Upstream's system groups (SYSTEM_GROUPS, which its SubscriptionGroupManager creates at start)
always exist here: a lookup or heartbeat of one gets the defaults even when
autoCreateSubscriptionGroup is off, so the tools' reads (Admin.query_messages_by_time, the
console's message pages: pulls as TOOLS_CONSUMER) work on any broker. Unlike upstream they are
not stored, so they are not listed by GET_ALL_SUBSCRIPTIONGROUP_CONFIG nor written to the file
(until an admin puts one), and they do not count against GROUPS_MAX.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from tidemq.broker.persist import ConfigWriter, read_optional
from tidemq.clock import Clock
from tidemq.errors import ProtocolError

log = logging.getLogger(__name__)

GROUPS_FILE: Final = "subscriptionGroup.json"
# RocketMQ's default: a message is retried 16 times before it goes to the dead-letter queue.
RETRY_MAX_TIMES_DEFAULT: Final = 16
# Subscription groups the table holds before auto-creation stops (admin puts still work). Real
# clusters have hundreds; the bound keeps a client inventing names from growing the table and
# the persisted file without limit.
GROUPS_MAX: Final = 10_000

# Upstream's SubscriptionGroupManager creates these at start (MixAll's group names): the admin
# tools' consumer, the filter server's, the self-test group, the ONS proxy and API groups, and
# the transaction checker's.
SYSTEM_GROUPS: Final = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_RMQ_SYS_TRANS",
)
_SYSTEM: Final = frozenset(SYSTEM_GROUPS)

_WIRE_NAMES: Final = (
    ("group_name", "groupName"),
    ("consume_enable", "consumeEnable"),
    ("consume_from_min_enable", "consumeFromMinEnable"),
    ("consume_broadcast_enable", "consumeBroadcastEnable"),
    ("retry_queue_nums", "retryQueueNums"),
    ("retry_max_times", "retryMaxTimes"),
    ("broker_id", "brokerId"),
    ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly"),
    ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable"),
)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = RETRY_MAX_TIMES_DEFAULT
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {wire: getattr(self, name) for name, wire in _WIRE_NAMES}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        kwargs: dict[str, Any] = {}
        for name, wire in _WIRE_NAMES:
            if wire not in data:
                continue
            value = data[wire]
            default = getattr(cls, name, None)
            if name == "group_name":
                kwargs[name] = str(value)
            elif isinstance(default, bool):
                kwargs[name] = value in (True, "true", "1", 1)
            else:
                kwargs[name] = int(value)
        if "group_name" not in kwargs:
            raise ProtocolError("subscription group config without groupName")
        return cls(**kwargs)


def decode_groups(
    data: bytes, timestamp_default_ms: int
) -> tuple[dict[str, SubscriptionGroupConfig], int, int]:
    """The groups, data version counter and timestamp of a subscriptionGroup.json document.

    Raises:
        ProtocolError: `data` is not a subscription group table.
    """
    try:
        doc = orjson.loads(data)
        table = doc.get("subscriptionGroupTable") or {}
        groups = {str(name): SubscriptionGroupConfig.from_dict(v) for name, v in table.items()}
        version = doc.get("dataVersion") or {}
        counter = int(version.get("counter", 0))
        timestamp_ms = int(version.get("timestamp", timestamp_default_ms))
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, ProtocolError) as exc:
        raise ProtocolError(f"not a subscription group table: {exc}") from exc
    return groups, counter, timestamp_ms


class SubscriptionGroupTable:
    """Group configs by name, persisted on each change."""

    def __init__(
        self, config_dir: Path, clock: Clock, *, auto_create: bool, groups_max: int = GROUPS_MAX
    ) -> None:
        self._path = config_dir / GROUPS_FILE
        self._writer = ConfigWriter(self._path)
        self._clock = clock
        self._auto_create = auto_create
        self._groups_max = groups_max
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._counter = 0
        self._timestamp_ms = clock.now_ms()

    def load(self) -> None:
        data = read_optional(self._path)
        if data is None:
            return
        try:
            groups, self._counter, self._timestamp_ms = decode_groups(data, self._timestamp_ms)
        except ProtocolError as exc:
            raise ProtocolError(f"{self._path}: {exc}") from exc
        self._groups.update(groups)
        log.info("loaded %d subscription groups from %s", len(groups), self._path)

    def replace_all(self, data: bytes) -> bool:
        """A slave: take the master's whole table (GET_ALL_SUBSCRIPTIONGROUP_CONFIG's body) and
        data version. Returns False, changing nothing, when the version is the one held already.

        Raises:
            ProtocolError: `data` is not a subscription group table (nothing changes).
        """
        groups, counter, timestamp_ms = decode_groups(data, self._timestamp_ms)
        if (counter, timestamp_ms) == (self._counter, self._timestamp_ms):
            return False
        self._groups = groups
        self._counter, self._timestamp_ms = counter, timestamp_ms
        log.info("subscription groups copied from the master (data version %d)", counter)
        self._writer.submit(self._snapshot())
        return True

    def to_json(self) -> bytes:
        """The table and its data version, as GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) answers."""
        return self._snapshot()

    def _snapshot(self) -> bytes:
        doc = {
            "dataVersion": {"counter": self._counter, "timestamp": self._timestamp_ms},
            "subscriptionGroupTable": {n: g.to_dict() for n, g in sorted(self._groups.items())},
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    def persist(self) -> None:
        """Write the table now, on this thread."""
        self._writer.write(self._snapshot())

    async def flush(self) -> None:
        """Finish the background write of the latest change (shutdown)."""
        await self._writer.flush()

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults when auto-create is on, else None."""
        existing = self._groups.get(group)
        if existing is None and group in _SYSTEM:
            return SubscriptionGroupConfig(group_name=group)
        if existing is not None or not self._auto_create:
            return existing
        if len(self._groups) >= self._groups_max:
            log.warning("%d subscription groups: not auto-creating %s", len(self._groups), group)
            return None
        config = SubscriptionGroupConfig(group_name=group)
        self._groups[group] = config
        self._changed(f"subscription group {group} auto-created")
        return config

    def lookup(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, or (auto-create on, or a system group) the defaults without
        storing them."""
        existing = self._groups.get(group)
        if existing is not None or not (self._auto_create or group in _SYSTEM):
            return existing
        return SubscriptionGroupConfig(group_name=group)

    def put(self, config: SubscriptionGroupConfig) -> None:
        if self._groups.get(config.group_name) == config:
            return
        self._groups[config.group_name] = config
        self._changed(f"subscription group {config.group_name} set")

    def delete(self, group: str) -> bool:
        if self._groups.pop(group, None) is None:
            return False
        self._changed(f"subscription group {group} deleted")
        return True

    def snapshot(self) -> dict[str, SubscriptionGroupConfig]:
        return dict(self._groups)

    def _changed(self, what: str) -> None:
        self._counter += 1
        self._timestamp_ms = max(self._clock.now_ms(), self._timestamp_ms)
        log.info("%s", what)
        self._writer.submit(self._snapshot())  # the fsync runs off the event loop
