"""JSON bodies: round trips, the spec's captured bodies, fastjson/C++ dialects, bad input."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol._json import quote_numeric_keys
from tidemq.protocol.bodies import (
    BrokerData,
    ClusterInfo,
    ConsumerData,
    ConsumerListBody,
    ConsumeStats,
    DataVersion,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    ProducerData,
    QueueData,
    RegisterBrokerBody,
    SubscriptionData,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicOffset,
    TopicRouteData,
    TopicStatsTable,
    UnlockBatchRequestBody,
)
from tidemq.protocol.message import ConsumeFromWhere, ConsumeType, MessageModel

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789_-%|", min_size=1, max_size=12)
TEXT = st.text(max_size=16)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)

DATA_VERSIONS = st.builds(DataVersion, timestamp=I64, counter=I64)
TOPIC_CONFIGS = st.builds(
    TopicConfig,
    topic_name=NAME,
    read_queue_nums=I32,
    write_queue_nums=I32,
    perm=st.integers(0, 15),
    topic_filter_type=st.sampled_from(["SINGLE_TAG", "MULTI_TAG"]),
    topic_sys_flag=I32,
    order=st.booleans(),
)
WRAPPERS = st.builds(
    TopicConfigSerializeWrapper,
    topic_config_table=st.dictionaries(NAME, TOPIC_CONFIGS, max_size=4),
    data_version=DATA_VERSIONS,
)
QUEUE_DATAS = st.builds(
    QueueData,
    broker_name=NAME,
    read_queue_nums=I32,
    write_queue_nums=I32,
    perm=I32,
    topic_sys_flag=I32,
)
BROKER_DATAS = st.builds(
    BrokerData,
    cluster=TEXT,
    broker_name=NAME,
    broker_addrs=st.dictionaries(st.integers(0, 2**63 - 1), TEXT, max_size=3),
)
MESSAGE_QUEUES = st.builds(MessageQueue, topic=NAME, broker_name=NAME, queue_id=I32)
SUBSCRIPTIONS = st.builds(
    SubscriptionData,
    topic=NAME,
    sub_string=TEXT,
    tags_set=st.frozensets(TEXT, max_size=3),
    code_set=st.frozensets(I32, max_size=3),
    sub_version=I64,
    expression_type=st.sampled_from(["TAG", "SQL92"]),
    class_filter_mode=st.booleans(),
)
CONSUMER_DATAS = st.builds(
    ConsumerData,
    group_name=NAME,
    consume_type=st.sampled_from(ConsumeType),
    message_model=st.sampled_from(MessageModel),
    consume_from_where=st.sampled_from(ConsumeFromWhere),
    subscription_data_set=st.lists(SUBSCRIPTIONS, max_size=3),
    unit_mode=st.booleans(),
)

ROUND_TRIPS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (DataVersion, DATA_VERSIONS),
    (TopicConfig, TOPIC_CONFIGS),
    (TopicConfigSerializeWrapper, WRAPPERS),
    (
        RegisterBrokerBody,
        st.builds(
            RegisterBrokerBody,
            topic_config_wrapper=WRAPPERS,
            filter_server_list=st.lists(TEXT, max_size=3),
        ),
    ),
    (
        TopicRouteData,
        st.builds(
            TopicRouteData,
            queue_datas=st.lists(QUEUE_DATAS, max_size=3),
            broker_datas=st.lists(BROKER_DATAS, max_size=3),
            filter_server_table=st.dictionaries(TEXT, st.lists(TEXT, max_size=2), max_size=2),
            order_topic_conf=st.none() | TEXT,
        ),
    ),
    (
        ClusterInfo,
        st.builds(
            ClusterInfo,
            broker_addr_table=st.dictionaries(NAME, BROKER_DATAS, max_size=3),
            cluster_addr_table=st.dictionaries(NAME, st.lists(NAME, max_size=3), max_size=2),
        ),
    ),
    (TopicList, st.builds(TopicList, topic_list=st.lists(TEXT, max_size=4))),
    (KVTable, st.builds(KVTable, table=st.dictionaries(TEXT, TEXT, max_size=4))),
    (
        HeartbeatData,
        st.builds(
            HeartbeatData,
            client_id=TEXT,
            producer_data_set=st.lists(st.builds(ProducerData, group_name=NAME), max_size=2),
            consumer_data_set=st.lists(CONSUMER_DATAS, max_size=2),
        ),
    ),
    (ConsumerListBody, st.builds(ConsumerListBody, consumer_id_list=st.lists(TEXT, max_size=4))),
    (
        LockBatchRequestBody,
        st.builds(
            LockBatchRequestBody,
            consumer_group=NAME,
            client_id=TEXT,
            mq_set=st.frozensets(MESSAGE_QUEUES, max_size=4),
        ),
    ),
    (
        UnlockBatchRequestBody,
        st.builds(
            UnlockBatchRequestBody,
            consumer_group=NAME,
            client_id=TEXT,
            mq_set=st.frozensets(MESSAGE_QUEUES, max_size=4),
        ),
    ),
    (
        LockBatchResponseBody,
        st.builds(LockBatchResponseBody, lock_ok_mq_set=st.frozensets(MESSAGE_QUEUES, max_size=4)),
    ),
    (
        TopicStatsTable,
        st.builds(
            TopicStatsTable,
            offset_table=st.dictionaries(
                MESSAGE_QUEUES, st.builds(TopicOffset, I64, I64, I64), max_size=4
            ),
        ),
    ),
    (
        ConsumeStats,
        st.builds(
            ConsumeStats,
            offset_table=st.dictionaries(
                MESSAGE_QUEUES, st.builds(OffsetWrapper, I64, I64, I64), max_size=4
            ),
            consume_tps=st.floats(allow_nan=False, allow_infinity=False),
        ),
    ),
]


# Written as fastjson writes a Map<MessageQueue, V>: object keys, not standard JSON.
FASTJSON_MAP_FORM = (TopicStatsTable, ConsumeStats)


@pytest.mark.parametrize(("cls", "strategy"), ROUND_TRIPS, ids=lambda v: getattr(v, "__name__", ""))
@given(data=st.data())
def test_round_trip(cls: Any, strategy: st.SearchStrategy[Any], data: st.DataObject) -> None:
    body = data.draw(strategy)
    encoded = body.to_json()
    if cls not in FASTJSON_MAP_FORM:
        orjson.loads(encoded)  # standard JSON
    assert cls.from_json(encoded) == body


@pytest.mark.parametrize(("cls", "strategy"), ROUND_TRIPS, ids=lambda v: getattr(v, "__name__", ""))
@given(data=st.binary(max_size=64) | st.sampled_from([b"[]", b"{}", b"null", b'{"a":1}', b"1"]))
def test_readers_raise_only_protocol_error(cls: Any, strategy: Any, data: bytes) -> None:
    try:
        cls.from_json(data)
    except ProtocolError:
        pass


# ---------------------------------------------------------------------------------------------
# Route data (§3.1)

FASTJSON_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
    b'"orderTopicConf":"broker-a:4;broker-b:4",'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    b'"writeQueueNums":4}]}'
)


def test_fastjson_route_with_bare_numeric_keys() -> None:
    route = TopicRouteData.from_json(FASTJSON_ROUTE)
    assert route.broker_datas == [
        BrokerData(
            cluster="DefaultCluster",
            broker_name="broker-a",
            broker_addrs={0: "127.0.0.1:10911", 1: "127.0.0.1:10921"},
        )
    ]
    assert route.broker_datas[0].master_addr == "127.0.0.1:10911"
    assert route.queue_datas == [QueueData("broker-a", 4, 4, 6, 0)]
    assert route.order_topic_conf == "broker-a:4;broker-b:4"


def test_route_written_with_quoted_keys_and_no_order_conf() -> None:
    route = TopicRouteData(
        queue_datas=[QueueData("broker-a", 4, 4, 6)],
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})],
    )
    encoded = route.to_json()
    assert b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in encoded
    assert b"orderTopicConf" not in encoded


def test_old_topic_syn_flag_spelling() -> None:
    route = TopicRouteData.from_json(
        b'{"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":1,"topicSynFlag":3,'
        b'"writeQueueNums":1}]}'
    )
    assert route.queue_datas[0].topic_sys_flag == 3


def test_quote_numeric_keys_leaves_strings_alone() -> None:
    source = b'{0:"a,1:b", "k":"{2:x}", -3 : "\\"", 4:{5:[6,7]}}'
    assert orjson.loads(quote_numeric_keys(source)) == {
        "0": "a,1:b",
        "k": "{2:x}",
        "-3": '"',
        "4": {"5": [6, 7]},
    }


def test_cluster_info_with_fastjson_keys() -> None:
    info = ClusterInfo.from_json(
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"10.0.0.1:10911"},'
        b'"brokerName":"broker-a","cluster":"C"}},"clusterAddrTable":{"C":["broker-a"]}}'
    )
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: "10.0.0.1:10911"}
    assert info.cluster_addr_table == {"C": ["broker-a"]}


# ---------------------------------------------------------------------------------------------
# Register broker (§3.2)

REGISTER_BODY = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
    b'"timestamp":1700000000000},"topicConfigTable":{"TopicA":{"order":false,"perm":6,'
    b'"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicA","topicSysFlag":0,'
    b'"writeQueueNums":4}}}}'
)
TOPIC_A = TopicConfig("TopicA", 4, 4, 6)


def test_register_body_from_the_spec() -> None:
    body = RegisterBrokerBody.decode(REGISTER_BODY, compressed=False)
    assert body.topic_config_wrapper.data_version == DataVersion(1700000000000, 3)
    assert body.topic_config_wrapper.topic_config_table == {"TopicA": TOPIC_A}
    assert body.filter_server_list == []


def _compressed_register_body(topic_lines: list[str], filter_servers: bytes | None) -> bytes:
    """Laid out by hand from spec §3.2."""

    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    raw = chunk(b'{"counter":3,"timestamp":1700000000000}') + struct.pack(">i", len(topic_lines))
    raw += b"".join(chunk(line.encode()) for line in topic_lines)
    if filter_servers is not None:
        raw += chunk(filter_servers)
    return zlib.compress(raw)


def test_compressed_register_body() -> None:
    data = _compressed_register_body(
        ["TopicA 4 4 6 SINGLE_TAG", 'TopicB 8 2 4 MULTI_TAG {"x":"y"}'], b'["1.2.3.4:1"]'
    )
    body = RegisterBrokerBody.decode(data, compressed=True)
    assert body.topic_config_wrapper.data_version == DataVersion(1700000000000, 3)
    assert body.topic_config_wrapper.topic_config_table == {
        "TopicA": TOPIC_A,
        "TopicB": TopicConfig("TopicB", 8, 2, 4, "MULTI_TAG"),
    }
    assert body.filter_server_list == ["1.2.3.4:1"]


@pytest.mark.parametrize(
    "data",
    [
        b"not zlib",
        zlib.compress(b"\x00\x00\x00\x10{}"),
        _compressed_register_body(["TopicA 4 4"], b"[]"),
        _compressed_register_body(["TopicA x 4 6 SINGLE_TAG"], b"[]"),
        _compressed_register_body(["TopicA 4 4 6 NO_SUCH_TYPE"], b"[]"),
        _compressed_register_body([], b"{}"),
    ],
)
def test_bad_compressed_register_body(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        RegisterBrokerBody.decode(data, compressed=True)


def test_topic_filter_type_as_ordinal() -> None:
    config = TopicConfig.from_json(b'{"topicName":"T","topicFilterType":1,"perm":"6"}')
    assert config == TopicConfig("T", 16, 16, 6, "MULTI_TAG")


# ---------------------------------------------------------------------------------------------
# Heartbeat (§4.4)

CPP_HEARTBEAT = (
    b'{"clientID":"23736-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
    b'"consumeType":1,"groupName":"CG_TEST","messageModel":1,"subscriptionDataSet":['
    b'{"subString":"*","subVersion":"1795215785519","topic":"%RETRY%CG_TEST"},'
    b'{"codeSet":[0,0],"subString":"TagA || TagB","subVersion":"1795215785519",'
    b'"tagsSet":["TagA","TagB"],"topic":"TopicA"}]}],"producerDataSet":[{"groupName":"PG_TEST"}]}\n'
)


def test_cpp_heartbeat_from_the_spec() -> None:
    heartbeat = HeartbeatData.from_json(CPP_HEARTBEAT)
    assert heartbeat.client_id == "23736-127.0.0.1@DEFAULT"
    assert heartbeat.producer_data_set == [ProducerData("PG_TEST")]
    (consumer,) = heartbeat.consumer_data_set
    assert consumer.group_name == "CG_TEST"
    assert consumer.consume_type is ConsumeType.CONSUME_PASSIVELY
    assert consumer.message_model is MessageModel.CLUSTERING
    assert consumer.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    retry, topic = consumer.subscription_data_set
    assert retry == SubscriptionData(
        topic="%RETRY%CG_TEST", sub_string="*", sub_version=1795215785519
    )
    assert topic.tags_set == frozenset({"TagA", "TagB"})
    assert topic.code_set == frozenset({0})
    assert topic.expression_type == "TAG"
    assert topic.class_filter_mode is False


def test_cpp_heartbeat_without_data_sets() -> None:
    heartbeat = HeartbeatData.from_json(b'{"clientID":"1-127.0.0.1@DEFAULT"}\n')
    assert heartbeat == HeartbeatData(client_id="1-127.0.0.1@DEFAULT")


def test_java_style_heartbeat_with_enum_names() -> None:
    heartbeat = HeartbeatData.from_json(
        b'{"clientID":"127.0.0.1@123","consumerDataSet":[{"consumeFromWhere":'
        b'"CONSUME_FROM_FIRST_OFFSET","consumeType":"CONSUME_ACTIVELY","groupName":"G",'
        b'"messageModel":"BROADCASTING","subscriptionDataSet":[{"classFilterMode":false,'
        b'"codeSet":[2598919],"expressionType":"TAG","subString":"TagA","subVersion":17,'
        b'"tagsSet":["TagA"],"topic":"T"}],"unitMode":false}],"producerDataSet":[]}'
    )
    (consumer,) = heartbeat.consumer_data_set
    assert consumer.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert consumer.consume_type is ConsumeType.CONSUME_ACTIVELY
    assert consumer.message_model is MessageModel.BROADCASTING
    assert consumer.subscription_data_set[0].sub_version == 17


def test_heartbeat_writer_uses_java_enum_names() -> None:
    encoded = HeartbeatData(client_id="c", consumer_data_set=[ConsumerData("G")]).to_json()
    consumer = orjson.loads(encoded)["consumerDataSet"][0]
    assert consumer["consumeType"] == "CONSUME_PASSIVELY"
    assert consumer["messageModel"] == "CLUSTERING"
    assert consumer["consumeFromWhere"] == "CONSUME_FROM_LAST_OFFSET"


@pytest.mark.parametrize(
    "bad",
    [
        b'{"consumerDataSet":[]}',  # no clientID
        b'{"clientID":"c","consumerDataSet":[{"groupName":"G","consumeType":9}]}',
        b'{"clientID":"c","consumerDataSet":[{"groupName":"G","messageModel":"SOMETIMES"}]}',
        b'{"clientID":"c","consumerDataSet":{"groupName":"G"}}',
        b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":'
        b'[{"topic":"T","subVersion":"soon"}]}]}',
        b'{"clientID":"c"',
        b"[]",
    ],
)
def test_bad_heartbeats(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        HeartbeatData.from_json(bad)


# ---------------------------------------------------------------------------------------------
# Message queues and locks (§4.10)


def test_message_queue_order_and_hash() -> None:
    queues = [MessageQueue("B", "b", 0), MessageQueue("A", "b", 1), MessageQueue("A", "a", 2)]
    assert sorted(queues) == [queues[2], queues[1], queues[0]]
    assert len({MessageQueue("A", "a", 1), MessageQueue("A", "a", 1)}) == 1


def test_cpp_lock_request_with_trailing_newline() -> None:
    body = LockBatchRequestBody.from_json(
        b'{"clientId":"c1","consumerGroup":"CG","mqSet":[{"brokerName":"broker-a","queueId":0,'
        b'"topic":"TopicA"},{"brokerName":"broker-a","queueId":"1","topic":"TopicA"}]}\n'
    )
    assert body.mq_set == frozenset(
        {MessageQueue("TopicA", "broker-a", 0), MessageQueue("TopicA", "broker-a", 1)}
    )


def test_lock_response_key_spelling() -> None:
    encoded = LockBatchResponseBody(frozenset({MessageQueue("T", "b", 0)})).to_json()
    assert orjson.loads(encoded) == {
        "lockOKMQSet": [{"brokerName": "b", "queueId": 0, "topic": "T"}]
    }


def test_admin_stats_fastjson_map_form() -> None:
    table = TopicStatsTable({MessageQueue("T", "b", 1): TopicOffset(0, 10, 5)})
    assert table.to_json() == (
        b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
        b'{"lastUpdateTimestamp":5,"maxOffset":10,"minOffset":0}}}'
    )
    # TideMQ's older list form is still read.
    old = (
        b'{"offsetTable":[{"brokerName":"b","queueId":1,"topic":"T","minOffset":0,'
        b'"maxOffset":10,"lastUpdateTimestamp":5}]}'
    )
    assert TopicStatsTable.from_json(old) == table


# ---------------------------------------------------------------------------------------------
# Tolerant scalars


def test_scalars_in_their_other_dialects() -> None:
    stats = ConsumeStats.from_json(
        b'{"consumeTps":"2.5","offsetTable":[{"topic":"T","brokerName":"b","queueId":0.0,'
        b'"brokerOffset":"9","consumerOffset":3}]}'
    )
    assert stats.consume_tps == 2.5
    assert stats.offset_table == {MessageQueue("T", "b", 0): OffsetWrapper(9, 3, 0)}
    config = TopicConfig.from_json(b'{"topicName":7,"order":1,"perm":6}')
    assert config.topic_name == "7"
    assert config.order is True
    assert TopicConfig.from_json(b'{"topicName":"T","order":"true"}').order is True
    assert DataVersion.from_json(DataVersion(5, 6).to_json()) == DataVersion(5, 6)
    assert TopicConfig.from_json(config.to_json()) == config
    assert DataVersion(5, 6).next(now_ms=9) == DataVersion(9, 7)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"consumeTps":"fast"}',
        b'{"consumeTps":true}',
        b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":0.5}]}',
        b'{"offsetTable":[{"topic":["T"],"brokerName":"b","queueId":0}]}',
        b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":true}]}',
    ],
)
def test_bad_scalars(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        ConsumeStats.from_json(bad)


@pytest.mark.parametrize("order", [b"2", b'"maybe"', b"[]"])
def test_bad_booleans(order: bytes) -> None:
    with pytest.raises(ProtocolError):
        TopicConfig.from_json(b'{"topicName":"T","order":' + order + b"}")


def test_compressed_register_body_with_bad_utf8_or_bad_filter_list() -> None:
    bad_utf8 = zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">ii", 1, 1) + b"\xff")
    with pytest.raises(ProtocolError, match="UTF-8"):
        RegisterBrokerBody.decode(bad_utf8, compressed=True)
    with pytest.raises(ProtocolError):
        RegisterBrokerBody.decode(_compressed_register_body([], b"[nope"), compressed=True)
    # Without the trailing filter-server list (older brokers) the list is empty.
    assert (
        RegisterBrokerBody.decode(
            _compressed_register_body(["TopicA 4 4 6 0"], None), compressed=True
        ).filter_server_list
        == []
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=12,
)
HEARTBEAT_KEYS = ["clientID", "producerDataSet", "consumerDataSet", "groupName", "consumeType",
                  "messageModel", "consumeFromWhere", "subscriptionDataSet", "topic", "subVersion",
                  "tagsSet", "codeSet", "unitMode"]  # fmt: skip


@given(
    shape=st.recursive(
        JSON_VALUES,
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.sampled_from(HEARTBEAT_KEYS), children, max_size=5)
        ),
        max_leaves=20,
    )
)
def test_structured_junk_raises_only_protocol_error(shape: Any) -> None:
    data = json.dumps(shape).encode()
    for cls in (HeartbeatData, TopicRouteData, RegisterBrokerBody, ConsumeStats):
        try:
            cls.from_json(data)
        except ProtocolError:
            pass
