"""Bad input answers the spec's code with a remark, and never loses stored messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_harness import Harness, messages, running_broker

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand


async def test_oversized_body_is_13(tmp_path: Path) -> None:
    async with running_broker(tmp_path, maxMessageSize="1024") as broker:
        response = await broker.send("TopicO", b"x" * 1025)
        assert response.code == ResponseCode.MESSAGE_ILLEGAL
        assert "1025" in (response.remark or "")
        assert (await broker.send("TopicO", b"x" * 1024)).code == ResponseCode.SUCCESS


@pytest.mark.parametrize("topic", ["bad topic", "a/b", "x" * 128, ""])
async def test_illegal_topic_name_is_system_error(broker: Harness, topic: str) -> None:
    response = await broker.send(topic, b"x")
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"])
async def test_system_topic_is_refused(broker: Harness, topic: str) -> None:
    response = await broker.send(topic, b"x")
    assert response.code == ResponseCode.NO_PERMISSION


async def test_broker_without_write_permission(tmp_path: Path) -> None:
    async with running_broker(tmp_path, brokerPermission="4") as broker:
        response = await broker.send("TopicP", b"x")
        assert response.code == ResponseCode.NO_PERMISSION
        assert "forbidden" in (response.remark or "")


async def test_topic_without_write_permission(broker: Harness) -> None:
    from tidemq.protocol.bodies import TopicConfig

    broker.app.topics.put(
        TopicConfig(topic_name="TopicRO", read_queue_nums=1, write_queue_nums=1, perm=4)
    )
    assert (await broker.send("TopicRO", b"x")).code == ResponseCode.NO_PERMISSION


async def test_queue_id_out_of_range(broker: Harness) -> None:
    assert (await broker.send("TopicQ", b"x")).code == ResponseCode.SUCCESS  # 4 queues
    response = await broker.send("TopicQ", b"x", queue_id=4)
    assert response.code == ResponseCode.SYSTEM_ERROR
    pulled = await broker.pull("TopicQ", queue_id=4)
    assert pulled.code == ResponseCode.SYSTEM_ERROR
    assert "nextBeginOffset" in pulled.ext_fields


async def test_negative_queue_id_lets_the_broker_choose(broker: Harness) -> None:
    ids = set()
    for _ in range(8):
        response = await broker.send("TopicR", b"x", queue_id=-1)
        assert response.code == ResponseCode.SUCCESS
        ids.add(int(response.ext_fields["queueId"]))
    assert ids == {0, 1, 2, 3}


async def test_unknown_topic_without_auto_create_is_17(tmp_path: Path) -> None:
    async with running_broker(tmp_path, autoCreateTopicEnable="false") as broker:
        assert (await broker.send("TopicU", b"x")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_missing_header_field_is_system_error(broker: Harness) -> None:
    cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE, ext_fields={"topic": "T"})
    response = await broker.call(cmd)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "producerGroup" in (response.remark or "")


async def test_malformed_pull_header_still_carries_the_pull_fields(broker: Harness) -> None:
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields={"topic": "T", "queueId": "x"})
    response = await broker.call(cmd)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert {
        k: response.ext_fields.get(k) for k in ("nextBeginOffset", "minOffset", "maxOffset")
    } == {
        "nextBeginOffset": "0",
        "minOffset": "0",
        "maxOffset": "0",
    }
    assert "suggestWhichBrokerId" in response.ext_fields


@pytest.mark.parametrize("props", [{"DELAY": "x3"}, {"TIMER_DELIVER_MS": "soon"}])
async def test_malformed_delay_is_stored_undelayed_or_refused(
    broker: Harness, props: dict[str, str]
) -> None:
    # A DELAY that is not a number is ignored (Java's parse fails the same way: no delay); a
    # TIMER_* property that is not a number is refused. Neither is parked.
    response = await broker.send("TopicX", b"x", properties=props)
    if "DELAY" in props:
        assert response.code == ResponseCode.SUCCESS
        assert broker.app.store.max_offset("TopicX", 0) == 1
    else:
        assert response.code == ResponseCode.MESSAGE_ILLEGAL
        assert "TIMER_DELIVER_MS" in (response.remark or "")
        assert broker.app.store.max_offset("TopicX", 0) == 0
    assert broker.app.store.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 0


async def test_disconnect_mid_request_leaves_the_broker_serving(broker: Harness) -> None:
    from tidemq.remoting.client import RemotingClient

    other = RemotingClient()
    other_harness = Harness(broker.app, other)
    sends = [asyncio.create_task(other_harness.send("TopicD", b"%d" % i)) for i in range(20)]
    await asyncio.sleep(0)
    await other.close()
    await asyncio.gather(*sends, return_exceptions=True)
    assert (await broker.send("TopicD", b"after")).code == ResponseCode.SUCCESS
    bodies = [m.body for m in messages(await broker.pull("TopicD"))]
    assert bodies[-1] == b"after"


async def test_full_disk_refuses_with_14_and_keeps_what_was_stored(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        for i in range(3):
            assert (await broker.send("TopicF", b"%d" % i)).code == ResponseCode.SUCCESS
    async with running_broker(tmp_path, diskMaxUsedSpaceRatio="0") as broker:
        response = await broker.send("TopicF", b"refused")
        assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "disk" in (response.remark or "").lower()
        assert [m.body for m in messages(await broker.pull("TopicF"))] == [b"0", b"1", b"2"]


async def test_a_peer_repeating_bad_sends_gets_a_few_short_log_lines(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Every refusal is answered, but one connection's refusals are logged a few per window,
    each clipped: 50 sends with a 100 KB illegal topic name must not write 50 times 100 KB."""
    import logging

    from tidemq.remoting.log_limit import LOG_LINES_PER_WINDOW_MAX, PEER_ERROR_LOG_CHARS_MAX

    caplog.set_level(logging.INFO, logger="tidemq")
    huge = "t/" + "x" * 100_000
    for _ in range(50):
        response = await broker.send(huge, b"x")
        assert response.code == ResponseCode.SYSTEM_ERROR
    refused = [r for r in caplog.records if "refused with" in r.getMessage()]
    assert 1 <= len(refused) <= LOG_LINES_PER_WINDOW_MAX
    assert all(len(r.getMessage()) < PEER_ERROR_LOG_CHARS_MAX + 300 for r in refused)
    assert not any(r.exc_info for r in caplog.records)
