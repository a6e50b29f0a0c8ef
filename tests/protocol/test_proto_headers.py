"""Typed headers: round trips for every header, the spec's captured client headers, leniency."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol import headers, headers_admin, headers_query, headers_send
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    PullSysFlag,
    QueryMessageRequestHeader,
    RegisterBrokerRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
)

HEADER_CLASSES = sorted(
    {
        value
        for module in (headers_send, headers_query, headers_admin)
        for name, value in vars(module).items()
        if name.endswith("Header") and not name.startswith("_") and isinstance(value, type)
    },
    key=lambda cls: cls.__name__,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# "" reads back as absent or as the default for some fields, so strings are non-empty here.
NONEMPTY_TEXT = st.text(min_size=1, max_size=20)
_STRATEGY_BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "int": INT64,
    "int | None": st.none() | INT64,
    "str": NONEMPTY_TEXT,
    "str | None": st.none() | NONEMPTY_TEXT,
    "bool": st.booleans(),
}


def header_strategy(cls: type) -> st.SearchStrategy[Any]:
    """Every field drawn from the strategy for its annotated type (the test may reflect)."""
    return st.builds(
        cls, **{field.name: _STRATEGY_BY_TYPE[str(field.type)] for field in dataclasses.fields(cls)}
    )


def test_every_header_class_is_exported_from_headers() -> None:
    assert len(HEADER_CLASSES) >= 40
    for cls in HEADER_CLASSES:
        assert getattr(headers, cls.__name__) is cls
        assert cls.__name__ in headers.__all__


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_round_trip(cls: Any, data: st.DataObject) -> None:
    header = data.draw(header_strategy(cls))
    fields = header.to_fields()
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in fields.items())
    assert cls.from_fields(fields) == header


@given(header=header_strategy(SendMessageRequestHeader))
def test_send_header_round_trips_in_both_spellings(header: SendMessageRequestHeader) -> None:
    v1 = header.to_fields()
    v2 = header.to_fields(v2=True)
    assert set(v2) <= set("abcdefghijklmn")
    assert len(v1) == len(v2)
    assert SendMessageRequestHeader.from_fields(v1) == header
    assert SendMessageRequestHeader.from_fields(v2) == header


def _decode_json_frame(ext_fields_json: str, code: int) -> dict[str, str]:
    """A request frame as the client sent it, through the real frame decoder."""
    header = f'{{"code":{code},"extFields":{ext_fields_json},"flag":0,"language":"CPP",'
    header += '"opaque":1,"serializeTypeCurrentRPC":"JSON","version":405}'
    raw = header.encode()
    frame = struct.pack(">II", 4 + len(raw), len(raw)) + raw
    (command,) = FrameDecoder().feed(frame)
    return command.ext_fields


CPP_SEND_FIELDS = (
    '{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"x","batch":"0",'
    '"bornTimestamp":"1795215785500","defaultTopic":"TBW102","defaultTopicQueueNums":4,"flag":0,'
    '"producerGroup":"PG_TEST","properties":"KEYS\\u0001k1 k2\\u0002TAGS\\u0001TagA\\u0002'
    'WAIT\\u0001true\\u0002","queueId":0,"reconsumeTimes":"0","sysFlag":0,"topic":"TopicA",'
    '"unitMode":"0"}'
)
ALI_ONS_SEND_FIELDS = (
    '{"a":"PG_JS","b":"TopicJ","c":"TBW102","d":4,"e":2,"f":0,"g":1795215912654,"h":0,'
    '"i":"TAGS\\u0001TagJ\\u0002KEYS\\u0001kj1\\u0002","j":0,"k":false}'
)


def test_cpp_send_header_from_the_spec() -> None:
    header = SendMessageRequestHeader.from_fields(_decode_json_frame(CPP_SEND_FIELDS, 10))
    assert header == SendMessageRequestHeader(
        producer_group="PG_TEST",
        topic="TopicA",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1795215785500,
        flag=0,
        properties="KEYS\x01k1 k2\x02TAGS\x01TagA\x02WAIT\x01true\x02",
        reconsume_times=0,
        unit_mode=False,
        batch=False,
    )


def test_cpp_batch_flag_one_is_a_batch() -> None:
    fields = _decode_json_frame(CPP_SEND_FIELDS.replace('"batch":"0"', '"batch":"1"'), 10)
    assert SendMessageRequestHeader.from_fields(fields).batch is True


def test_ali_ons_v2_send_header_from_the_spec() -> None:
    header = SendMessageRequestHeader.from_fields(_decode_json_frame(ALI_ONS_SEND_FIELDS, 310))
    assert header.producer_group == "PG_JS"
    assert header.topic == "TopicJ"
    assert header.queue_id == 2
    assert header.born_timestamp == 1795215912654
    assert header.properties == "TAGS\x01TagJ\x02KEYS\x01kj1\x02"
    assert header.unit_mode is False
    assert header.batch is False
    assert header.max_reconsume_times is None


def test_pull_header_with_cpp_string_sub_version() -> None:
    fields = _decode_json_frame(
        '{"commitOffset":"0","consumerGroup":"CG","expressionType":"TAG","maxMsgNums":32,'
        '"queueId":1,"queueOffset":"7","subVersion":"1795215785519","subscription":"TagA || TagB",'
        '"suspendTimeoutMillis":"15000","sysFlag":6,"topic":"TopicA"}',
        11,
    )
    header = PullMessageRequestHeader.from_fields(fields)
    assert header.sub_version == 1795215785519
    assert header.queue_offset == 7
    assert header.max_msg_nums == 32
    assert PullSysFlag(header.sys_flag) == PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION


def test_send_back_header_from_ali_ons() -> None:
    fields = _decode_json_frame(
        '{"offset":0,"group":"CG_JS","delayLevel":0,"originMsgId":"7F00","originTopic":"TopicJ",'
        '"unitMode":false,"maxReconsumeTimes":16}',
        36,
    )
    header = ConsumerSendMsgBackRequestHeader.from_fields(fields)
    assert header == ConsumerSendMsgBackRequestHeader(
        offset=0,
        group="CG_JS",
        delay_level=0,
        origin_msg_id="7F00",
        origin_topic="TopicJ",
        unit_mode=False,
        max_reconsume_times=16,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("False", False), ("0", False)],
)
def test_booleans_are_lenient(text: str, expected: bool) -> None:
    fields = {
        "producerGroup": "PG",
        "tranStateTableOffset": "1",
        "commitLogOffset": "2",
        "commitOrRollback": "8",
        "fromTransactionCheck": text,
        "msgId": "M",
    }
    assert EndTransactionRequestHeader.from_fields(fields).from_transaction_check is expected


def test_invalid_boolean_names_the_field() -> None:
    fields = RegisterBrokerRequestHeader(
        broker_name="b", broker_addr="a", cluster_name="c", ha_server_addr="h", broker_id=0
    ).to_fields()
    fields["compressed"] = "yes"
    with pytest.raises(ProtocolError, match="compressed"):
        RegisterBrokerRequestHeader.from_fields(fields)


def test_missing_required_field_names_it() -> None:
    fields = PullMessageResponseHeader(next_begin_offset=1, min_offset=0, max_offset=2).to_fields()
    del fields["maxOffset"]
    with pytest.raises(ProtocolError, match="maxOffset"):
        PullMessageResponseHeader.from_fields(fields)


@pytest.mark.parametrize("bad", ["", "x", "1.5", "0x10", "99999999999999999999"])
def test_invalid_integer_names_the_field(bad: str) -> None:
    with pytest.raises(ProtocolError, match="queueId"):
        headers.GetMaxOffsetRequestHeader.from_fields({"topic": "T", "queueId": bad})


def test_empty_optional_numbers_are_absent() -> None:
    fields = SendMessageRequestHeader(
        producer_group="PG", topic="T", queue_id=0, born_timestamp=1
    ).to_fields()
    fields["maxReconsumeTimes"] = ""
    assert SendMessageRequestHeader.from_fields(fields).max_reconsume_times is None


def test_unregister_client_empty_groups_are_none() -> None:
    header = UnregisterClientRequestHeader.from_fields(
        {"clientID": "1-127.0.0.1@DEFAULT", "producerGroup": "PG", "consumerGroup": ""}
    )
    assert header.producer_group == "PG"
    assert header.consumer_group is None
    assert "consumerGroup" not in header.to_fields()


def test_send_response_carries_java_extras() -> None:
    fields = SendMessageResponseHeader(msg_id="M", queue_id=1, queue_offset=2).to_fields()
    assert fields == {
        "msgId": "M",
        "queueId": "1",
        "queueOffset": "2",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    # Every value survives the JSON header as a JSON string (C++ ignores non-strings).
    assert all(isinstance(value, str) for value in orjson.loads(orjson.dumps(fields)).values())


def test_unique_key_query_field_only_when_set() -> None:
    plain = QueryMessageRequestHeader(
        topic="T", key="k", max_num=32, begin_timestamp=0, end_timestamp=1
    )
    assert "_UNIQUE_KEY_QUERY" not in plain.to_fields()
    unique = dataclasses.replace(plain, unique_key_query=True)
    assert unique.to_fields()["_UNIQUE_KEY_QUERY"] == "true"


def test_create_topic_defaults_for_sparse_admin_requests() -> None:
    header = CreateTopicRequestHeader.from_fields(
        {"topic": "T", "readQueueNums": "8", "writeQueueNums": "8"}
    )
    assert header.default_topic == "TBW102"
    assert header.perm == 6
    assert header.topic_filter_type == "SINGLE_TAG"
    assert header.order is False


def test_headers_are_frozen() -> None:
    header = PullMessageResponseHeader(next_begin_offset=1, min_offset=0, max_offset=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.max_offset = 3  # type: ignore[misc]
