"""The transactional producer reads the half message's commit-log offset from its offsetMsgId."""

from __future__ import annotations

import pytest

from tidemq.client.transaction import commit_log_offset_of
from tidemq.errors import ProtocolError
from tidemq.protocol.message import decode_offset_msg_id, offset_msg_id


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
def test_commit_log_offset_agrees_with_decode_offset_msg_id(msg_id: str) -> None:
    try:
        expected: int | str = decode_offset_msg_id(msg_id)[2]
    except (ProtocolError, ValueError) as exc:
        expected = f"{type(exc).__name__}: {exc}"
    try:
        got: int | str = commit_log_offset_of(msg_id)
    except (ProtocolError, ValueError) as exc:
        got = f"{type(exc).__name__}: {exc}"
    assert got == expected
