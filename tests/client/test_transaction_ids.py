"""The transactional producer reads the half message's commit-log offset from its offsetMsgId,
and builds its END_TRANSACTION fields directly: both agree with the careful functions."""

from __future__ import annotations

import pytest

from tidemq.client.transaction import LocalTransactionState
from tidemq.errors import ProtocolError
from tidemq.protocol.headers import EndTransactionRequestHeader, end_transaction_fields
from tidemq.protocol.message import decode_offset_msg_id, offset_msg_id
from tidemq.protocol.message_id import physical_offset_of


@pytest.mark.parametrize(
    "msg_id",
    [
        offset_msg_id("127.0.0.1", 10911, 0),
        offset_msg_id("10.1.2.3", 65535, 123_456_789_012),
        offset_msg_id("10.1.2.3", 1, 2**63 - 1),
        offset_msg_id("::1", 10911, 4096),
        offset_msg_id("10.1.2.3", 1, 77).lower(),
        "FFFFFFFF0000000080000000000000FF",  # a negative offset reads as decode reads it
        "7F000001" + "0000" + "2A9F" + "00000000000010" + "0G",  # not hexadecimal
        "7F000001 0002A9F00000000000001000",  # a space: fromhex would skip it
        "7F0000010002A9F0000000000000100",  # one character short
        "",
    ],
)
def test_physical_offset_of_agrees_with_decode_offset_msg_id(msg_id: str) -> None:
    try:
        expected: int | str = decode_offset_msg_id(msg_id)[2]
    except (ProtocolError, ValueError) as exc:
        expected = f"{type(exc).__name__}: {exc}"
    try:
        got: int | str = physical_offset_of(msg_id)
    except (ProtocolError, ValueError) as exc:
        got = f"{type(exc).__name__}: {exc}"
    assert got == expected


@pytest.mark.parametrize("state", list(LocalTransactionState))
@pytest.mark.parametrize(
    ("queue_offset", "commit_log_offset", "msg_id", "transaction_id"),
    [
        (0, 0, "7F00000100002A9F0000000000000001", "7F00000100002A9F0000000000000001"),
        (2**63 - 1, 123_456_789_012, "AC1", "tx-9"),
        (-1, 5, "", ""),
    ],
)
def test_end_transaction_fields_round_trip_through_the_header(
    state: LocalTransactionState,
    queue_offset: int,
    commit_log_offset: int,
    msg_id: str,
    transaction_id: str,
) -> None:
    header = EndTransactionRequestHeader(
        producer_group="grp",
        tran_state_table_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        commit_or_rollback=state.end_code,
        from_transaction_check=False,
        msg_id=msg_id,
        transaction_id=transaction_id,
    )
    fields = end_transaction_fields(
        "grp", queue_offset, commit_log_offset, state.end_code, msg_id, transaction_id
    )
    assert fields == header.to_fields()
    assert list(fields) == list(header.to_fields())
    assert EndTransactionRequestHeader.from_fields(fields) == header or transaction_id == ""
