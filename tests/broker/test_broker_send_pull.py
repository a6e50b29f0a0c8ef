"""Send and pull over a real socket: round trips, V1/V2 headers, batches, filters, result codes."""

from __future__ import annotations

import json

import pytest
from broker_harness import Harness, messages

from tidemq.broker.handlers.pull import pull_response_code
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand, decode_frame
from tidemq.protocol.headers import PullMessageResponseHeader, SendMessageResponseHeader
from tidemq.protocol.message import (
    BatchItem,
    SysFlag,
    decode_offset_msg_id,
    deflate,
    encode_batch,
    encode_properties,
)
from tidemq.store.types import GetStatus


async def test_send_then_pull_round_trip(broker: Harness) -> None:
    response = await broker.send("TopicA", b"hello", properties={"TAGS": "TagA", "WAIT": "true"})
    assert response.code == ResponseCode.SUCCESS, response.remark
    header = SendMessageResponseHeader.from_fields(response.ext_fields)
    assert header.queue_id == 0
    assert header.queue_offset == 0
    assert response.ext_fields["MSG_REGION"] == "DefaultRegion"
    host, port, physical = decode_offset_msg_id(header.msg_id)
    assert (host, port) == ("127.0.0.1", broker.app.port)

    pulled = await broker.pull("TopicA")
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark
    fields = PullMessageResponseHeader.from_fields(pulled.ext_fields)
    assert (fields.next_begin_offset, fields.min_offset, fields.max_offset) == (1, 0, 1)
    [msg] = messages(pulled)
    assert msg.body == b"hello"
    assert msg.topic == "TopicA"
    assert msg.physical_offset == physical
    props = msg.property_map()
    assert props["TAGS"] == "TagA"
    assert props["CLUSTER"] == "DefaultCluster"
    assert "WAIT" not in props
    assert msg.store_host == ("127.0.0.1", broker.app.port)


async def test_v2_header_with_cpp_style_numeric_ext_fields(broker: Harness) -> None:
    # A hand-built frame whose extFields carry JSON numbers and booleans, as ali-ons sends.
    header = {
        "a": "PG_JS",
        "b": "TopicJ",
        "c": "TBW102",
        "d": 4,
        "e": 2,
        "f": 0,
        "g": 1795215912654,
        "h": 0,
        "i": "TAGS\u0001TagJ\u0002",
        "j": 0,
        "k": False,
    }
    raw = json.dumps(
        {
            "code": 310,
            "language": "JAVA",
            "opaque": 1,
            "flag": 0,
            "version": 121,
            "extFields": header,
        }
    ).encode()
    cmd = decode_frame(len(raw).to_bytes(4, "big") + raw)
    assert cmd.ext_fields["d"] == "4"
    cmd.body = b"js"
    response = await broker.call(cmd)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["queueId"] == "2"
    pulled = await broker.pull("TopicJ", queue_id=2)
    assert [m.body for m in messages(pulled)] == [b"js"]


async def test_v1_long_names_code_10(broker: Harness) -> None:
    response = await broker.send("TopicV1", b"x", queue_id=1, code=RequestCode.SEND_MESSAGE)
    assert response.code == ResponseCode.SUCCESS
    response = await broker.send("TopicV1", b"y", queue_id=1, code=RequestCode.SEND_MESSAGE_V2)
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["queueOffset"] == "1"
    pulled = await broker.pull("TopicV1", queue_id=1)
    assert [m.body for m in messages(pulled)] == [b"x", b"y"]


def _cpp_batch_fields(topic: str, *, sys_flag: int = 0) -> dict[str, str]:
    # C++ 1.2.3: code 10, long names, batch "1", outer properties without UNIQ_KEY.
    return {
        "producerGroup": "PG_TEST",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": str(sys_flag),
        "bornTimestamp": "1795215785500",
        "flag": "0",
        "batch": "1",
        "reconsumeTimes": "0",
        "unitMode": "0",
        "properties": encode_properties({"WAIT": "true", "outer": "o"}),
    }


def _batch_items() -> list[BatchItem]:
    return [
        BatchItem(
            flag=7,
            body=b"m%d" % i * 2000,
            properties=encode_properties({"UNIQ_KEY": f"U{i}", "TAGS": "TagA", "WAIT": "true"}),
        )
        for i in range(3)
    ]


@pytest.mark.parametrize("compressed", [False, True])
async def test_cpp_batch_is_split(broker: Harness, compressed: bool) -> None:
    body = encode_batch(_batch_items())
    sys_flag = 0
    if compressed:
        body, sys_flag = deflate(body), SysFlag.COMPRESSED
    cmd = RemotingCommand(
        code=RequestCode.SEND_MESSAGE,
        ext_fields=_cpp_batch_fields("TopicB", sys_flag=sys_flag),
        body=body,
    )
    response = await broker.call(cmd)
    assert response.code == ResponseCode.SUCCESS, response.remark
    msg_ids = response.ext_fields["msgId"].split(",")
    assert len(msg_ids) == 3
    assert response.ext_fields["queueOffset"] == "0"
    stored = messages(await broker.pull("TopicB"))
    assert [m.queue_offset for m in stored] == [0, 1, 2]
    assert [m.body for m in stored] == [b"m%d" % i * 2000 for i in range(3)]
    for i, m in enumerate(stored):
        assert m.sys_flag & SysFlag.COMPRESSED == 0
        assert m.flag == 7
        props = m.property_map()
        assert props["UNIQ_KEY"] == f"U{i}"
        assert props["outer"] == "o"
        assert props["CLUSTER"] == "DefaultCluster"
        assert "WAIT" not in props
        assert decode_offset_msg_id(msg_ids[i])[2] == m.physical_offset


async def test_batch_code_320(broker: Harness) -> None:
    response = await broker.send(
        "TopicJB", encode_batch(_batch_items()), code=RequestCode.SEND_BATCH_MESSAGE, batch=True
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert len(messages(await broker.pull("TopicJB"))) == 3


async def test_single_compressed_message_is_stored_as_sent(broker: Harness) -> None:
    body = deflate(b"z" * 5000)
    response = await broker.send("TopicZ", body, sys_flag=SysFlag.COMPRESSED)
    assert response.code == ResponseCode.SUCCESS
    [m] = messages(await broker.pull("TopicZ"))
    assert m.body == body
    assert m.sys_flag & SysFlag.COMPRESSED


async def test_tag_filter(broker: Harness) -> None:
    for tag in ("TagA", "TagB", "TagA"):
        assert (await broker.send("TopicT", tag.encode(), properties={"TAGS": tag})).code == 0
    pulled = await broker.pull("TopicT", subscription="TagA || TagC")
    assert [m.body for m in messages(pulled)] == [b"TagA", b"TagA"]
    assert pulled.ext_fields["nextBeginOffset"] == "3"
    none = await broker.pull("TopicT", subscription="TagC")
    assert none.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert none.ext_fields["nextBeginOffset"] == "3"


@pytest.mark.parametrize("status", list(GetStatus))
@pytest.mark.parametrize("offset", [0, 5])
def test_pull_result_code_table(status: GetStatus, offset: int) -> None:
    expected = {
        GetStatus.FOUND: 0,
        GetStatus.NO_MATCHED_LOGIC_QUEUE: 21 if offset else 19,
        GetStatus.NO_MESSAGE_IN_QUEUE: 21 if offset else 19,
        GetStatus.OFFSET_TOO_SMALL: 21,
        GetStatus.OFFSET_OVERFLOW_ONE: 19,
        GetStatus.OFFSET_OVERFLOW_BADLY: 21,
        GetStatus.NO_MATCHED_MESSAGE: 20,
        GetStatus.MESSAGE_WAS_REMOVING: 20,
    }[status]
    assert pull_response_code(status, offset) == expected


async def test_pull_result_codes_over_the_wire(broker: Harness) -> None:
    empty = await broker.pull("TopicE")
    assert empty.code == ResponseCode.TOPIC_NOT_EXIST
    assert set(empty.ext_fields) >= _PULL_FIELDS
    await broker.send("TopicE", b"1", queue_id=0)
    cases = [
        (1, 0, ResponseCode.PULL_NOT_FOUND, 0),  # queue 1 exists but is empty, offset 0
        (1, 5, ResponseCode.PULL_OFFSET_MOVED, 0),  # empty queue, offset != 0
        (0, 1, ResponseCode.PULL_NOT_FOUND, 1),  # offset == max
        (0, 9, ResponseCode.PULL_OFFSET_MOVED, 1),  # offset > max → max
    ]
    for queue_id, offset, code, next_begin in cases:
        response = await broker.pull("TopicE", queue_id=queue_id, offset=offset)
        assert response.code == code, (queue_id, offset, response.remark)
        assert set(response.ext_fields) >= _PULL_FIELDS
        assert response.ext_fields["nextBeginOffset"] == str(next_begin)


_PULL_FIELDS = {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}
