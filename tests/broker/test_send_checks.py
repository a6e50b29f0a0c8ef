"""The send handler remembers which topics passed its checks until the topic table changes.

A send to a remembered topic skips the name, permission and existence checks and, with no delay
or timer property, the DelayRouter; every change of the table (a new perm, a deletion, another
topic's creation) forgets them, so the next send is checked again.
"""

from __future__ import annotations

from pathlib import Path

from broker_harness import Harness, running_broker

from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import ResponseCode

TOPIC = "TopicChecked"


def _config(perm: int, queue_nums: int = 2) -> TopicConfig:
    return TopicConfig(
        topic_name=TOPIC, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm
    )


async def test_a_perm_change_reaches_a_remembered_topic(broker: Harness) -> None:
    broker.app.topics.put(_config(perm=6))
    assert (await broker.send(TOPIC, b"a")).code == ResponseCode.SUCCESS
    broker.app.topics.put(_config(perm=4))  # read only
    response = await broker.send(TOPIC, b"b")
    assert response.code == ResponseCode.NO_PERMISSION
    broker.app.topics.put(_config(perm=6))
    assert (await broker.send(TOPIC, b"c")).code == ResponseCode.SUCCESS
    assert broker.app.store.max_offset(TOPIC, 0) == 2


async def test_a_queue_count_change_reaches_a_remembered_topic(broker: Harness) -> None:
    broker.app.topics.put(_config(perm=6, queue_nums=2))
    assert (await broker.send(TOPIC, b"a", queue_id=1)).code == ResponseCode.SUCCESS
    broker.app.topics.put(_config(perm=6, queue_nums=1))
    assert (await broker.send(TOPIC, b"b", queue_id=1)).code == ResponseCode.SYSTEM_ERROR


async def test_a_deleted_topic_is_not_remembered(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", autoCreateTopicEnable="false") as broker:
        broker.app.topics.put(_config(perm=6))
        assert (await broker.send(TOPIC, b"a")).code == ResponseCode.SUCCESS
        assert broker.app.topics.delete(TOPIC)
        assert (await broker.send(TOPIC, b"b")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_delay_and_timer_properties_still_park_on_a_remembered_topic(
    broker: Harness,
) -> None:
    assert (await broker.send(TOPIC, b"plain")).code == ResponseCode.SUCCESS
    assert (await broker.send(TOPIC, b"later", properties={"DELAY": "3"})).code == 0
    bad = await broker.send(TOPIC, b"bad", properties={"TIMER_DELAY_SEC": "soon"})
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL  # the DelayRouter saw it
    assert broker.app.store.max_offset(TOPIC, 0) == 1
    assert broker.app.store.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 1


async def test_an_oversized_body_is_refused_on_a_remembered_topic(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store", maxMessageSize="100") as broker:
        assert (await broker.send(TOPIC, b"a")).code == ResponseCode.SUCCESS
        response = await broker.send(TOPIC, b"x" * 101)
        assert response.code == ResponseCode.MESSAGE_ILLEGAL
