"""Fast paths of the protocol layer agree with the careful functions they stand for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.protocol.headers import SendMessageRequestHeader, send_fields_v2
from tidemq.protocol.message import (
    BatchItem,
    decode_batch,
    decode_batch_raw,
    encode_batch,
    offset_msg_id,
    offset_msg_ids,
)


@given(
    host=st.sampled_from(["127.0.0.1", "10.1.2.3", "255.255.255.255", "::1"]),
    port=st.integers(min_value=0, max_value=65535),
    offsets=st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=8),
)
def test_offset_msg_ids_equal_one_by_one(host: str, port: int, offsets: list[int]) -> None:
    assert offset_msg_ids(host, port, offsets) == [offset_msg_id(host, port, o) for o in offsets]


@given(
    items=st.lists(
        st.builds(
            BatchItem,
            flag=st.integers(min_value=-(2**31), max_value=2**31 - 1),
            body=st.binary(max_size=64),
            properties=st.text(max_size=16),
        ),
        max_size=6,
    )
)
def test_decode_batch_raw_matches_decode_batch(items: list[BatchItem]) -> None:
    body = encode_batch(items)
    assert decode_batch(body) == items
    assert decode_batch_raw(body) == [(i.flag, i.body, i.properties) for i in items]


_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    group=st.text(max_size=8),
    topic=st.text(max_size=8),
    ints=st.tuples(_INT, _INT, _INT, _INT, _INT),
    properties=st.none() | st.text(max_size=8),
    batch=st.booleans(),
    broker_name=st.none() | st.text(min_size=1, max_size=8),
)
def test_send_fields_v2_round_trip_to_the_header(
    group: str,
    topic: str,
    ints: tuple[int, int, int, int, int],
    properties: str | None,
    batch: bool,
    broker_name: str | None,
) -> None:
    queue_nums, queue_id, sys_flag, born, flag = ints
    fields = send_fields_v2(
        group,
        topic,
        "TBW102",
        queue_nums,
        queue_id,
        sys_flag,
        born,
        flag,
        properties,
        batch,
        broker_name,
    )
    assert SendMessageRequestHeader.from_fields(fields) == SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=queue_nums,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=born,
        flag=flag,
        properties=properties,
        batch=batch,
        broker_name=broker_name,
    )
    # The V2 alphabet's order, each letter present unless its value is absent; never "l".
    present = "abcdefgh" + ("i" if properties is not None else "") + "jkm"
    assert list(fields) == list(present + ("n" if broker_name is not None else ""))


@pytest.mark.parametrize(("properties", "broker_name"), [("P\x01v\x02", "b"), (None, None)])
def test_send_fields_v2_are_hand_written_letters(
    properties: str | None, broker_name: str | None
) -> None:
    fields = send_fields_v2("PG", "T", "TBW102", 4, 3, 0, 1700, 0, properties, True, broker_name)
    expected = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1700"}
    expected |= {"h": "0", "i": properties, "j": "0", "k": "false", "m": "true", "n": broker_name}
    assert fields == {k: v for k, v in expected.items() if v is not None}
