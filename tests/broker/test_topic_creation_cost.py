"""When topic changes reach the disk: at once for admin changes, at the end of the turn for
auto-creation, and creating many topics costs O(topics), not O(topics^2) (issue 18).

Issue 18 made creating many topics cheap by writing the table once per burst, first 0.5 s after the
burst's first change (then spaced again by the config writer): a topic created 2 s before a kill -9
was gone after the restart. The rule now (topics.py module doc): put/delete rewrite topics.json
before the call returns; auto-created topics are appended to its journal at the end of the loop
turn that created them (one line each, no serialization of the whole table), folded into
topics.json now and then.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_broker_topics import _table

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.registration import (
    ROUND_GAP_FACTOR,
    ROUND_SPACING_MIN_TOPICS,
    RegistrationService,
)
from tidemq.broker.topics import JOURNAL_FOLD_MIN, TopicTable
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.message import TBW102
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer
from tidemq.testing import eventually

TOPICS = 5_000


def _after_a_crash(tmp_path: Path) -> TopicTable:
    """What a broker killed now would load at its restart."""
    table = _table(tmp_path)
    table.load()
    return table


def _count_serializations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real_wrapper = TopicTable.wrapper

    def counting(self: TopicTable):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real_wrapper(self)

    monkeypatch.setattr(TopicTable, "wrapper", counting)
    return calls


async def test_new_topics_are_on_disk_at_the_end_of_their_turn(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.persist()  # as the broker does at start
    assert table.create_from_default("Burst0", TBW102, 4) is not None
    assert table.create_from_default("Burst1", TBW102, 4) is not None
    assert "Burst0" not in _after_a_crash(tmp_path)  # nothing written by the creating calls
    await asyncio.sleep(0)  # the end of this turn: the next loop iteration, no timer
    restarted = _after_a_crash(tmp_path)
    assert "Burst0" in restarted  # both lines of one append (they share its version)
    assert "Burst1" in restarted
    assert restarted.data_version == table.data_version
    table.ensure("%RETRY%G", 1)  # a later turn: written at its own end
    await asyncio.sleep(0)
    assert "%RETRY%G" in _after_a_crash(tmp_path)
    await table.flush()


async def test_creating_many_topics_serializes_the_table_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One topic per turn (the worst case, a producer sending one at a time): the table is
    serialized only when the journal is folded (every half table), not per topic."""
    table = _table(tmp_path)
    table.persist()
    serialized = _count_serializations(monkeypatch)
    for n in range(TOPICS):
        table.ensure(f"Many{n}", 1)
        await asyncio.sleep(0)
    # Folds at JOURNAL_FOLD_MIN lines, then every half table: a geometric series.
    assert 1 <= serialized[0] <= 12
    journal = tmp_path / "topics.json.journal"
    assert len(journal.read_bytes().splitlines()) <= max(JOURNAL_FOLD_MIN, len(table) // 2)
    restarted = _after_a_crash(tmp_path)
    assert all(f"Many{n}" in restarted for n in range(TOPICS))
    await table.flush()
    assert journal.read_bytes() == b""  # folded at shutdown
    topics_json = json.loads((tmp_path / "topics.json").read_bytes())["topicConfigTable"]
    assert f"Many{TOPICS - 1}" in topics_json


async def test_an_admin_change_is_on_disk_when_the_call_returns(tmp_path: Path) -> None:
    table = _table(tmp_path)
    config = TopicConfig(topic_name="Admin", read_queue_nums=8, write_queue_nums=8)
    assert table.put(config)
    assert _after_a_crash(tmp_path).get("Admin") == config  # no await: the answer follows
    assert table.delete("Admin")
    assert "Admin" not in _after_a_crash(tmp_path)


async def test_a_fold_interrupted_before_the_truncation_replays_nothing_old(
    tmp_path: Path,
) -> None:
    """A crash between a fold's topics.json write and the journal's truncation: the journal's
    lines are older than the file's version, and a topic deleted since must stay deleted."""
    table = _table(tmp_path)
    table.persist()
    table.ensure("Gone", 1)
    await asyncio.sleep(0)
    journal = tmp_path / "topics.json.journal"
    kept = journal.read_bytes()
    assert table.delete("Gone")  # a fold: topics.json without it, the journal emptied
    journal.write_bytes(kept + b'{"dataVersion": {"coun')  # as if not emptied, plus a torn line
    restarted = _after_a_crash(tmp_path)
    assert "Gone" not in restarted
    assert restarted.data_version == table.data_version
    await table.flush()


async def test_a_stop_writes_a_change_still_waiting(tmp_path: Path) -> None:
    table = _table(tmp_path)
    assert table.create_from_default("Last", TBW102, 4) is not None
    await table.flush()  # in the creating turn: the stop must not lose it
    assert "Last" in json.loads((tmp_path / "topics.json").read_bytes())["topicConfigTable"]


async def test_a_failed_write_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(tmp_path)
    table.persist()
    monkeypatch.setattr("tidemq.broker.topics.WRITE_RETRY_S", 0.01)
    failures = [1]
    real_append = TopicTable._append

    def failing_once(self: TopicTable, topics: list[str]) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError(28, "No space left on device")
        real_append(self, topics)

    monkeypatch.setattr(TopicTable, "_append", failing_once)
    table.ensure("Retried", 1)
    await asyncio.sleep(0)  # the end of the turn: the append fails
    assert failures == [0]
    assert "Retried" not in _after_a_crash(tmp_path)
    await eventually(lambda: "Retried" in _after_a_crash(tmp_path), what="the retried write")
    await table.flush()


@pytest.mark.parametrize(("topics", "spaced"), [(10, False), (ROUND_SPACING_MIN_TOPICS, True)])
async def test_registration_rounds_are_spaced_only_for_a_large_table(
    tmp_path: Path, topics: int, spaced: bool
) -> None:
    """A slow round (here 0.3 s, as under load) must not delay a small table's next round: a new
    topic's route would wait and producers fall back to TBW102's queues. A large table's
    rounds are spaced (ROUND_GAP_FACTOR x the last round's duration) to spare the name servers."""
    loop = asyncio.get_running_loop()
    arrivals: list[float] = []

    async def on_register(connection: Any, request: RemotingCommand) -> RemotingCommand:
        arrivals.append(loop.time())
        if len(arrivals) == 1:
            await asyncio.sleep(0.3)  # a slow first round
        return request.response(ResponseCode.SUCCESS)

    handlers = HandlerTable()
    handlers.register(RequestCode.REGISTER_BROKER, on_register)
    namesrv = RemotingServer(handlers, "127.0.0.1", 0)
    await namesrv.start()
    client = RemotingClient()
    table = _table(tmp_path)
    for n in range(topics - len(table)):
        table.ensure(f"Many{n}", 1)
    try:
        config = BrokerConfig(namesrv_addrs=(f"127.0.0.1:{namesrv.port}",))
        service = RegistrationService(config, BrokerAddress("127.0.0.1", 20911), table, client)
        await service.register_all()
        asked = loop.time()
        await service.register_all()
        waited = arrivals[1] - asked
        if spaced:
            assert waited >= 0.3 * ROUND_GAP_FACTOR * 0.9
        else:
            assert waited < 0.3 * ROUND_GAP_FACTOR / 2
    finally:
        await client.close()
        await namesrv.stop()


async def test_a_topic_created_during_the_first_round_is_registered_after_start(
    tmp_path: Path,
) -> None:
    """The broker awaits its first round before start(), its port already open: a topic created
    meanwhile (an admin's, once a name server published the broker) is in the round start()
    runs at once, not registerNameServerPeriod later."""
    bodies: list[bytes] = []
    release = asyncio.Event()

    async def on_register(connection: Any, request: RemotingCommand) -> RemotingCommand:
        bodies.append(request.body)
        await release.wait()
        return request.response(ResponseCode.SUCCESS)

    handlers = HandlerTable()
    handlers.register(RequestCode.REGISTER_BROKER, on_register)
    namesrv = RemotingServer(handlers, "127.0.0.1", 0)
    await namesrv.start()
    client = RemotingClient()
    table = _table(tmp_path)
    config = BrokerConfig(namesrv_addrs=(f"127.0.0.1:{namesrv.port}",))
    service = RegistrationService(config, BrokerAddress("127.0.0.1", 20911), table, client)
    try:
        first = asyncio.create_task(service.register_all())
        await eventually(lambda: len(bodies) == 1, what="the first round's request")
        table.ensure("CreatedMeanwhile", 1)
        release.set()
        await first
        service.start()
        await eventually(lambda: len(bodies) == 2, what="a round after start()")
        assert b"CreatedMeanwhile" not in bodies[0]
        assert b"CreatedMeanwhile" in bodies[1]
    finally:
        await service.stop()
        await table.flush()
        await client.close()
        await namesrv.stop()
