"""Helpers of the HA tests: real stores on tiny segments, random traffic, a master/slave pair on
loopback, and raw peers built on protocol/ha.py for what a real peer never does."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tidemq.broker.ha import HAMaster, HASettings, HASlave
from tidemq.clock import SystemClock
from tidemq.protocol import ha
from tidemq.protocol.message import SysFlag
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig
from tidemq.testing.wait import eventually

SEGMENT: Final = 64 * 1024
SECRET: Final = b"the group's shared secret"
CLOCK: Final = SystemClock()


def settings(**overrides: object) -> HASettings:
    values: dict[str, object] = {
        "secret": SECRET,
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "heartbeat_interval_ms": 100,
        "housekeeping_interval_ms": 10_000,  # generous: a loaded CI box must not drop peers
        "transfer_batch_size": 32 * 1024,
        "sync_timeout_ms": 3_000,
    }
    values.update(overrides)
    return HASettings(**values)  # type: ignore[arg-type]


def open_store(root: Path, *, replica: bool = False, **overrides: object) -> FileMessageStore:
    values: dict[str, object] = {
        "root_dir": root,
        "commit_log_file_size": SEGMENT,
        "consume_queue_file_entries": 64,
        "index_slot_count": 64,
        "index_entry_count": 256,
    }
    values.update(overrides)
    store = FileMessageStore(StoreConfig(**values), CLOCK)  # type: ignore[arg-type]
    store.start()
    store.set_replica_mode(replica)
    return store


def message(rng: random.Random, i: int, **fields: object) -> MessageToStore:
    keys = f"KEYS\x01k{i}\x02" if rng.random() < 0.5 else ""
    msg = MessageToStore(
        topic=str(fields.pop("topic", rng.choice(["A", "B"]))),
        queue_id=int(fields.pop("queue_id", rng.randrange(3))),  # type: ignore[call-overload]
        body=rng.randbytes(rng.choice([8, 300, 2_000, 9_000, 20_000])),
        flag=0,
        properties=f"TAGS\x01{rng.choice('xy')}\x02{keys}UNIQ_KEY\x01U{i:08d}\x02",
        sys_flag=0,
        born_timestamp=1_700_000_000_000 + i,
        born_host=("127.0.0.1", 40000),
        store_host=("127.0.0.1", 10911),
    )
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def put_traffic(
    store: FileMessageStore, rng: random.Random, count: int, first: int = 0
) -> list[int]:
    """About `count` messages (batches, single sends of many queues, transaction records);
    returns the end offset of each put pass."""
    ends: list[int] = []
    i = first
    while i < first + count:
        kind = rng.random()
        if kind < 0.3:
            topic, queue_id = rng.choice(["A", "B"]), rng.randrange(3)
            n = rng.randint(2, 6)
            batch = [message(rng, i + k, topic=topic, queue_id=queue_id) for k in range(n)]
            results = store.put_messages(batch)
        elif kind < 0.5:
            flag = rng.choice([SysFlag.PREPARED, SysFlag.COMMIT, SysFlag.ROLLBACK])
            n = 1
            results = [store.put_message(message(rng, i, topic="Tx", sys_flag=flag))]
        else:
            n = rng.randint(1, 5)
            results = store.put_each([message(rng, i + k) for k in range(n)])
        assert all(r.ok for r in results), results
        ends.append(max(r.physical_offset + r.size for r in results))
        i += n
    return ends


def log_files(store: FileMessageStore) -> dict[str, bytes]:
    directory = store.config.root_dir / "commitlog"
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def assert_same_log(master: FileMessageStore, slave: FileMessageStore) -> None:
    assert slave.max_physical_offset == master.max_physical_offset
    assert log_files(slave) == log_files(master)


def assert_same_queues(master: FileMessageStore, slave: FileMessageStore) -> None:
    assert slave.topics_and_queues() == master.topics_and_queues()
    for topic, queue_ids in master.topics_and_queues().items():
        for queue_id in queue_ids:
            offset = 0
            while True:
                got = slave.get_messages(topic, queue_id, offset, 256)
                want = master.get_messages(topic, queue_id, offset, 256)
                assert got == want, (topic, queue_id, offset)
                if not want.records:
                    break
                offset = want.next_begin_offset


async def caught_up(
    master: FileMessageStore, slave: FileMessageStore, timeout_s: float = 60
) -> None:
    await eventually(
        lambda: slave.max_physical_offset == master.max_physical_offset,
        timeout_s,
        what=f"slave at the master's end {master.max_physical_offset}",
    )


@dataclass
class Pair:
    master_store: FileMessageStore
    slave_store: FileMessageStore
    master: HAMaster
    slave: HASlave

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.master.port}"


@asynccontextmanager
async def running_pair(
    tmp_path: Path,
    *,
    master_settings: HASettings | None = None,
    slave_settings: HASettings | None = None,
    follow: bool = True,
) -> AsyncIterator[Pair]:
    """A started master store and HAMaster, a slave store in replica mode and an HASlave
    following it (unless `follow` is False); everything stopped and closed at exit."""
    master_store = open_store(tmp_path / "master")
    slave_store = open_store(tmp_path / "slave", replica=True)
    master = HAMaster(master_store, master_settings or settings(), CLOCK)
    slave = HASlave(slave_store, slave_settings or settings(), CLOCK, broker_id=1)
    pair = Pair(master_store, slave_store, master, slave)
    try:
        await master.start()
        if follow:
            slave.set_master(pair.address)
        yield pair
    finally:
        # The test may have replaced any part (a restart): close what the pair holds last.
        await pair.slave.stop()
        await pair.master.stop()
        pair.slave_store.shutdown()
        pair.master_store.shutdown()


# --- raw peers --------------------------------------------------------------------------------


@dataclass
class RawSlave:
    """A hand-driven slave connection: handshake done, then the test says what it sends."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    verdict: ha.Verdict

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def raw_slave(
    port: int, *, secret: bytes = SECRET, slave_max: int = 0, tail: bytes = b""
) -> RawSlave:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    session = ha.SlaveSession(
        secret, secrets.token_bytes(16), slave_max=slave_max, broker_id=7, tail=tail
    )
    session.receive(await reader.readexactly(ha.HELLO.size))
    writer.write(session.data_to_send())
    (event,) = session.receive(await reader.readexactly(ha.VERDICT.size))
    assert isinstance(event, ha.VerdictReceived)
    return RawSlave(reader, writer, event.verdict)


def with_settings(base: HASettings, **changes: object) -> HASettings:
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
