"""Replicated broker groups as real processes (issue 13): `process_cluster(slaves=1)`,
`tidemq cluster list` on it, and `tidemq dev --slave`.

- A SYNC_MASTER and its slave over tiny segments: every acknowledged send is on the slave, the
  commit logs are byte-identical, and `cluster list` shows the slave following with no lag.
- kill -9 the master: `cluster list` says it is unreachable and the slave still serves every
  acknowledged message to a pull consumer.
- A slave with the wrong haSecret is refused and copies nothing.
- `tidemq dev --slave`: one process, a master and a slave that follows it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

import pytest

from tidemq import Admin, Message, Producer, SendStatus
from tidemq.cli.cluster import BrokerAnswer, fetch_answers
from tidemq.cli.main import main as cli_main
from tidemq.errors import QueueError
from tidemq.testing import eventually_async, local_cluster
from tidemq.testing.processes import (
    ProcessCluster,
    ServerProcess,
    free_broker_port,
    free_port,
    process_cluster,
)
from tidemq.testing.reading import pull_bodies

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

TOPIC: Final = "ReplicatedTopic"
QUEUES: Final = 4
# 64 KiB segments: the sends below (about 300 KiB) cross several rollovers on both sides.
SEGMENT_BYTES: Final = 64 * 1024
SENDS: Final = 1200
# Sends in flight at once: SYNC_MASTER's group acknowledgement releases them together.
WINDOW: Final = 16
# Registration (1 s period), metadata copy (slaveSyncIntervalMs, 1 s) and a loaded machine.
SETTLE_S: Final = 30.0


async def _answers(namesrv_addr: str) -> dict[tuple[str, int], BrokerAnswer]:
    """The cluster list's answers by (brokerName, brokerId); {} while the name server has none."""
    try:
        async with Admin(namesrv_addr, timeout_ms=2_000) as admin:
            found = await fetch_answers(admin, 2_000)
    except QueueError:
        return {}
    return {(a.broker_name, a.broker_id): a for a in found}


async def _registered(pc: ProcessCluster, *, following: bool = True) -> None:
    """Every master and slave is in the name server's cluster info and answers; with
    `following`, every slave is connected to its master (before that a SYNC_MASTER answers
    SLAVE_NOT_AVAILABLE)."""
    wanted = len(pc.brokers) + len(pc.slaves)

    def ready(answer: BrokerAnswer) -> bool:
        if answer.info is None:
            return False
        return not following or answer.broker_id == 0 or answer.info.get("haConnected") == "true"

    async def all_there() -> bool:
        answers = await _answers(pc.namesrv_addr)
        return len(answers) == wanted and all(ready(a) for a in answers.values())

    await eventually_async(all_there, SETTLE_S, what="masters and slaves registered")


async def _send_all(namesrv_addr: str) -> dict[bytes, str]:
    """SENDS messages, WINDOW at a time; returns body → msgId of every SEND_OK."""
    acked: dict[bytes, str] = {}
    async with Producer("PG-replicated", namesrv_addr) as producer:
        for start in range(0, SENDS, WINDOW):
            bodies = [b"m-%06d-" % n + b"x" * 180 for n in range(start, start + WINDOW)]
            results = await asyncio.gather(
                *(producer.send(Message(TOPIC, body, keys=body[:8].decode())) for body in bodies)
            )
            for body, result in zip(bodies, results, strict=True):
                assert result.status is SendStatus.SEND_OK, result
                acked[body] = result.msg_id
    return acked


async def _topic(pc: ProcessCluster) -> None:
    async with Admin(pc.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)


def _commit_log(server: ServerProcess) -> dict[str, bytes]:
    assert server.store_dir is not None
    return {p.name: p.read_bytes() for p in sorted((server.store_dir / "commitlog").iterdir())}


async def _caught_up(pc: ProcessCluster) -> None:
    """The slave's commit-log end equals the master's, and so does its topic count (the
    metadata copy runs every slaveSyncIntervalMs: a topic created just now may not be there)."""

    async def same_end() -> bool:
        answers = await _answers(pc.namesrv_addr)
        seen = {
            (answer.info.get("commitLogMaxOffset"), answer.info.get("topicCount"))
            for answer in answers.values()
            if answer.info is not None
        }
        return len(answers) == 2 and len(seen) == 1

    await eventually_async(same_end, SETTLE_S, what="slave caught up with the master")


async def _cli_rows(namesrv_addr: str, capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    capsys.readouterr()
    argv = ["cluster", "list", "-n", namesrv_addr, "--timeout-ms", "2000"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    return [line.split() for line in capsys.readouterr().out.strip().splitlines()[1:]]


async def test_sync_master_and_slave_processes_hold_identical_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"brokerRole": "SYNC_MASTER", "mappedFileSizeCommitLog": str(SEGMENT_BYTES)}
    async with process_cluster(tmp_path, slaves=1, broker_settings=settings) as pc:
        assert [s.name for s in pc.slaves] == ["broker-a-s1"]
        assert pc.slaves_of("broker-a") == pc.slaves
        await _registered(pc)
        await _topic(pc)
        acked = await _send_all(pc.namesrv_addr)
        await _caught_up(pc)
        master_log, slave_log = _commit_log(pc.brokers[0]), _commit_log(pc.slaves[0])
        assert len(master_log) > 3  # rollovers happened
        assert master_log == slave_log

        rows = await _cli_rows(pc.namesrv_addr, capsys)
        assert [row[1:5] for row in rows] == [
            ["broker-a", "0", "SYNC_MASTER", pc.brokers[0].address],
            ["broker-a", "1", "SLAVE", pc.slaves[0].address],
        ]
        assert rows[0][8:] == ["1", "slave(s)"]
        assert rows[1][6:9] == ["0", "0.0", "following"]

        # kill -9 the master: every acknowledged message is still served, by the slave.
        pc.brokers[0].kill()
        answers = await _answers(pc.namesrv_addr)
        if ("broker-a", 0) in answers:  # the name server may not have noticed yet
            assert answers["broker-a", 0].info is None
        assert await pull_bodies(pc.namesrv_addr, TOPIC, "CG-replicated") == set(acked)


async def test_slave_with_a_wrong_secret_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with process_cluster(
        tmp_path, slaves=1, slave_settings={"haSecret": "not-the-masters-secret"}
    ) as pc:
        await _registered(pc, following=False)
        await _topic(pc)
        async with Producer("PG-refused", pc.namesrv_addr) as producer:
            await producer.send(Message(TOPIC, b"stays on the master"))

        async def refused() -> bool:
            slave = (await _answers(pc.namesrv_addr)).get(("broker-a", 1))
            return slave is not None and bool(slave.info and slave.info.get("haRefusedReason"))

        await eventually_async(refused, SETTLE_S, what="the slave refused")
        answers = await _answers(pc.namesrv_addr)
        slave_info = answers["broker-a", 1].info
        assert slave_info is not None
        assert slave_info["commitLogMaxOffset"] == "0"
        assert slave_info["haConnected"] == "false"
        rows = await _cli_rows(pc.namesrv_addr, capsys)
        assert "refused" in rows[1]


async def test_dev_slave_runs_a_following_slave_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namesrv_port, master_port, slave_port = free_port(), free_broker_port(), free_broker_port()
    dev = ServerProcess(
        name="dev",
        args=[
            "dev",
            "--slave",
            "--namesrv-port",
            str(namesrv_port),
            "--broker-port",
            str(master_port),
            "--slave-port",
            str(slave_port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        port=slave_port,  # the last server to start
        log_path=tmp_path / "dev.log",
    )
    await dev.start()
    try:
        namesrv = f"127.0.0.1:{namesrv_port}"

        async def following() -> bool:
            slave = (await _answers(namesrv)).get(("broker-a", 1))
            return bool(slave and slave.info and slave.info.get("haConnected") == "true")

        await eventually_async(following, SETTLE_S, what="the dev slave following its master")
        rows = await _cli_rows(namesrv, capsys)
        assert [row[2:5] for row in rows] == [
            ["0", "ASYNC_MASTER", f"127.0.0.1:{master_port}"],
            ["1", "SLAVE", f"127.0.0.1:{slave_port}"],
        ]
        assert (tmp_path / "data" / "master").is_dir()
        assert (tmp_path / "data" / "slave").is_dir()
        assert f"slave 127.0.0.1:{slave_port}" in dev.log_tail()
    finally:
        assert await dev.stop() == 0


async def test_local_cluster_slaves_follow_and_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-process twin of process_cluster(slaves=...): two groups, one slave each."""
    settings = {"brokerRole": "SYNC_MASTER"}
    async with local_cluster(tmp_path, brokers=2, slaves=1, broker_settings=settings) as cluster:
        assert [len(group) for group in cluster.slaves] == [1, 1]
        wanted = {(f"broker-{g}", i) for g in "ab" for i in (0, 1)}

        async def all_following() -> bool:
            answers = await _answers(cluster.namesrv_addr)
            return set(answers) == wanted and all(
                a.info is not None and (a.broker_id == 0 or a.info.get("haConnected") == "true")
                for a in answers.values()
            )

        await eventually_async(all_following, SETTLE_S, what="both slaves following")
        async with Producer("PG-local", cluster.namesrv_addr) as producer:
            result = await producer.send(Message("TBW102", b"replicated"))
        assert result.status is SendStatus.SEND_OK
        slave = await cluster.restart_slave(0, 1)
        assert slave is cluster.slaves[0][0]
        await eventually_async(all_following, SETTLE_S, what="the restarted slave following")
        rows = await _cli_rows(cluster.namesrv_addr, capsys)
        assert [row[3] for row in rows] == ["SYNC_MASTER", "SLAVE"] * 2
