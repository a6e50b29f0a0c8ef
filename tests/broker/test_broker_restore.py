"""message_from_stored: one rule for re-storing a record (schedule, timer, half, send-back)."""

from __future__ import annotations

from tidemq.broker.restore import message_from_stored
from tidemq.protocol import record as rec
from tidemq.protocol.message import decode_properties, encode_properties


def _stored() -> rec.StoredMessage:
    props = encode_properties({"TAGS": "A", "__TAGSCODE#": "99", "UNIQ_KEY": "U"})
    data = rec.encode_record(
        topic="T",
        queue_id=3,
        body=b"payload",
        flag=7,
        properties=props,
        sys_flag=8,
        born_timestamp=111,
        born_host=("10.0.0.1", 5000),
        store_timestamp=222,
        store_host=("10.0.0.2", 10911),
        reconsume_times=2,
        prepared_transaction_offset=0,
        queue_offset=0,
        physical_offset=0,
    )
    return rec.decode_record(data)


def test_carries_the_record_and_drops_the_stores_own_properties() -> None:
    stored = _stored()
    props = stored.property_map()
    message = message_from_stored(stored, topic="R", queue_id=1, properties=props)
    assert (message.topic, message.queue_id, message.body, message.flag) == ("R", 1, b"payload", 7)
    assert (message.sys_flag, message.born_timestamp, message.born_host) == (
        8,
        111,
        stored.born_host,
    )
    assert (message.store_host, message.reconsume_times) == (stored.store_host, 2)
    assert message.store_timestamp is None
    assert decode_properties(message.properties) == {"TAGS": "A", "UNIQ_KEY": "U"}
    assert "__CRC32#" in props  # the caller's dict is left alone
    changed = message_from_stored(
        stored,
        topic="R",
        queue_id=1,
        properties=props,
        sys_flag=0,
        store_host=("h", 1),
        reconsume_times=5,
        prepared_transaction_offset=42,
        store_timestamp=222,
    )
    assert (changed.sys_flag, changed.store_host, changed.reconsume_times) == (0, ("h", 1), 5)
    assert (changed.prepared_transaction_offset, changed.store_timestamp) == (42, 222)
