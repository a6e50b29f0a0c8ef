"""SendHeader: the send request header as the send handler reads it, parsed on the hot path.

Every single send parses one header, and `SendMessageRequestHeader.from_fields` costs more than
the rest of the handler's own work: a frozen keyword-only dataclass of fourteen fields is slow
to build, and each integer goes through a helper call. `parse_send_header` reads the fields
every client sends in their plain form (V2 letters or V1 names, decimal digits, "true"/"false")
straight into a plain slotted object; anything else (a negative or padded number, "1" for true,
a missing field) goes the careful way, `SendMessageRequestHeader.from_fields`, which also names
what is wrong. The two agree field for field (tests/broker/test_send_header.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.protocol.headers import PLAIN_DIGITS_MAX, SendMessageRequestHeader
from tidemq.protocol.headers_send import SEND_V1_KEYS, SEND_V2_KEYS, is_v2_send


@dataclass(slots=True)
class SendHeader:
    """SendMessageRequestHeader's fields, in its order and with its meanings."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None
    reconsume_times: int
    unit_mode: bool
    max_reconsume_times: int | None
    batch: bool
    broker_name: str | None


def parse_send_header(fields: Mapping[str, str]) -> SendHeader:
    """The send header of a request's extFields, either spelling.

    Raises:
        ProtocolError: a field is missing or malformed (from the careful parser).
    """
    keys = SEND_V2_KEYS if is_v2_send(fields) else SEND_V1_KEYS
    get = fields.get
    group, topic, default_topic = get(keys[0]), get(keys[1]), get(keys[2])
    nums, queue_id, sys_flag = get(keys[3]), get(keys[4]), get(keys[5])
    born, flag = get(keys[6]), get(keys[7])
    reconsume = get(keys[9]) or "0"
    unit_mode, batch = get(keys[10]) or "false", get(keys[12]) or "false"
    if (
        group is not None
        and topic is not None
        and default_topic is not None
        and nums is not None
        and queue_id is not None
        and sys_flag is not None
        and born is not None
        and flag is not None
        and 0 < len(nums) <= PLAIN_DIGITS_MAX
        and 0 < len(queue_id) <= PLAIN_DIGITS_MAX
        and 0 < len(sys_flag) <= PLAIN_DIGITS_MAX
        and 0 < len(born) <= PLAIN_DIGITS_MAX
        and 0 < len(flag) <= PLAIN_DIGITS_MAX
        and len(reconsume) <= PLAIN_DIGITS_MAX
        and keys[11] not in fields
        and (digits := nums + queue_id + sys_flag + born + flag + reconsume).isdigit()
        and digits.isascii()
        and (unit_mode == "false" or unit_mode == "true")
        and (batch == "false" or batch == "true")
    ):
        return SendHeader(
            group,
            topic,
            default_topic,
            int(nums),
            int(queue_id),
            int(sys_flag),
            int(born),
            int(flag),
            get(keys[8]),
            int(reconsume),
            unit_mode == "true",
            None,
            batch == "true",
            get(keys[13]) or None,
        )
    return _careful(SendMessageRequestHeader.from_fields(fields))


def _careful(header: SendMessageRequestHeader) -> SendHeader:
    return SendHeader(
        header.producer_group,
        header.topic,
        header.default_topic,
        header.default_topic_queue_nums,
        header.queue_id,
        header.sys_flag,
        header.born_timestamp,
        header.flag,
        header.properties,
        header.reconsume_times,
        header.unit_mode,
        header.max_reconsume_times,
        header.batch,
        header.broker_name,
    )
