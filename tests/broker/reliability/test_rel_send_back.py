"""CONSUMER_SEND_MSG_BACK and the retry/DLQ rules (remoting.md §4.9, §4.1 step 5, §9)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from broker_harness import Harness, running_broker
from rel_harness import FAST_LEVELS, first_stored, send_back, send_with, wait_for_messages

from tidemq.broker.handlers.send_back import redirect_exhausted
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import SCHEDULE_TOPIC_XXXX, encode_properties, is_true_text
from tidemq.store.types import MessageToStore


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_broker(tmp_path / "store", messageDelayLevel=FAST_LEVELS) as harness:
        yield harness


async def test_send_back_parks_then_delivers_to_the_retry_topic(broker: Harness) -> None:
    assert (
        await broker.send("TopicR", b"hello", properties={"TAGS": "A", "UNIQ_KEY": "U1"})
    ).code == 0
    original = await first_stored(broker, "TopicR")
    response = await send_back(broker, original.physical_offset)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert broker.app.topics.get("%RETRY%CG") is not None
    # delay level 0 -> 3 + reconsumeTimes(0) = level 3: SCHEDULE_TOPIC_XXXX queue 2.
    assert broker.app.store.max_offset(SCHEDULE_TOPIC_XXXX, 2) == 1
    [retried], _ = await wait_for_messages(broker, "%RETRY%CG")
    props = retried.property_map()
    assert retried.body == b"hello"
    assert retried.reconsume_times == 1
    assert props["RETRY_TOPIC"] == "TopicR"
    assert props["RECONSUME_TIME"] == "1"
    assert props["ORIGIN_MESSAGE_ID"]
    assert props["TAGS"] == "A"
    assert props["UNIQ_KEY"] == "U1"
    assert "DELAY" not in props
    assert "__TAGSCODE#" not in props


async def test_negative_level_goes_straight_to_the_dlq(broker: Harness) -> None:
    await broker.send("TopicR", b"poison")
    original = await first_stored(broker, "TopicR")
    assert (await send_back(broker, original.physical_offset, delay_level=-1)).code == 0
    dead = await first_stored(broker, "%DLQ%CG")
    assert dead.body == b"poison"
    assert dead.property_map()["RETRY_TOPIC"] == "TopicR"
    assert broker.app.topics.get("%DLQ%CG") is not None


async def test_reaching_max_reconsume_times_goes_to_the_dlq(broker: Harness) -> None:
    await broker.send("TopicR", b"x")
    original = await first_stored(broker, "TopicR")
    assert (await send_back(broker, original.physical_offset, max_reconsume_times=1)).code == 0
    [retried], _ = await wait_for_messages(broker, "%RETRY%CG")
    first_origin = retried.property_map()["ORIGIN_MESSAGE_ID"]
    assert (await send_back(broker, retried.physical_offset, max_reconsume_times=1)).code == 0
    dead = await first_stored(broker, "%DLQ%CG")
    assert dead.reconsume_times == 2
    assert dead.property_map()["ORIGIN_MESSAGE_ID"] == first_origin
    assert dead.property_map()["RETRY_TOPIC"] == "TopicR"


async def test_max_reconsume_times_header_ignored_before_v3_4_9(broker: Harness) -> None:
    await broker.send("TopicR", b"x")
    original = await first_stored(broker, "TopicR")
    # Version 120 (< V3_4_9 = 121): the header's 0 is not honoured, the group's 16 is.
    response = await send_back(broker, original.physical_offset, max_reconsume_times=0, version=120)
    assert response.code == 0
    [retried], _ = await wait_for_messages(broker, "%RETRY%CG")
    assert retried.reconsume_times == 1
    assert broker.app.topics.get("%DLQ%CG") is None
    # A direct send to the retry topic likewise.
    sent = await send_with(
        broker, "%RETRY%CG", b"y", {}, reconsume_times=3, max_reconsume_times=1, version=120
    )
    assert sent.code == 0
    assert broker.app.store.max_offset("%RETRY%CG", 0) >= 1
    assert broker.app.topics.get("%DLQ%CG") is None
    # From 121 on it is.
    sent = await send_with(
        broker, "%RETRY%CG", b"z", {}, reconsume_times=3, max_reconsume_times=1, version=121
    )
    assert sent.code == 0
    assert (await first_stored(broker, "%DLQ%CG")).body == b"z"


async def test_group_retry_max_times_applies_without_header(broker: Harness) -> None:
    await send_with(broker, "TopicR", b"x", {}, reconsume_times=0)
    original = await first_stored(broker, "TopicR")
    broker.app.groups.find_or_create("CG")
    group = broker.app.groups.get("CG")
    assert group is not None
    assert group.retry_max_times == 16
    assert (await send_back(broker, original.physical_offset)).code == 0
    assert broker.app.store.max_offset("%DLQ%CG", 0) == 0


async def test_unknown_offset_is_a_system_error(broker: Harness) -> None:
    await broker.send("TopicR", b"x")
    response = await send_back(broker, 10_000_000)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "10000000" in (response.remark or "")


async def test_direct_send_to_retry_topic_past_the_limit_goes_to_the_dlq(broker: Harness) -> None:
    response = await send_with(broker, "%RETRY%CG", b"late", {"DELAY": "2"}, reconsume_times=16)
    assert response.code == 0, response.remark
    dead = await first_stored(broker, "%DLQ%CG")
    assert dead.body == b"late"
    assert "DELAY" not in dead.property_map()
    # Below the limit the send is stored (and delayed) as asked.
    ok = await send_with(broker, "%RETRY%CG", b"soon", {"DELAY": "1"}, reconsume_times=3)
    assert ok.code == 0
    [retried], _ = await wait_for_messages(broker, "%RETRY%CG")
    assert retried.body == b"soon"


async def test_redirect_exhausted_leaves_its_argument_alone(broker: Harness) -> None:
    message = MessageToStore(
        topic="%RETRY%CG",
        queue_id=1,
        body=b"x",
        flag=0,
        properties=encode_properties({"DELAY": "3"}),
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
        reconsume_times=5,
    )
    before = dataclasses.replace(message)
    redirected = redirect_exhausted(message, 1, broker.app.groups, broker.app.topics)
    assert (redirected.topic, redirected.queue_id) == ("%DLQ%CG", 0)
    assert "DELAY" not in redirected.properties
    assert message == before


def test_one_lenient_flag_parser() -> None:
    assert [is_true_text(v) for v in ("true", " TRUE ", "1", "false", "0", "yes", "", None)] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
        False,
    ]


async def test_send_back_with_an_illegal_group_name_creates_nothing(broker: Harness) -> None:
    await broker.send("TopicR", b"x")
    original = await first_stored(broker, "TopicR")
    response = await send_back(broker, original.physical_offset, group="C@G")
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert broker.app.groups.get("C@G") is None
    assert broker.app.topics.get("%RETRY%C@G") is None
