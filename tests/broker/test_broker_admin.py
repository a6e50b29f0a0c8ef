"""Admin and lookup requests: topics, stats, config, runtime info, view by id, query by key."""

from __future__ import annotations

import orjson
from broker_harness import Harness, messages

from tidemq.protocol.bodies import (
    ConsumeStats,
    KVTable,
    MessageQueue,
    TopicConfigSerializeWrapper,
    TopicStatsTable,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueryMessageRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from tidemq.protocol.message import decode_offset_msg_id


async def _admin(
    broker: Harness, code: int, fields: dict[str, str] | None = None
) -> RemotingCommand:
    return await broker.call(RemotingCommand(code=code, ext_fields=fields or {}))


async def test_create_list_stat_and_delete_a_topic(broker: Harness) -> None:
    create = CreateTopicRequestHeader(topic="TopicAdm", read_queue_nums=2, write_queue_nums=2)
    response = await _admin(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, create.to_fields())
    assert response.code == ResponseCode.SUCCESS, response.remark
    listed = TopicConfigSerializeWrapper.from_json(
        (await _admin(broker, RequestCode.GET_ALL_TOPIC_CONFIG)).body
    )
    assert listed.topic_config_table["TopicAdm"].write_queue_nums == 2
    await broker.send("TopicAdm", b"x", queue_id=1)
    stats_fields = GetTopicStatsInfoRequestHeader(topic="TopicAdm").to_fields()
    stats = TopicStatsTable.from_json(
        (await _admin(broker, RequestCode.GET_TOPIC_STATS_INFO, stats_fields)).body
    )
    q1 = stats.offset_table[MessageQueue("TopicAdm", "broker-a", 1)]
    assert (q1.min_offset, q1.max_offset) == (0, 1)
    assert q1.last_update_timestamp > 0
    delete = DeleteTopicRequestHeader(topic="TopicAdm").to_fields()
    assert (await _admin(broker, RequestCode.DELETE_TOPIC_IN_BROKER, delete)).code == 0
    assert broker.app.topics.get("TopicAdm") is None
    missing = await _admin(broker, RequestCode.GET_TOPIC_STATS_INFO, stats_fields)
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST


async def test_reserved_topic_names_are_refused(broker: Harness) -> None:
    for name in ("TBW102", "DefaultCluster", "SCHEDULE_TOPIC_XXXX"):
        create = CreateTopicRequestHeader(topic=name, read_queue_nums=1, write_queue_nums=1)
        response = await _admin(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, create.to_fields())
        assert response.code == ResponseCode.SYSTEM_ERROR


async def test_consume_stats_and_all_offsets(broker: Harness) -> None:
    await broker.send("TopicCS", b"a")
    await broker.send("TopicCS", b"b")
    commit = UpdateConsumerOffsetRequestHeader(
        consumer_group="CG", topic="TopicCS", queue_id=0, commit_offset=1
    )
    await _admin(broker, RequestCode.UPDATE_CONSUMER_OFFSET, commit.to_fields())
    fields = GetConsumeStatsRequestHeader(consumer_group="CG").to_fields()
    stats = ConsumeStats.from_json(
        (await _admin(broker, RequestCode.GET_CONSUME_STATS, fields)).body
    )
    q0 = stats.offset_table[MessageQueue("TopicCS", "broker-a", 0)]
    assert (q0.broker_offset, q0.consumer_offset) == (2, 1)
    offsets = orjson.loads((await _admin(broker, RequestCode.GET_ALL_CONSUMER_OFFSET)).body)
    assert offsets["offsetTable"]["TopicCS@CG"] == {"0": 1}
    bad = GetConsumeStatsRequestHeader(consumer_group="C@G", topic="TopicCS").to_fields()
    assert (await _admin(broker, RequestCode.GET_CONSUME_STATS, bad)).code == (
        ResponseCode.SYSTEM_ERROR
    )


async def test_broker_config_and_runtime_info(broker: Harness) -> None:
    config = await _admin(broker, RequestCode.GET_BROKER_CONFIG)
    assert b"brokerName=broker-a" in config.body
    assert "version" in config.ext_fields
    info = KVTable.from_json((await _admin(broker, RequestCode.GET_BROKER_RUNTIME_INFO)).body)
    assert info.table["brokerAddr"] == broker.addr


async def test_consumer_connection_list_offline(broker: Harness) -> None:
    response = await _admin(
        broker, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "CG_OFF"}
    )
    assert response.code == ResponseCode.CONSUMER_NOT_ONLINE


async def test_view_by_id_and_query_by_key(broker: Harness) -> None:
    sent = await broker.send("TopicK", b"keyed", properties={"KEYS": "k1 k2", "UNIQ_KEY": "U1"})
    _, _, physical = decode_offset_msg_id(sent.ext_fields["msgId"])
    view = await _admin(
        broker,
        RequestCode.VIEW_MESSAGE_BY_ID,
        ViewMessageRequestHeader(offset=physical).to_fields(),
    )
    assert [m.body for m in messages(view)] == [b"keyed"]
    bad = await _admin(
        broker, RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=10**9).to_fields()
    )
    assert bad.code == ResponseCode.SYSTEM_ERROR
    for key, found in (("k2", True), ("U1", True), ("nope", False)):
        query = QueryMessageRequestHeader(
            topic="TopicK", key=key, max_num=10, begin_timestamp=0, end_timestamp=2**62
        )
        response = await _admin(broker, RequestCode.QUERY_MESSAGE, query.to_fields())
        if found:
            assert response.code == ResponseCode.SUCCESS, key
            assert [m.body for m in messages(response)] == [b"keyed"]
        else:
            assert response.code == ResponseCode.QUERY_NOT_FOUND


async def test_unknown_request_code(broker: Harness) -> None:
    response = await _admin(broker, 9999)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
