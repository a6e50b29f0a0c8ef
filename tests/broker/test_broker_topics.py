"""Topic table: built-in topics, auto-create from TBW102, retry fallback, persistence, versions."""

from __future__ import annotations

import json
from pathlib import Path

from broker_harness import Harness, running_broker

from tidemq.broker.topics import TopicTable
from tidemq.clock import FakeClock
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import ResponseCode


def _table(tmp_path: Path, *, auto_create: bool = True) -> TopicTable:
    return TopicTable(
        tmp_path,
        FakeClock(),
        cluster_name="DefaultCluster",
        broker_name="broker-a",
        auto_create_topic_enable=auto_create,
        default_topic_queue_nums=8,
    )


def test_builtin_topics(tmp_path: Path) -> None:
    table = _table(tmp_path)
    tbw = table.get("TBW102")
    assert tbw is not None
    assert (tbw.perm, tbw.read_queue_nums, tbw.write_queue_nums) == (7, 8, 8)
    assert table.get("SCHEDULE_TOPIC_XXXX") is not None
    assert _table(tmp_path, auto_create=False).get("TBW102") is None


def test_auto_create_inherits_from_the_template(tmp_path: Path) -> None:
    table = _table(tmp_path)
    changes: list[int] = []
    table.add_change_listener(lambda: changes.append(table.data_version.counter))
    created = table.create_from_default("TopicA", "TBW102", 4)
    assert created == TopicConfig(
        topic_name="TopicA", read_queue_nums=4, write_queue_nums=4, perm=6
    )
    assert table.create_from_default("TopicB", "TBW102", 100) is not None
    assert table.get("TopicB").write_queue_nums == 8  # type: ignore[union-attr]
    assert changes == [1, 2]
    assert table.create_from_default("TopicC", "NoTemplate", 4) is None
    table.put(TopicConfig(topic_name="Plain", perm=6))
    assert table.create_from_default("TopicD", "Plain", 4) is None  # no INHERIT bit


def test_topics_json_shape_and_reload(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.create_from_default("TopicA", "TBW102", 4)
    doc = json.loads((tmp_path / "topics.json").read_text())
    assert doc["dataVersion"]["counter"] == 1
    assert doc["topicConfigTable"]["TopicA"] == {
        "order": False,
        "perm": 6,
        "readQueueNums": 4,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "TopicA",
        "topicSysFlag": 0,
        "writeQueueNums": 4,
    }
    again = _table(tmp_path)
    again.load()
    assert again.get("TopicA") == table.get("TopicA")
    assert again.data_version == table.data_version


async def test_send_auto_creates_and_persists(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        assert (await broker.send("TopicNew", b"x", default_topic_queue_nums=4)).code == 0
        created = broker.app.topics.get("TopicNew")
        assert created is not None
        assert created.write_queue_nums == 4
    async with running_broker(tmp_path) as broker:
        assert broker.app.topics.get("TopicNew") == created


async def test_retry_topic_fallback(broker: Harness) -> None:
    response = await broker.send("%RETRY%CG_R", b"x")
    assert response.code == ResponseCode.SUCCESS
    retry = broker.app.topics.get("%RETRY%CG_R")
    assert retry is not None
    assert (retry.write_queue_nums, retry.perm) == (1, 6)
    assert broker.app.groups.get("CG_R") is not None
