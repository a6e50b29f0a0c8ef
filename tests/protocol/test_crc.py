"""crc32_combine (protocol/crc.py) against zlib.crc32 of the concatenation, and the frame
decoder's one-copy path for a frame that arrives in several reads."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.protocol import crc
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, encode


@given(st.binary(max_size=300), st.binary(max_size=3000))
def test_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_around_a_large_body_reads_it_once_and_agrees() -> None:
    head, tail = os.urandom(91), os.urandom(70)
    for size in (0, 5, crc.COMBINE_MIN_BYTES - 1, crc.COMBINE_MIN_BYTES, 1024 * 1024 + 3):
        body = os.urandom(size)
        expected = zlib.crc32(head + body + tail)
        assert crc.crc32_around(head, body, zlib.crc32(body), tail) == expected


@pytest.mark.parametrize("step", [1, 7, 1000, 64 * 1024 + 1, 300_000])
def test_large_frames_in_several_reads_decode_to_bytes(step: int) -> None:
    commands = []
    for size in (1024 * 1024, 64 * 1024, 10, 200_000):
        command = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, ext_fields={"topic": "T"})
        command.body = os.urandom(size)
        commands.append(command)
    stream = b"".join(encode(c) for c in commands)
    stream += encode(commands[0])[:100]  # part of one more frame
    decoder = FrameDecoder()
    got = []
    start = 0
    while start < len(stream):
        # Reads of `step` bytes, but a first one that splits the length prefix.
        size = 3 if start == 0 else step
        got += decoder.feed(stream[start : start + size])
        start += size
    assert [c.body for c in got] == [c.body for c in commands]
    assert all(c.body.__class__ is bytes and c.ext_fields == {"topic": "T"} for c in got)
    assert decoder.buffered == 100
