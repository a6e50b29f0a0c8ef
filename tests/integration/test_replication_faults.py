"""Replicated groups as real processes under real faults (issue 13, "Tests").

- Mixed traffic (plain, batch, transactional commit and rollback, delayed, and a consumer's
  retries through %RETRY%) over 64 KiB segments: the slave's commit log is byte-identical to its
  master's, rollovers included.
- A slave killed -9 and restarted resumes from its own valid end; a master stopped and started
  again is followed again; a slave added late to a master with history copies it from offset 0.
- ASYNC_MASTER killed -9 under load: what an acknowledged-but-not-yet-copied window loses,
  measured (printed), and that the slave's log is a byte prefix of the master's.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any, Final

import pytest

from tidemq import (
    Admin,
    ConsumeConcurrentlyStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendStatus,
    TransactionProducer,
)
from tidemq.client.message import ConsumeFromWhere
from tidemq.errors import QueueError
from tidemq.protocol.bodies import KVTable
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.testing import eventually, eventually_async
from tidemq.testing.processes import ServerProcess, process_cluster
from tidemq.testing.reading import pull_bodies

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

SEGMENT: Final = 64 * 1024
QUEUES: Final = 2
SETTLE_S: Final = 60.0  # registration, metadata copy, a restart's recovery, a loaded machine
FAST_DELAYS: Final = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms"
BODY: Final = b"x" * 500


async def _runtime(addr: str) -> dict[str, str] | None:
    """GET_BROKER_RUNTIME_INFO of one broker; None when it does not answer."""
    client = RemotingClient()
    try:
        answer = await client.invoke(
            addr, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 2_000
        )
    except (QueueError, OSError):
        return None
    finally:
        await client.close()
    return KVTable.from_json(answer.body).table if answer.body else None


async def _caught_up(master: ServerProcess, slave: ServerProcess) -> None:
    """The slave follows and holds the master's whole log and its topics."""

    async def same() -> bool:
        m, s = await _runtime(master.address), await _runtime(slave.address)
        return (
            m is not None
            and s is not None
            and s.get("haConnected") == "true"
            and m["commitLogMaxOffset"] == s["commitLogMaxOffset"]
            and m.get("topicCount") == s.get("topicCount")  # the metadata copy has run
        )

    await eventually_async(same, SETTLE_S, what=f"{slave.name} caught up with {master.name}")


def _log_bytes(server: ServerProcess) -> bytes:
    """The commit log as one byte string (segments in order; each is its full, padded size)."""
    assert server.store_dir is not None
    files = sorted((server.store_dir / "commitlog").iterdir())
    return b"".join(path.read_bytes() for path in files)


def _segments(server: ServerProcess) -> dict[str, bytes]:
    assert server.store_dir is not None
    return {p.name: p.read_bytes() for p in sorted((server.store_dir / "commitlog").iterdir())}


async def _create(namesrv_addr: str, *topics: str) -> None:
    async with Admin(namesrv_addr) as admin:
        for topic in topics:
            await admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)


class _Decider:
    """Commits bodies starting with b"c", rolls back the others."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        if message.body.startswith(b"c"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return self.execute_local_transaction(message, None)


async def _mixed_traffic(namesrv_addr: str) -> None:
    async with Producer("PG-mixed", namesrv_addr) as producer:
        for n in range(120):
            assert (await producer.send(Message("Plain", b"p%d" % n + BODY))).status is (
                SendStatus.SEND_OK
            )
        for n in range(6):
            batch = [Message("Plain", b"b%d-%d" % (n, i) + BODY) for i in range(16)]
            assert (await producer.send_batch(batch)).status is SendStatus.SEND_OK
        for n in range(20):
            delayed = Message("Delayed", b"d%d" % n, delay_level=1)
            assert (await producer.send(delayed)).status is SendStatus.SEND_OK
    async with TransactionProducer("PG-tx", namesrv_addr, listener=_Decider()) as tx:
        for n in range(30):
            body = (b"c%d" if n % 2 else b"r%d") % n
            result = await tx.send_message_in_transaction(Message("Tx", body + BODY), None)
            assert result.send_result is not None
            assert result.send_result.status is SendStatus.SEND_OK


async def _consume_with_retries(namesrv_addr: str, topic: str, expected: int) -> None:
    """A push consumer that fails every first delivery: each message is sent back, stored in
    the schedule topic, then %RETRY%<group>, and delivered again."""
    seen: dict[bytes, int] = {}

    def listener(messages: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        first = [m for m in messages if seen.get(m.body, 0) == 0]
        for m in messages:
            seen[m.body] = seen.get(m.body, 0) + 1
        if first:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        "CG-retry",
        namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=500,
    )
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    await consumer.start()
    try:
        await eventually(
            lambda: len(seen) == expected and all(n >= 2 for n in seen.values()),
            SETTLE_S,
            what="every message delivered again after a retry",
        )
    finally:
        await consumer.shutdown()


async def test_mixed_traffic_leaves_byte_identical_logs(tmp_path: Path) -> None:
    settings = {
        "brokerRole": "SYNC_MASTER",
        "mappedFileSizeCommitLog": str(SEGMENT),
        "messageDelayLevel": FAST_DELAYS,
    }
    async with process_cluster(tmp_path, slaves=1, broker_settings=settings) as pc:
        master, slave = pc.brokers[0], pc.slaves[0]
        await _caught_up(master, slave)
        await _create(pc.namesrv_addr, "Plain", "Delayed", "Tx")
        await _mixed_traffic(pc.namesrv_addr)
        await _consume_with_retries(pc.namesrv_addr, "Delayed", 20)
        await _caught_up(master, slave)
        await slave.stop()
        await master.stop()
        master_log, slave_log = _segments(master), _segments(slave)
        assert len(master_log) >= 3, "the traffic crossed fewer segments than meant"
        assert master_log == slave_log


async def _send_some(namesrv_addr: str, prefix: bytes, count: int) -> set[bytes]:
    sent: set[bytes] = set()
    async with Producer("PG-some", namesrv_addr) as producer:
        for n in range(count):
            body = prefix + b"%d" % n + BODY
            assert (await producer.send(Message("Restarts", body))).status is SendStatus.SEND_OK
            sent.add(body)
    return sent


async def test_slave_and_master_restarts_and_a_late_slave(tmp_path: Path) -> None:
    settings = {"brokerRole": "SYNC_MASTER", "mappedFileSizeCommitLog": str(SEGMENT)}
    async with process_cluster(tmp_path, slaves=1, broker_settings=settings) as pc:
        master, slave = pc.brokers[0], pc.slaves[0]
        await _caught_up(master, slave)
        await _create(pc.namesrv_addr, "Restarts")
        sent = await _send_some(pc.namesrv_addr, b"a", 300)

        slave.kill()  # kill -9, then the same store and port again
        await slave.start()
        await _caught_up(master, slave)
        sent |= await _send_some(pc.namesrv_addr, b"b", 300)
        await _caught_up(master, slave)

        await master.stop()  # SIGTERM; the slave keeps retrying with back-off
        await master.start()
        await _caught_up(master, slave)
        sent |= await _send_some(pc.namesrv_addr, b"c", 300)
        await _caught_up(master, slave)
        assert _segments(master) == _segments(slave)

        # A slave added late: an empty store copies the master's history from offset 0.
        await slave.stop()
        assert slave.store_dir is not None
        shutil.rmtree(slave.store_dir)
        await slave.start()
        await _caught_up(master, slave)
        assert _segments(master) == _segments(slave)
        master.kill()
        assert await pull_bodies(pc.namesrv_addr, "Restarts", "CG-check") == sent


async def _load(namesrv_addr: str, acked: list[bytes], stop: asyncio.Event) -> None:
    """Pipelined sends (16 in flight) until `stop`; every SEND_OK body goes to `acked`."""
    async with Producer("PG-load", namesrv_addr, send_timeout_ms=2_000) as producer:
        n = 0
        while not stop.is_set():
            bodies = [b"L%08d" % (n + i) + BODY for i in range(16)]
            n += 16
            results = await asyncio.gather(
                *(producer.send(Message("Load", body)) for body in bodies), return_exceptions=True
            )
            for body, result in zip(bodies, results, strict=True):
                if not isinstance(result, BaseException) and result.status is SendStatus.SEND_OK:
                    acked.append(body)


async def test_async_master_killed_under_load_loses_only_the_copy_window(
    tmp_path: Path,
) -> None:
    settings = {"brokerRole": "ASYNC_MASTER", "mappedFileSizeCommitLog": str(1024 * 1024)}
    async with process_cluster(tmp_path, slaves=1, broker_settings=settings) as pc:
        master, slave = pc.brokers[0], pc.slaves[0]
        await _caught_up(master, slave)
        await _create(pc.namesrv_addr, "Load")
        await _caught_up(master, slave)  # the slave knows the topic before the master dies
        acked: list[bytes] = []
        stop = asyncio.Event()
        load = asyncio.create_task(_load(pc.namesrv_addr, acked, stop))
        await eventually(lambda: len(acked) >= 3_000, SETTLE_S, what="3000 sends acked")
        master.kill()
        stop.set()
        await load
        on_slave = await pull_bodies(pc.namesrv_addr, "Load", "CG-check")
        lost = [body for body in acked if body not in on_slave]
        print(
            f"ASYNC_MASTER kill -9 under load: {len(lost)} of {len(acked)} acknowledged sends "
            f"not on the slave ({len(lost) * (len(BODY) + 9)} body bytes)"
        )
        # What the slave has is exactly the start of the master's log: a copy, never a fork.
        slave_log, master_log = _log_bytes(slave), _log_bytes(master)
        end = int((await _runtime(slave.address) or {}).get("commitLogMaxOffset", "0"))
        assert end > 0
        assert slave_log[:end] == master_log[:end]
        # Losses are the newest sends only: everything acknowledged before them is there.
        if lost:
            first_lost = acked.index(lost[0])
            assert all(body in on_slave for body in acked[: first_lost - 64])
