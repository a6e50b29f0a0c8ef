"""protocol/trace.py against records laid out as upstream's TraceDataEncoder writes them."""

from __future__ import annotations

import pytest

from tidemq.errors import ProtocolError
from tidemq.protocol import trace as tr

A, B = "\x01", "\x02"
MSG_ID = "7F00000100002A9F0000000000000001"
OFFSET_ID = "7F00000100002A9F0000000000001234"

# What a Java 4.9 / 5.x producer with tracing on writes for one send (14 fields), tags unset.
JAVA_PUB = (
    A.join(
        [
            "Pub",
            "1764064800123",
            "DefaultRegion",
            "PG",
            "TopicA",
            MSG_ID,
            "null",
            "k1 k2",
            "127.0.0.1:10911",
            "11",
            "5",
            "0",
            OFFSET_ID,
            "true",
        ]
    )
    + B
)
JAVA_SUB_BEFORE = (
    A.join(["SubBefore", "1764064800200", "DefaultRegion", "CG", "req-1", MSG_ID, "2", "k1 k2"]) + B
)
JAVA_SUB_AFTER = (
    A.join(["SubAfter", "req-1", MSG_ID, "7", "false", "k1 k2", "4", "1764064800207", "CG"]) + B
)
JAVA_END_TX = (
    A.join(
        [
            "EndTransaction",
            "1764064800300",
            "DefaultRegion",
            "PG_TX",
            "TxTopic",
            MSG_ID,
            "TagA",
            "null",
            "127.0.0.1:10911",
            "2",
            "tx-9",
            "ROLLBACK_MESSAGE",
            "true",
        ]
    )
    + B
)


def test_decodes_each_upstream_record_type() -> None:
    pub, before, after, end = tr.decode_records(
        JAVA_PUB + JAVA_SUB_BEFORE + JAVA_SUB_AFTER + JAVA_END_TX
    )
    assert pub == tr.TraceRecord(
        tr.PUB,
        timestamp=1764064800123,
        group="PG",
        topic="TopicA",
        msg_id=MSG_ID,
        tags="",
        keys="k1 k2",
        store_host="127.0.0.1:10911",
        body_length=11,
        cost_time=5,
        msg_type=tr.MSG_TYPE_NORMAL,
        offset_msg_id=OFFSET_ID,
        success=True,
    )
    assert (before.trace_type, before.group, before.request_id) == (tr.SUB_BEFORE, "CG", "req-1")
    assert (before.msg_id, before.retry_times, before.keys) == (MSG_ID, 2, "k1 k2")
    assert (after.trace_type, after.success, after.context_code) == (tr.SUB_AFTER, False, 4)
    assert (after.cost_time, after.timestamp, after.group) == (7, 1764064800207, "CG")
    assert end.transaction_state == tr.ROLLBACK_MESSAGE
    assert (end.transaction_id, end.from_transaction_check, end.keys) == ("tx-9", True, "")
    assert (end.msg_type, end.tags, end.topic) == (tr.MSG_TYPE_TRANS_COMMIT, "TagA", "TxTopic")


@pytest.mark.parametrize("golden", [JAVA_PUB, JAVA_SUB_BEFORE, JAVA_SUB_AFTER, JAVA_END_TX])
def test_encoding_what_was_decoded_gives_upstreams_bytes_back(golden: str) -> None:
    (record,) = tr.decode_records(golden)
    assert tr.encode_record(record) == golden


def test_older_layouts_still_decode() -> None:
    old_pub = A.join([*JAVA_PUB.rstrip(B).split(A)[:12], "true"]) + B  # 13: no offset id
    old_after = A.join(["SubAfter", "r", MSG_ID, "3", "true", "k"]) + B  # before contextCode
    with_client_host = JAVA_PUB.rstrip(B) + A + "10.0.0.9" + B  # 15 fields
    pub13, after6, pub15 = tr.decode_records(old_pub + old_after + with_client_host)
    assert (pub13.offset_msg_id, pub13.success) == ("", True)
    assert (after6.context_code, after6.timestamp, after6.group) == (0, 0, "")
    assert (pub15.client_host, pub15.offset_msg_id) == ("10.0.0.9", OFFSET_ID)


def test_an_eight_field_sub_after_keeps_its_timestamp() -> None:
    # Java 4.9.x / 5.0 consumers write contextCode and the time but no group.
    golden = A.join(["SubAfter", "req-2", MSG_ID, "9", "true", "k1", "0", "1764064800999"]) + B
    (after,) = tr.decode_records(golden)
    assert (after.timestamp, after.group, after.context_code) == (1764064800999, "", 0)
    assert (after.cost_time, after.success, after.keys) == (9, True, "k1")


def test_absent_text_is_written_as_java_null_so_no_record_ends_in_an_empty_field() -> None:
    text = tr.encode_record(tr.TraceRecord(tr.SUB_BEFORE, timestamp=1, group="CG", msg_id="M"))
    fields = text.rstrip(B).split(A)
    assert fields[-1] == "null"  # keys: Java's split would drop a trailing empty field
    assert len(fields) == 8


def test_keys_of_a_trace_message_are_each_msg_id_and_key_once() -> None:
    records = tr.decode_records(JAVA_PUB + JAVA_SUB_BEFORE + JAVA_END_TX)
    assert tr.trace_keys(records) == [MSG_ID, "k1", "k2"]


def test_unknown_types_are_skipped_and_short_known_records_refused() -> None:
    assert tr.decode_records("Recall" + A + "1" + B + JAVA_SUB_BEFORE)[0].trace_type == (
        tr.SUB_BEFORE
    )
    with pytest.raises(ProtocolError, match="SubBefore"):
        tr.decode_records(A.join(["SubBefore", "1", "r"]) + B)
    with pytest.raises(ProtocolError, match="timestamp"):
        tr.decode_records(JAVA_PUB.replace("1764064800123", "soon"))


def test_a_field_holding_a_separator_is_refused() -> None:
    with pytest.raises(ValueError, match="separator"):
        tr.encode_record(tr.TraceRecord(tr.PUB, keys="a" + B + "b"))
