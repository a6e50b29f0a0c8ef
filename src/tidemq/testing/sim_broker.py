"""SimBroker: the broker-side transaction parts of one broker over a store directory.

Real parts only (FileMessageStore, ConsumerOffsetTable, TransactionLedger, TransactionResolver
with its start-up rebuild, CheckBackService, EndTransactionHandler), wired as BrokerApp wires
them but without sockets: the simulation (sim_tx.py) delivers frames and runs the periodic work.
Files are tiny (64 KiB commit-log segments, 512-entry consume-queue files) so a run crosses
rollovers and an unclean restart's copy of the directory is cheap.

    <root>/epoch-<n>/store    the FileMessageStore
    <root>/epoch-<n>/config   consumerOffset.json (CID_RMQ_SYS_TRANS progress among others)

A restart moves to epoch n+1: clean = persist offsets, shut down, rename; unclean = copy the
directory as the killed process left it (abort marker present, checkpoint and offsets as last
written), then reopen the copy, so recovery runs on a crash image.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Final, cast

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.common import guarded
from tidemq.broker.handlers.end_transaction import EndTransactionHandler
from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.transaction.check_back import CheckBackConfig, CheckBackService
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import FakeClock
from tidemq.protocol import record as rec
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.connection import Connection
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.testing.sim import SimConnection

TOPIC: Final = "SimTxTopic"
QUEUES: Final = 4
STORE_HOST: Final = ("127.0.0.1", 10911)
# The user property naming the transaction in the producers' database (also the message key).
TXID_PROPERTY: Final = "SIM_TXID"
# Records read per consume-queue request by the final checker.
READ_BATCH_MAX: Final = 256


class SimBroker:
    """The broker-side transaction parts over one store directory; `restart` reopens them."""

    def __init__(self, root: Path, clock: FakeClock, check: CheckBackConfig) -> None:
        self._root = root
        self._clock = clock
        self._check = check
        self.epoch = 0
        self.connections: list[SimConnection] = []
        self.stats_before = collections.Counter[str]()
        self._open(root / "epoch-0")

    def _open(self, directory: Path) -> None:
        self.directory = directory
        self.store = FileMessageStore(
            StoreConfig(
                root_dir=directory / "store",
                commit_log_file_size=64 * 1024,
                consume_queue_file_entries=512,
                index_slot_count=512,
                index_entry_count=2_048,
            ),
            self._clock,
            disk_usage_probe=lambda _path: 1.0,
        )
        self.store.start()
        self.offsets = ConsumerOffsetTable(directory / "config")
        self.offsets.load()
        self.stats = TransactionStats()
        self.ledger = TransactionLedger()
        self.resolver = TransactionResolver(
            self.store, self.ledger, self.stats, self._clock, STORE_HOST
        )
        self.resolver.rebuild(self.offsets)
        self.checker = CheckBackService(
            self._check,
            self.resolver,
            self.offsets,
            lambda _group, _topic: cast(
                list[Connection], [c for c in self.connections if not c.closed]
            ),
            self._clock,
        )

        async def wait_durable(_offset: int) -> tuple[int, str]:
            return ResponseCode.SUCCESS, ""  # the simulation's store never fails to persist

        handler = EndTransactionHandler(BrokerConfig(), self.resolver, wait_durable)
        self.end_transaction = guarded(handler.handle)

    def restart(self, *, clean: bool) -> None:
        """Stop and reopen. Unclean: reopen a copy of the directory as a killed process left
        it (no shutdown, offsets as last persisted), then let the old instance go."""
        self.stats_before.update(self.stats.snapshot(0))
        self.epoch += 1
        for connection in self.connections:
            connection.close()
        self.connections = []
        target = self._root / f"epoch-{self.epoch}"
        if clean:
            self.offsets.persist()
            self.store.shutdown()
            shutil.move(self.directory, target)
        else:
            shutil.copytree(self.directory, target)
            self.store.shutdown()
            shutil.rmtree(self.directory)
        self._open(target)

    def close(self) -> None:
        self.store.shutdown()

    def total_stats(self) -> collections.Counter[str]:
        total = collections.Counter(self.stats_before)
        total.update(self.stats.snapshot(0))
        return total

    def visible_counts(self) -> collections.Counter[str]:
        """How often each transaction id is in the real topic's consume queues."""
        counts: collections.Counter[str] = collections.Counter()
        for queue_id in range(QUEUES):
            offset = self.store.min_offset(TOPIC, queue_id)
            end = self.store.max_offset(TOPIC, queue_id)
            while offset < end:
                result = self.store.get_messages(TOPIC, queue_id, offset, READ_BATCH_MAX)
                for data in result.records:
                    counts[rec.decode_record(data).property_map()[TXID_PROPERTY]] += 1
                assert result.next_begin_offset > offset, result
                offset = result.next_begin_offset
        return counts
