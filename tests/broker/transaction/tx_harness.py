"""A transaction world over a real FileMessageStore in tmp_path, driven by a FakeClock."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.broker.schedule import DelayRouter
from tidemq.broker.timer import TimerWheel
from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.check_back import CheckBackConfig, CheckBackService
from tidemq.broker.transaction.ledger import TransactionLedger
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.broker.transaction.stats import TransactionStats
from tidemq.clock import FakeClock
from tidemq.errors import ConnectionClosedError
from tidemq.protocol import record as rec
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.message import encode_properties
from tidemq.remoting.connection import Connection
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore, PutResult

STORE_HOST = ("127.0.0.1", 10911)
GROUP = "PG_TX"
TOPIC = "TopicTx"


class FakeProducer:
    """Stands in for a producer's connection: records the oneway commands it is sent."""

    def __init__(self, name: str, *, broken: bool = False) -> None:
        self.name = name
        self.broken = broken
        self.closed = False
        self.sent: list[RemotingCommand] = []
        self.peer_text = name

    def log_peer_error(self, message: str, *args: object, level: int = logging.WARNING) -> None:
        """As Connection.log_peer_error, without its rate limit: handlers log refusals here."""
        logging.getLogger("tidemq.tests.fake_producer").log(level, message, *args)

    async def oneway(self, cmd: RemotingCommand) -> None:
        if self.broken:
            raise ConnectionClosedError(f"{self.name} is gone")
        self.sent.append(cmd)


def user_message(
    body: bytes = b"payload",
    *,
    topic: str = TOPIC,
    queue_id: int = 1,
    properties: dict[str, str] | None = None,
    born_ms: int = 1_600_000_000_000,
) -> MessageToStore:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": f"U{body.hex()}", "user": "v"}
    props["TRAN_MSG"] = "true"
    props.update(properties or {})
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=body,
        flag=3,
        properties=encode_properties(props),
        sys_flag=0,
        born_timestamp=born_ms,
        born_host=("10.0.0.7", 5555),
        store_host=STORE_HOST,
        reconsume_times=0,
    )


@dataclass
class World:
    root: Path
    clock: FakeClock
    check_config: CheckBackConfig = field(default_factory=CheckBackConfig)
    in_flight_max: int = 1_000
    outcomes_max: int = 1_000
    producers: dict[str, list[FakeProducer]] = field(default_factory=dict)
    # Set to make the store refuse puts (disk full), after advancing the clock by 1 s.
    disk_full: bool = False
    # Route committed messages as the send path does (delay levels and the timer wheel).
    delays: bool = False

    def __post_init__(self) -> None:
        self.open()

    def open(self) -> None:
        self.store = FileMessageStore(
            StoreConfig(root_dir=self.root / "store", commit_log_file_size=64 * 1024),
            self.clock,
            disk_usage_probe=lambda _path: 99.0 if self.disk_full else 1.0,
        )
        self.store.start()
        self.offsets = ConsumerOffsetTable(self.root / "store" / "config")
        self.offsets.load()
        self.stats = TransactionStats()
        self.ledger = TransactionLedger(
            in_flight_max=self.in_flight_max, outcomes_max=self.outcomes_max
        )
        router = None
        if self.delays:
            config_dir = self.root / "store" / "config"
            self.timer = TimerWheel(self.store, self.clock, config_dir)
            router = DelayRouter(
                (1_000, 5_000), self.clock, timer=self.timer, timer_max_delay_ms=86_400_000
            ).route
        self.resolver = TransactionResolver(
            self.store, self.ledger, self.stats, self.clock, STORE_HOST, route=router
        )
        self.resolver.rebuild(self.offsets)
        self.checker = CheckBackService(
            self.check_config,
            self.resolver,
            self.offsets,
            lambda group, _topic: cast(list[Connection], list(self.producers.get(group, []))),
            self.clock,
        )

    def restart(self, *, clean: bool = True) -> None:
        """Stop (persisting offsets when clean) and open again from disk."""
        if clean:
            self.offsets.persist()
            self.store.shutdown()
        else:
            self.store.flush()
            self.store.shutdown()  # the files stay; offsets not persisted = a crash for them
        self.open()

    def close(self) -> None:
        self.store.shutdown()

    def prepare(self, body: bytes = b"payload", **kwargs: Any) -> PutResult:
        result = self.resolver.prepare(user_message(body, **kwargs), GROUP)
        assert result.ok, result
        return result

    def half_at(self, physical_offset: int) -> rec.StoredMessage:
        half = self.resolver.load_half(physical_offset)
        assert half is not None
        return half

    def records(self, topic: str, queue_id: int = 0) -> list[rec.StoredMessage]:
        result = self.store.get_messages(topic, queue_id, 0, 256)
        return [rec.decode_record(r) for r in result.records]

    def real_messages(self) -> list[rec.StoredMessage]:
        return self.records(TOPIC, 1)

    def op_origins(self) -> list[int]:
        return [o for op in self.records(hm.OP_TOPIC) for o in hm.parse_op_body(op.body)]
