"""A slave's copied tables on a real store, for the SlaveSync tests: `Copy.catch_up` feeds its log
from a master's (what HA replication does), up to any record boundary."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker_harness import SMALL_STORE, Harness

from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import ScheduleService
from tidemq.broker.slave_sync import SlaveSync
from tidemq.broker.topics import TopicTable
from tidemq.clock import SystemClock
from tidemq.remoting.client import RemotingClient
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore

INTERVAL_MS: Final = 100
DELAY_LEVELS_MS: Final = (1_000,)
# The harness's log segments (a replica's must be the same size).
MASTER_COMMIT_LOG_FILE_SIZE: Final = int(SMALL_STORE["mappedFileSizeCommitLog"])


@dataclass
class Copy:
    sync: SlaveSync
    topics: TopicTable
    groups: SubscriptionGroupTable
    offsets: ConsumerOffsetTable
    schedule: ScheduleService
    store: FileMessageStore

    def catch_up(self, master: Harness, end: int | None = None) -> None:
        """Bring this slave's log to the master's end (or `end`, a record boundary), as HA
        replication does."""
        source = master.app.store
        end = source.max_physical_offset if end is None else end
        while (at := self.store.max_physical_offset) < end:
            data = source.read_replica(at, end - at)
            assert self.store.append_replica(at, data) > 0, at

    async def round(self, master: Harness) -> bool:
        """One copy round with this slave's log caught up with the master's."""
        self.catch_up(master)
        return await self.sync.sync_once()


@contextlib.asynccontextmanager
async def slave_tables(
    root: Path, master_addr: str | None, client: RemotingClient | None = None
) -> AsyncIterator[Copy]:
    """A slave's four tables on a real store (its log fed by `Copy.catch_up`; the schedule
    service never runs) and a SlaveSync copying into them."""
    clock = SystemClock()
    store = FileMessageStore(
        StoreConfig(root_dir=root / "replica", commit_log_file_size=MASTER_COMMIT_LOG_FILE_SIZE),
        clock,
    )
    store.start()
    store.set_replica_mode(True)
    config_dir = root / "config"
    topics = TopicTable(
        config_dir,
        clock,
        cluster_name="DefaultCluster",
        broker_name="broker-a",
        auto_create_topic_enable=True,
        default_topic_queue_nums=4,
    )
    groups = SubscriptionGroupTable(config_dir, clock, auto_create=True)
    offsets = ConsumerOffsetTable(config_dir)
    schedule = ScheduleService(store, DELAY_LEVELS_MS, clock, config_dir)
    client = client or RemotingClient(clock=clock)
    sync = SlaveSync(
        client, topics, groups, offsets, schedule, clock, interval_ms=INTERVAL_MS, timeout_ms=500
    )
    sync.set_master(master_addr)
    try:
        yield Copy(sync, topics, groups, offsets, schedule, store)
    finally:
        await sync.stop()
        await client.close()
        await topics.flush()
        await groups.flush()
        store.shutdown()
