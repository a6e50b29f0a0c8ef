"""The broker's topic table: which topics exist here, their queue counts and permissions.

Persisted as `<root>/config/topics.json` in RocketMQ's shape (remoting.md §7), which is also the
`topicConfigSerializeWrapper` the broker sends to name servers:

    {"dataVersion":{"counter":N,"timestamp":T},
     "topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",
                              "topicName":"T","topicSysFlag":0,"writeQueueNums":4}}}

Every change bumps the DataVersion (counter + 1, timestamp = now), persists the file and calls the
change listeners; the registration service listens and re-registers at once, because a name server
only rebuilds a broker's queue data when the version moved.

Auto-creation (§4.1 step 3): an unknown topic is created from the request's default topic when that
topic exists and carries the INHERIT bit — TBW102 is registered with perm 7 when
autoCreateTopicEnable is on. The new topic gets min(requested, default's write queues) queues and
the default's perm without INHERIT. Retry topics (`%RETRY%<group>`) are created with the group's
retry queue count and perm 6 whatever the template says.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tidemq.broker.persist import ConfigWriter, read_optional
from tidemq.clock import Clock
from tidemq.errors import ProtocolError
from tidemq.protocol.bodies import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from tidemq.protocol.message import (
    OFFSET_MOVED_EVENT,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC_XXXX,
    SELF_TEST_TOPIC,
    TBW102,
    Perm,
)

log = logging.getLogger(__name__)

TOPICS_FILE: Final = "topics.json"
# RocketMQ's per-broker topics; a (cluster|broker)-named topic doubles as an auto-create template.
_BROKER_TOPIC_QUEUE_NUMS: Final = 1
_CLUSTER_TOPIC_QUEUE_NUMS: Final = 16
# One consume queue per delay level (remoting.md §9).
SCHEDULE_TOPIC_QUEUE_NUMS: Final = 18
PERM_DEFAULT: Final = int(Perm.READ | Perm.WRITE)
PERM_TEMPLATE: Final = int(Perm.READ | Perm.WRITE | Perm.INHERIT)
# A topic can have at most this many queues (a wrong admin command should not make 2^31 files).
TOPIC_QUEUE_NUMS_MAX: Final = 1024

ChangeListener = Callable[[], None]


class TopicTable:
    """Topic configs by name, persisted on each change. Single-threaded (the event loop)."""

    def __init__(
        self,
        config_dir: Path,
        clock: Clock,
        *,
        cluster_name: str,
        broker_name: str,
        auto_create_topic_enable: bool,
        default_topic_queue_nums: int,
        reply_topic_enable: bool = True,
    ) -> None:
        self._path = config_dir / TOPICS_FILE
        self._writer = ConfigWriter(self._path)
        self._clock = clock
        self._auto_create = auto_create_topic_enable
        self._topics: dict[str, TopicConfig] = {}
        self._version = DataVersion(timestamp=clock.now_ms(), counter=0)
        self._listeners: list[ChangeListener] = []
        self._system_topics: set[str] = set()
        self._add_system(SELF_TEST_TOPIC, 1, PERM_DEFAULT)
        if auto_create_topic_enable:
            self._add_system(TBW102, default_topic_queue_nums, PERM_TEMPLATE)
        self._add_system(cluster_name, _CLUSTER_TOPIC_QUEUE_NUMS, PERM_TEMPLATE)
        self._add_system(broker_name, _BROKER_TOPIC_QUEUE_NUMS, PERM_TEMPLATE)
        self._add_system(OFFSET_MOVED_EVENT, 1, PERM_DEFAULT)
        self._add_system(SCHEDULE_TOPIC_XXXX, SCHEDULE_TOPIC_QUEUE_NUMS, PERM_DEFAULT)
        if reply_topic_enable:
            self._add_system(f"{cluster_name}_REPLY_TOPIC", 1, PERM_DEFAULT)

    def _add_system(self, name: str, queue_nums: int, perm: int) -> None:
        self._topics[name] = TopicConfig(
            topic_name=name, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm
        )
        self._system_topics.add(name)

    # -- persistence -------------------------------------------------------------------------

    def load(self) -> None:
        """Merge topics.json over the built-in topics (the file wins, as in RocketMQ)."""
        data = read_optional(self._path)
        if data is None:
            log.info("no %s yet; starting with %d built-in topics", self._path, len(self._topics))
            return
        try:
            wrapper = TopicConfigSerializeWrapper.from_json(data)
        except ProtocolError as exc:
            raise ProtocolError(f"{self._path}: {exc}") from exc
        self._topics.update(wrapper.topic_config_table)
        self._version = wrapper.data_version
        if not self._auto_create and TBW102 in self._topics:
            # Left over from a run with auto-create on; keep it but stop it acting as a template.
            tbw = self._topics[TBW102]
            self._topics[TBW102] = dataclasses.replace(tbw, perm=tbw.perm & ~int(Perm.INHERIT))
        log.info("loaded %d topics from %s", len(self._topics), self._path)

    def persist(self) -> None:
        """Write the table now, on this thread."""
        self._writer.write(self.wrapper().to_json())

    async def flush(self) -> None:
        """Finish the background write of the latest change (shutdown)."""
        await self._writer.flush()

    # -- reads -------------------------------------------------------------------------------

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def names(self) -> list[str]:
        return sorted(self._topics)

    def snapshot(self) -> dict[str, TopicConfig]:
        return dict(self._topics)

    @property
    def data_version(self) -> DataVersion:
        return self._version

    def wrapper(self) -> TopicConfigSerializeWrapper:
        """The table as sent to name servers and written to topics.json."""
        return TopicConfigSerializeWrapper(
            topic_config_table=dict(self._topics), data_version=self._version
        )

    def is_system_topic(self, topic: str) -> bool:
        return topic in self._system_topics

    # -- writes ------------------------------------------------------------------------------

    def add_change_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def put(self, config: TopicConfig) -> bool:
        """Create or replace a topic. Returns False (and changes nothing) if it is identical."""
        _check_queue_nums(config.read_queue_nums, config.write_queue_nums)
        if self._topics.get(config.topic_name) == config:
            return False
        self._topics[config.topic_name] = config
        self._changed(f"topic {config.topic_name} set to {config}")
        return True

    def replace_all(self, wrapper: TopicConfigSerializeWrapper) -> bool:
        """A slave: take the master's whole table and data version (slave_sync.py). Returns
        False, changing nothing, when the version is the one held already."""
        if wrapper.data_version == self._version:
            return False
        self._topics = dict(wrapper.topic_config_table)
        self._version = wrapper.data_version
        log.info("topic table copied from the master (data version %d)", self._version.counter)
        self._writer.submit(self.wrapper().to_json())
        for listener in list(self._listeners):
            listener()
        return True

    def delete(self, topic: str) -> bool:
        if self._topics.pop(topic, None) is None:
            return False
        self._system_topics.discard(topic)
        self._changed(f"topic {topic} deleted")
        return True

    def create_from_default(
        self, topic: str, default_topic: str, requested_queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """Auto-create `topic` from the template `default_topic` (§4.1 step 3), or None."""
        existing = self._topics.get(topic)
        if existing is not None:
            return existing
        template = self._topics.get(default_topic)
        if template is None:
            log.warning("cannot create %s: template topic %s does not exist", topic, default_topic)
            return None
        template_perm = template.perm
        if default_topic == TBW102 and not self._auto_create:
            template_perm &= ~int(Perm.INHERIT)
        if not template_perm & Perm.INHERIT:
            log.warning(
                "cannot create %s: template %s has perm %d without INHERIT",
                topic,
                default_topic,
                template.perm,
            )
            return None
        queue_nums = max(1, min(requested_queue_nums, template.write_queue_nums))
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=queue_nums,
            write_queue_nums=queue_nums,
            perm=template_perm & ~int(Perm.INHERIT),
            topic_filter_type=template.topic_filter_type,
            topic_sys_flag=topic_sys_flag,
        )
        self._topics[topic] = config
        self._changed(f"topic {topic} auto-created from {default_topic} with {queue_nums} queues")
        return config

    def ensure(self, topic: str, queue_nums: int, perm: int = PERM_DEFAULT) -> TopicConfig:
        """The topic, created with `queue_nums` queues and `perm` if missing (retry, DLQ)."""
        existing = self._topics.get(topic)
        if existing is not None:
            return existing
        _check_queue_nums(queue_nums, queue_nums)
        config = TopicConfig(
            topic_name=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm
        )
        self._topics[topic] = config
        self._changed(f"topic {topic} created with {queue_nums} queues")
        return config

    def ensure_retry_topic(self, group: str, queue_nums: int = 1) -> TopicConfig:
        return self.ensure(RETRY_GROUP_TOPIC_PREFIX + group, queue_nums, PERM_DEFAULT)

    def _changed(self, what: str) -> None:
        now = self._clock.now_ms()
        self._version = DataVersion(
            timestamp=max(now, self._version.timestamp), counter=self._version.counter + 1
        )
        log.info("%s (data version %d)", what, self._version.counter)
        self._writer.submit(self.wrapper().to_json())  # the fsync runs off the event loop
        for listener in list(self._listeners):
            listener()


def _check_queue_nums(read: int, write: int) -> None:
    for value in (read, write):
        if not 0 <= value <= TOPIC_QUEUE_NUMS_MAX:
            raise ValueError(f"queue count {value} is outside 0..{TOPIC_QUEUE_NUMS_MAX}")
