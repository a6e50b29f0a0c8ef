"""The broker's topic table: which topics exist here, their queue counts and permissions.

Persisted as `<root>/config/topics.json` in RocketMQ's shape (remoting.md §7), which is also the
`topicConfigSerializeWrapper` the broker sends to name servers:

    {"dataVersion":{"counter":N,"timestamp":T},
     "topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",
                              "topicName":"T","topicSysFlag":0,"writeQueueNums":4}}}

Every change bumps the DataVersion (counter + 1, timestamp = now), persists the file and calls the
change listeners; the registration service listens and re-registers at once, because a name server
only rebuilds a broker's queue data when the version moved.

When a change reaches the disk (what a kill -9 can lose: nothing that was answered):

    put, delete (UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC, a widened adopted topic), a slave's copy
        topics.json written at once (persist.write_atomic: tmp file, fsync, rename) before the
        call returns, so the admin answer follows the write (upstream persists in the request
        thread too)
    create_from_default, ensure (auto-creation by a send; retry, DLQ, trace and adopted topics)
        one line per topic appended to `topics.json.journal` at the end of the event-loop turn
        that created them (loop.call_soon: one write for every creation of the turn), then
        fdatasync'd off the loop. Answers leave in callbacks too (the send coalescer's
        put_pending, each connection's write flush), as a rule scheduled after the creation and
        so run after the append; one whose connection's flush was already due from earlier in
        the same turn can precede it by that one loop iteration, never longer

The appended line is in the kernel's page cache when the answer leaves, which a killed process
cannot lose (upstream's ConfigManager does not fsync at all); the fdatasync that follows covers a
power cut. The journal keeps auto-creation O(1): rewriting topics.json per creation cost the whole
table's serialization and an fsync (~10 ms) per topic. It is folded into topics.json (a full write,
then truncated) when it outgrows max(JOURNAL_FOLD_MIN, half the table), at every persist (start,
admin change) and at shutdown. Each line carries the data version after the change,

    {"dataVersion":{"counter":N,"timestamp":T},"topic":{...TopicConfig...}}

and load applies only lines newer than topics.json's version, so a crash between a fold's write
and its truncation replays nothing twice; a torn last line (power cut) is skipped with a warning.
Nothing waits on a timer: a delay and then the config writer's spacing (0.5 s + 1 s) lost topics
created 2 s before a kill -9.

Auto-creation (§4.1 step 3): an unknown topic is created from the request's default topic when that
topic exists and carries the INHERIT bit — TBW102 is registered with perm 7 when
autoCreateTopicEnable is on. The new topic gets min(requested, default's write queues) queues and
the default's perm without INHERIT. Retry topics (`%RETRY%<group>`) are created with the group's
retry queue count and perm 6 whatever the template says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tidemq.broker.persist import read_optional, write_atomic
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
JOURNAL_SUFFIX: Final = ".journal"
# The journal is folded into topics.json when it holds more lines than this or than half the table:
# a fold costs O(table), so folding every len/2 creations keeps a creation O(1) amortized.
JOURNAL_FOLD_MIN: Final = 256
# RocketMQ's per-broker topics; a (cluster|broker)-named topic doubles as an auto-create template.
_BROKER_TOPIC_QUEUE_NUMS: Final = 1
_CLUSTER_TOPIC_QUEUE_NUMS: Final = 16
# One consume queue per delay level (remoting.md §9).
SCHEDULE_TOPIC_QUEUE_NUMS: Final = 18
PERM_DEFAULT: Final = int(Perm.READ | Perm.WRITE)
PERM_TEMPLATE: Final = int(Perm.READ | Perm.WRITE | Perm.INHERIT)
# A topic can have at most this many queues (a wrong admin command should not make 2^31 files).
TOPIC_QUEUE_NUMS_MAX: Final = 1024
# After a failed end-of-turn write (disk full, EIO), the next attempt this much later.
WRITE_RETRY_S: Final = 1.0

ChangeListener = Callable[[], None]


class TopicTable:
    """Topic configs by name, persisted on each change (module doc: when). Single-threaded (the
    event loop)."""

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
        self._journal_path = config_dir / (TOPICS_FILE + JOURNAL_SUFFIX)
        self._journal_fd: int | None = None
        self._journal_lines: int | None = None  # None: not known yet (a file from the last run)
        self._journal_unsynced = False
        self._journal_sync: asyncio.Task[None] | None = None
        self._created: list[str] = []  # topics auto-created this turn, for the journal
        self._clock = clock
        self._auto_create = auto_create_topic_enable
        self._topics: dict[str, TopicConfig] = {}
        self._version = DataVersion(timestamp=clock.now_ms(), counter=0)
        self._listeners: list[ChangeListener] = []
        self._system_topics: set[str] = set()
        # The end-of-turn write of auto-created topics, while one is scheduled (module doc).
        self._turn_write: asyncio.Handle | None = None
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
        """Merge topics.json, then its journal's newer lines, over the built-in topics (the file
        wins, as in RocketMQ)."""
        data = read_optional(self._path)
        if data is None:
            log.info("no %s yet; starting with %d built-in topics", self._path, len(self._topics))
        else:
            try:
                wrapper = TopicConfigSerializeWrapper.from_json(data)
            except ProtocolError as exc:
                raise ProtocolError(f"{self._path}: {exc}") from exc
            self._topics.update(wrapper.topic_config_table)
            self._version = wrapper.data_version
        replayed = self._replay_journal()
        if not self._auto_create and TBW102 in self._topics:
            # Left over from a run with auto-create on; keep it but stop it acting as a template.
            tbw = self._topics[TBW102]
            self._topics[TBW102] = dataclasses.replace(tbw, perm=tbw.perm & ~int(Perm.INHERIT))
        log.info(
            "loaded %d topics from %s (%d from its journal)",
            len(self._topics),
            self._path,
            replayed,
        )

    def _replay_journal(self) -> int:
        """Apply the journal's lines newer than the loaded version; returns how many applied."""
        try:
            lines = self._journal_path.read_bytes().splitlines()
        except FileNotFoundError:
            return 0
        applied = 0
        folded = self._version.counter  # lines up to it are in topics.json already
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                version = DataVersion.from_dict(entry["dataVersion"])
                config = TopicConfig.from_dict(entry["topic"])
            except (ValueError, KeyError, TypeError, ProtocolError) as exc:
                log.warning(
                    "%s line %d skipped (torn by a crash?): %s", self._journal_path, number, exc
                )
                continue
            if version.counter > folded:  # one append's lines share its version
                self._topics[config.topic_name] = config
                self._version = max(self._version, version, key=lambda v: v.counter)
                applied += 1
        return applied

    def persist(self) -> None:
        """Write the whole table now, on this thread, and empty the journal (folded into it)."""
        if self._turn_write is not None:
            self._turn_write.cancel()
            self._turn_write = None
        self._created.clear()
        write_atomic(self._path, self.wrapper().to_json())
        if self._journal_lines != 0:
            os.ftruncate(self._journal(), 0)
            self._journal_lines = 0

    async def flush(self) -> None:
        """Fold what the journal holds and what waits for its turn into topics.json (shutdown)."""
        if self._turn_write is not None or self._journal_lines:
            self.persist()
        task, self._journal_sync = self._journal_sync, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    def _journal(self) -> int:
        if self._journal_fd is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            self._journal_fd = os.open(self._journal_path, flags, 0o644)
        return self._journal_fd

    def _journal_at_turn_end(self, topic: str) -> None:
        """Have `topic` journaled at the end of this loop turn (topics.json at once without a
        loop: start-up and tools answer nobody, and write rarely)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.persist()
            return
        self._created.append(topic)
        if self._turn_write is None:
            self._turn_write = loop.call_soon(self._end_of_turn)

    def _end_of_turn(self) -> None:
        self._turn_write = None
        try:
            if (self._journal_lines or 0) + len(self._created) > max(
                JOURNAL_FOLD_MIN, len(self._topics) // 2
            ):
                self.persist()
            else:
                self._append(self._created)
                self._created.clear()
        except OSError:
            self._write_failed()

    def _write_failed(self) -> None:
        """The table stays changed in memory; a whole write (persist) WRITE_RETRY_S later, an
        admin change or the shutdown writes it. Logged each time: a crash would lose it."""
        log.exception("could not write %s; trying again in %.0f s", self._path, WRITE_RETRY_S)
        self._turn_write = asyncio.get_running_loop().call_later(WRITE_RETRY_S, self._retry)

    def _retry(self) -> None:
        self._turn_write = None
        try:
            self.persist()
        except OSError:
            self._write_failed()

    def _append(self, topics: list[str]) -> None:
        """One write(2) of a line per topic (its config now), then an fdatasync off the loop."""
        version = json.dumps(self._version.to_dict())
        lines = [
            f'{{"dataVersion":{version},"topic":{json.dumps(config.to_dict())}}}\n'
            for topic in dict.fromkeys(topics)
            if (config := self._topics.get(topic)) is not None
        ]
        data = "".join(lines).encode()
        fd = self._journal()
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        self._journal_lines = (self._journal_lines or 0) + len(lines)
        self._journal_unsynced = True
        if self._journal_sync is None or self._journal_sync.done():
            self._journal_sync = asyncio.get_running_loop().create_task(
                self._sync_journal(), name="topics journal fdatasync"
            )

    async def _sync_journal(self) -> None:
        """fdatasync the journal until no append is left unsynced (a power cut; a killed
        process loses nothing already written)."""
        while self._journal_unsynced and self._journal_fd is not None:
            self._journal_unsynced = False
            try:
                await asyncio.to_thread(os.fdatasync, self._journal_fd)
            except OSError:
                log.exception("could not fdatasync %s; trying again", self._journal_path)
                self._journal_unsynced = True
                await asyncio.sleep(WRITE_RETRY_S)

    # -- reads -------------------------------------------------------------------------------

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def __len__(self) -> int:
        return len(self._topics)

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
        self.persist()
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
        self._changed(
            f"topic {topic} auto-created from {default_topic} with {queue_nums} queues",
            created=topic,
        )
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
        self._changed(f"topic {topic} created with {queue_nums} queues", created=topic)
        return config

    def ensure_retry_topic(self, group: str, queue_nums: int = 1) -> TopicConfig:
        return self.ensure(RETRY_GROUP_TOPIC_PREFIX + group, queue_nums, PERM_DEFAULT)

    def _changed(self, what: str, *, created: str | None = None) -> None:
        """Bump the version, write the change (topics.json now, or the auto-`created` topic to
        the journal at the end of the turn: module doc) and tell the listeners."""
        now = self._clock.now_ms()
        self._version = DataVersion(
            timestamp=max(now, self._version.timestamp), counter=self._version.counter + 1
        )
        log.info("%s (data version %d)", what, self._version.counter)
        if created is None:
            self.persist()
        else:
            self._journal_at_turn_end(created)
        for listener in list(self._listeners):
            listener()


def _check_queue_nums(read: int, write: int) -> None:
    for value in (read, write):
        if not 0 <= value <= TOPIC_QUEUE_NUMS_MAX:
            raise ValueError(f"queue count {value} is outside 0..{TOPIC_QUEUE_NUMS_MAX}")
