"""Admin bodies as Java's fastjson writes upstream's classes (keys sorted, enums by name, maps
keyed by MessageQueue with object keys), read back in both that form and TideMQ's older lists."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol._json import load_object, quote_keys, quote_numeric_keys, quote_object_keys
from tidemq.protocol.bodies import ConsumeStats, MessageQueue, OffsetWrapper, SubscriptionData
from tidemq.protocol.bodies_admin import (
    BrokerStatsData,
    BrokerStatsItem,
    ClientConnection,
    ConsumerConnection,
    ConsumerRunningInfo,
    ConsumeStatus,
    GroupList,
    ProcessQueueInfo,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
)
from tidemq.protocol.headers_admin import DeleteSubscriptionGroupRequestHeader

MQ = MessageQueue("T", "b", 0)
MQ_TEXT = b'{"brokerName":"b","queueId":0,"topic":"T"}'


def test_object_keys_become_strings_and_strings_stay_untouched() -> None:
    text = b'{"a":{{"k":"x}:{"}:1},"s":"{not:a key}","l":[{"x":{}}]}'
    assert quote_object_keys(text) == (
        b'{"a":{"{\\"k\\":\\"x}:{\\"}":1},"s":"{not:a key}","l":[{"x":{}}]}'
    )
    assert load_object(text, "t")["s"] == "{not:a key}"


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":{{"k":"x}:{"}:1},"s":"{not:a key}","l":[{"x":{}},{"y":1}]}',
        b'{"t":{ {"b":"q\\"}","i":0} : {"m":{0:"x"}}, {"b":"r","i":1}:{}},"n":{0:"a", -1:"b"}}',
        b'{"l":[{"a":1} , {"b":[1,{"c":2}]}],"s":",{0:1}"}',
    ],
)
def test_the_one_pass_rewrite_agrees_with_the_scanner(text: bytes) -> None:
    """quote_keys (flat object keys and numeric keys in one regex pass) writes what the general
    scanner followed by the numeric pass writes."""
    assert quote_keys(text) == quote_numeric_keys(quote_object_keys(text))


def test_nested_object_keys_fall_back_to_the_scanner() -> None:
    text = b'{"m":{{"k":{"deep":[1]}}:5}}'
    assert quote_keys(text) == text  # not a flat object: left for the scanner
    (key,) = load_object(text, "t")["m"]
    assert key == '{"k":{"deep":[1]}}'


def test_java_route_with_numeric_keys_loads() -> None:
    text = b'{"brokerDatas":[{"brokerAddrs":{0:"h:1",1:"h:2"},"brokerName":"b"}],"x":"{0:1}"}'
    doc = load_object(text, "route")
    assert doc["brokerDatas"][0]["brokerAddrs"] == {"0": "h:1", "1": "h:2"}
    assert doc["x"] == "{0:1}"


def test_delete_group_header_writes_clean_offset_and_reads_both() -> None:
    header = DeleteSubscriptionGroupRequestHeader(group_name="G", clean_offset=True)
    assert header.to_fields() == {"groupName": "G", "cleanOffset": "true"}
    assert DeleteSubscriptionGroupRequestHeader.from_fields(header.to_fields()) == header
    old = {"groupName": "G", "removeOffset": "true"}
    assert DeleteSubscriptionGroupRequestHeader.from_fields(old).clean_offset
    plain = DeleteSubscriptionGroupRequestHeader.from_fields({"groupName": "G"})
    assert not plain.clean_offset


@pytest.mark.parametrize(
    "bad",
    [
        b'{"offsetTable":{{"a":1',
        b'{"offsetTable":"x',
        b'{"offsetTable":{{}:1}}',
        b'{"offsetTable":{{"b":}:1}}',
        b'{"offsetTable":{' + MQ_TEXT + b':"x"}}',
    ],
)
def test_broken_object_keys_are_protocol_errors(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResetOffsetBody.from_json(bad)


def test_consume_stats_golden() -> None:
    stats = ConsumeStats({MQ: OffsetWrapper(9, 3, 7)}, 1.5)
    golden = (
        b'{"consumeTps":1.5,"offsetTable":{' + MQ_TEXT + b':{"brokerOffset":9,'
        b'"consumerOffset":3,"lastTimestamp":7}}}'
    )
    assert stats.to_json() == golden
    assert ConsumeStats.from_json(golden) == stats
    # fastjson's whitespace-free form with keys in another order reads the same.
    other = (
        b'{"offsetTable":{{"topic":"T","queueId":0,"brokerName":"b"}:{"lastTimestamp":7,'
        b'"consumerOffset":3,"brokerOffset":9,"pullOffset":3}},"consumeTps":1.5}'
    )
    assert ConsumeStats.from_json(other) == stats


def test_reset_offset_body_both_dialects() -> None:
    body = ResetOffsetBody({MQ: 5, MessageQueue("T", "b", 1): 6})
    assert body.to_json() == (
        b'{"offsetTable":{' + MQ_TEXT + b':5,{"brokerName":"b","queueId":1,"topic":"T"}:6}}'
    )
    cpp = body.to_json(list_form=True)
    assert cpp == (
        b'{"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","offset":5},'
        b'{"brokerName":"b","queueId":1,"topic":"T","offset":6}]}'
    )
    assert ResetOffsetBody.from_json(cpp) == body == ResetOffsetBody.from_json(body.to_json())


def test_connections_golden() -> None:
    conn = ClientConnection("10.0.0.1@1#a", "10.0.0.1:5000", "JAVA", 407)
    producer = ProducerConnection([conn])
    golden = (
        b'{"connectionSet":[{"clientAddr":"10.0.0.1:5000","clientId":"10.0.0.1@1#a",'
        b'"language":"JAVA","version":407}]}'
    )
    assert producer.to_json() == golden
    assert ProducerConnection.from_json(golden) == producer
    consumer = ConsumerConnection(
        [conn],
        {"T": SubscriptionData("T", "a || b", frozenset({"a", "b"}), frozenset({97, 98}), 3)},
        "CONSUME_PASSIVELY",
        "CLUSTERING",
        "CONSUME_FROM_FIRST_OFFSET",
    )
    encoded = consumer.to_json()
    assert encoded.startswith(b'{"connectionSet":[{"clientAddr"')
    assert b'"consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET","consumeType":"CONSUME_PASSIVELY",' in (
        encoded
    )
    assert b'"subscriptionTable":{"T":{"classFilterMode":false,"codeSet":[97,98],' in encoded
    assert ConsumerConnection.from_json(encoded) == consumer


def test_group_list_and_stats_golden() -> None:
    assert GroupList(["b", "a", "a"]).to_json() == b'{"groupList":["a","b"]}'
    data = BrokerStatsData(
        BrokerStatsItem(6, 0.1, 1.0), BrokerStatsItem(7, 0.2, 2.0), BrokerStatsItem(8, 0.3, 3.0)
    )
    golden = (
        b'{"statsDay":{"avgpt":3.0,"sum":8,"tps":0.3},"statsHour":{"avgpt":2.0,"sum":7,'
        b'"tps":0.2},"statsMinute":{"avgpt":1.0,"sum":6,"tps":0.1}}'
    )
    assert data.to_json() == golden
    assert BrokerStatsData.from_json(golden) == data


def test_consume_time_span_golden() -> None:
    body = QueryConsumeTimeSpanBody([QueueTimeSpan(MQ, 1, 9, 5, 3)])
    golden = (
        b'{"consumeTimeSpanSet":[{"consumeTimeStamp":5,"delayTime":3,"maxTimeStamp":9,'
        b'"messageQueue":' + MQ_TEXT + b',"minTimeStamp":1}]}'
    )
    assert body.to_json() == golden
    assert QueryConsumeTimeSpanBody.from_json(golden) == body


def test_running_info_golden() -> None:
    info = ConsumerRunningInfo(
        properties={"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY"},
        subscription_set=[SubscriptionData("T")],
        mq_table={MQ: ProcessQueueInfo(commit_offset=4, cached_msg_count=2, locked=True)},
        status_table={"T": ConsumeStatus(consume_ok_tps=2.5)},
    )
    encoded = info.to_json()
    assert encoded.startswith(b'{"mqTable":{' + MQ_TEXT + b':{"cachedMsgCount":2,')
    assert b'"commitOffset":4,"droped":false,' in encoded
    assert b'"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"},"statusTable":{"T":' in encoded
    assert ConsumerRunningInfo.from_json(encoded) == info
    assert info["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"


READERS: list[Any] = [
    ResetOffsetBody,
    ConsumerRunningInfo,
    ConsumerConnection,
    ProducerConnection,
    BrokerStatsData,
    GroupList,
    QueryConsumeTimeSpanBody,
]


@pytest.mark.parametrize("cls", READERS, ids=lambda c: c.__name__)
@given(data=st.binary(max_size=64) | st.sampled_from([b"{{", b'{"offsetTable":{{}:1}}', b"[]"]))
def test_readers_raise_only_protocol_error(cls: Any, data: bytes) -> None:
    try:
        cls.from_json(data)
    except ProtocolError:
        pass
