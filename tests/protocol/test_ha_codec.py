"""The HA wire (protocol/ha.py): handshake, frames and reports, split anywhere; bad input."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol import ha

SECRET = b"shared-secret-of-the-group"
NONCE_M = bytes(range(16))
NONCE_S = bytes(range(100, 116))
LOG = random.Random(7).randbytes(50_000)

nonces = st.binary(min_size=16, max_size=16)
macs = st.binary(min_size=32, max_size=32)
offsets = st.integers(0, 2**63 - 1)


@given(nonces)
def test_hello_round_trip(nonce: bytes) -> None:
    assert ha.decode_hello(ha.encode_hello(nonce)) == ha.Hello(nonce)


@given(nonces, macs, offsets, st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1))
def test_auth_round_trip(nonce: bytes, mac: bytes, end: int, broker_id: int, crc: int) -> None:
    auth = ha.Auth(nonce, mac, end, broker_id, min(end, ha.TAIL_SIZE_MAX), crc)
    assert ha.decode_auth(ha.encode_auth(auth)) == auth


@given(st.sampled_from(list(ha.VerdictStatus)), macs, offsets, offsets)
def test_verdict_round_trip(status: ha.VerdictStatus, mac: bytes, start: int, end: int) -> None:
    verdict = ha.Verdict(status, mac, start, end)
    assert ha.decode_verdict(ha.encode_verdict(verdict)) == verdict


def test_sizes_are_the_drawn_ones() -> None:
    assert (ha.HELLO.size, ha.AUTH.size, ha.VERDICT.size) == (21, 77, 49)
    assert (ha.FRAME_HEADER.size, ha.REPORT.size) == (12, 8)
    assert ha.encode_frame_header(5, 3) == b"\0" * 7 + b"\x05\0\0\0\x03"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"XQHA\x01" + NONCE_M, "magic"),
        (b"TQHA\x02" + NONCE_M, "version"),
    ],
)
def test_bad_hello(data: bytes, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        ha.decode_hello(data)


def test_bad_auth_and_verdict() -> None:
    auth = ha.Auth(NONCE_S, bytes(32), 10, 1, 11, 0)  # a tail longer than the log
    with pytest.raises(ProtocolError, match="tail_len"):
        ha.decode_auth(ha.encode_auth(auth))
    with pytest.raises(ProtocolError, match="magic"):
        ha.decode_auth(b"TQHA" + ha.encode_auth(ha.Auth(NONCE_S, bytes(32), 0, 1, 0, 0))[4:])
    with pytest.raises(ProtocolError, match="unknown status"):
        ha.decode_verdict(b"\x09" + bytes(48))
    with pytest.raises(ProtocolError, match="start"):
        ha.decode_verdict(ha.VERDICT.pack(0, bytes(32), -1, 0))


# --- judge -----------------------------------------------------------------------------------


def _auth(slave_max: int, tail: bytes) -> ha.Auth:
    return ha.Auth(NONCE_S, bytes(32), slave_max, 1, len(tail), zlib.crc32(tail))


def _tail_before(end: int, size: int) -> bytes:
    return LOG[max(0, end - size) : end]


@pytest.mark.parametrize(
    ("auth", "mac_ok", "expected"),
    [
        (_auth(100, LOG[0:100]), False, (ha.VerdictStatus.BAD_SECRET, 0)),
        (_auth(60_000, LOG[-10:]), True, (ha.VerdictStatus.AHEAD, 0)),
        (_auth(0, b""), True, (ha.VerdictStatus.OK, 4096)),  # empty: the master's first byte
        (_auth(100, LOG[0:100]), True, (ha.VerdictStatus.BEHIND_RETENTION, 0)),
        # At the master's first byte: its bytes before are deleted, nothing to compare.
        (_auth(4096, LOG[0:4096]), True, (ha.VerdictStatus.OK, 4096)),
        (_auth(9000, LOG[4904:9000]), True, (ha.VerdictStatus.OK, 9000)),
        (_auth(9000, LOG[4903:8999]), True, (ha.VerdictStatus.DIVERGED, 0)),
        (_auth(50_000, LOG[-4096:]), True, (ha.VerdictStatus.OK, 50_000)),  # caught up
    ],
)
def test_judge(auth: ha.Auth, mac_ok: bool, expected: tuple[ha.VerdictStatus, int]) -> None:
    got = ha.judge(
        auth, mac_ok=mac_ok, offset_min=4096, offset_max=len(LOG), tail_before=_tail_before
    )
    assert got == expected


# --- sessions ---------------------------------------------------------------------------------


def _sessions(
    slave_max: int = 0, tail: bytes = b"", slave_secret: bytes = SECRET
) -> tuple[ha.MasterSession, ha.SlaveSession]:
    master = ha.MasterSession(SECRET, NONCE_M)
    slave = ha.SlaveSession(slave_secret, NONCE_S, slave_max=slave_max, broker_id=2, tail=tail)
    return master, slave


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(0, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _stream(start: int, size: int, batch: int) -> bytes:
    """What a master writes from `start`: frames of at most `batch`, a heartbeat after each."""
    out = bytearray()
    offset = start
    while offset < start + size:
        data = LOG[offset : min(offset + batch, start + size)]
        out += (
            ha.encode_frame_header(offset, len(data))
            + data
            + ha.encode_frame_header(offset + len(data), 0)
        )
        offset += len(data)
    return bytes(out)


def _feed_slave(slave: ha.SlaveSession, pieces: list[bytes]) -> tuple[list[ha.SlaveEvent], bytes]:
    events: list[ha.SlaveEvent] = []
    body = bytearray()
    for piece in pieces:
        for event in slave.receive(piece):
            if isinstance(event, ha.FrameData):
                assert event.offset == 9000 + len(body)  # pieces come in log order
                body += event.data
            else:
                events.append(event)
    return events, bytes(body)


@pytest.mark.parametrize("seed", range(40))
def test_handshake_and_stream_split_anywhere(seed: int) -> None:
    rng = random.Random(seed)
    master, slave = _sessions(9000, LOG[4904:9000])
    for piece in _pieces(master.data_to_send(), rng):
        assert slave.receive(piece) == []
    (event,) = [e for p in _pieces(slave.data_to_send(), rng) for e in master.receive(p)]
    assert isinstance(event, ha.AuthReceived)
    assert event.mac_ok
    assert (event.auth.slave_max, event.auth.broker_id) == (9000, 2)
    status, start = ha.judge(
        event.auth, mac_ok=True, offset_min=0, offset_max=len(LOG), tail_before=_tail_before
    )
    master.send_verdict(status, start, len(LOG))
    assert master.state is ha.State.STREAMING
    stream = ha.encode_verdict(ha.decode_verdict(master.data_to_send())) + _stream(
        9000, 30_000, rng.choice([1, 100, 4096])
    )
    events, body = _feed_slave(slave, _pieces(stream, rng))
    assert events[0] == ha.VerdictReceived(ha.decode_verdict(stream[: ha.VERDICT.size]))
    assert body == LOG[9000:39_000]
    assert slave.next_offset == 39_000
    assert all(isinstance(e, ha.FrameStart) for e in events[1:])
    master.note_sent(39_000)
    reports = b"".join(ha.encode_report(o) for o in (9000, 12_000, 39_000))
    got = [e for p in _pieces(reports, rng) for e in master.receive(p)]
    assert got == [ha.Report(9000), ha.Report(12_000), ha.Report(39_000)]
    assert master.acked == 39_000


def test_stream_one_byte_at_a_time() -> None:
    master, slave = _sessions()
    slave.receive(master.data_to_send())
    master.receive(slave.data_to_send())
    master.send_verdict(ha.VerdictStatus.OK, 9000, len(LOG))
    stream = master.data_to_send() + _stream(9000, 2000, 512)
    events, body = _feed_slave(slave, [stream[i : i + 1] for i in range(len(stream))])
    assert body == LOG[9000:11_000]
    assert isinstance(events[0], ha.VerdictReceived)


def test_wrong_secret_gets_nothing_but_the_status() -> None:
    master, slave = _sessions(slave_secret=b"another secret")
    slave.receive(master.data_to_send())
    (event,) = master.receive(slave.data_to_send())
    assert isinstance(event, ha.AuthReceived)
    assert not event.mac_ok
    master.send_verdict(ha.VerdictStatus.BAD_SECRET, 0, len(LOG))
    verdict = ha.decode_verdict(master.data_to_send())
    assert verdict == ha.Verdict(ha.VerdictStatus.BAD_SECRET, bytes(32), 0, 0)
    assert master.state is ha.State.CLOSED


def test_slave_checks_the_masters_mac() -> None:
    master = ha.MasterSession(b"an impostor's secret", NONCE_M)
    slave = ha.SlaveSession(SECRET, NONCE_S, slave_max=0, broker_id=1, tail=b"")
    slave.receive(master.data_to_send())
    master.receive(slave.data_to_send())
    master.send_verdict(ha.VerdictStatus.OK, 0, 100)  # the impostor claims the MAC was fine
    with pytest.raises(ProtocolError, match="MAC"):
        slave.receive(master.data_to_send())


def test_refusal_closes_the_slave_session() -> None:
    master, slave = _sessions(9000, LOG[4904:9000])
    slave.receive(master.data_to_send())
    master.receive(slave.data_to_send())
    master.send_verdict(ha.VerdictStatus.DIVERGED, 0, len(LOG))
    (event,) = slave.receive(master.data_to_send() + b"ignored after the refusal")
    assert isinstance(event, ha.VerdictReceived)
    assert event.verdict.status is ha.VerdictStatus.DIVERGED
    assert event.verdict.master_max == len(LOG)
    assert slave.state is ha.State.CLOSED


def _following(start: int = 9000) -> ha.SlaveSession:
    master, slave = _sessions()
    slave.receive(master.data_to_send())
    master.receive(slave.data_to_send())
    master.send_verdict(ha.VerdictStatus.OK, start, len(LOG))
    slave.receive(master.data_to_send())
    return slave


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (ha.FRAME_HEADER.pack(9001, 1), "expected 9000"),  # a gap
        (ha.FRAME_HEADER.pack(8999, 1), "expected 9000"),  # a repeat
        (ha.FRAME_HEADER.pack(9000, -1), "frame of -1"),
        (ha.FRAME_HEADER.pack(9000, ha.FRAME_DATA_SIZE_MAX + 1), "frame of"),
    ],
)
def test_bad_frames(header: bytes, error: str) -> None:
    slave = _following()
    with pytest.raises(ProtocolError, match=error):
        slave.receive(header)


def _streaming_master(slave_max: int = 9000, start: int = 9000) -> ha.MasterSession:
    master = ha.MasterSession(SECRET, NONCE_M)
    slave = ha.SlaveSession(SECRET, NONCE_S, slave_max=slave_max, broker_id=1, tail=b"")
    slave.receive(master.data_to_send())
    master.receive(slave.data_to_send())
    master.send_verdict(ha.VerdictStatus.OK, start, len(LOG))
    return master


def test_reports_that_go_back_or_beyond_what_was_sent() -> None:
    master = _streaming_master()
    master.note_sent(12_000)
    assert master.receive(ha.encode_report(10_000)) == [ha.Report(10_000)]
    with pytest.raises(ProtocolError, match="after 10000"):
        master.receive(ha.encode_report(9_999))
    master = _streaming_master()
    master.note_sent(12_000)
    with pytest.raises(ProtocolError, match="beyond"):
        master.receive(ha.encode_report(12_001))


def test_an_empty_slave_reports_zero_before_its_first_append() -> None:
    master = _streaming_master(slave_max=0, start=4096)
    assert master.receive(ha.encode_report(0)) == [ha.Report(0)]
    master.note_sent(8192)
    assert master.receive(ha.encode_report(8192)) == [ha.Report(8192)]


def test_bytes_after_auth_before_verdict() -> None:
    master = ha.MasterSession(SECRET, NONCE_M)
    slave = ha.SlaveSession(SECRET, NONCE_S, slave_max=0, broker_id=1, tail=b"")
    slave.receive(master.data_to_send())
    with pytest.raises(ProtocolError, match="before the VERDICT"):
        master.receive(slave.data_to_send() + ha.encode_report(0))


@pytest.mark.parametrize("state", list(ha.State))
@pytest.mark.parametrize("event", list(ha.Input))
def test_every_transition_is_in_the_table_or_refused(state: ha.State, event: ha.Input) -> None:
    if (state, event) in ha.TRANSITIONS:
        assert ha.advance(state, event) is ha.TRANSITIONS[(state, event)]
    else:
        with pytest.raises(ProtocolError, match=state.value):
            ha.advance(state, event)


@given(st.binary(max_size=300))
def test_garbage_raises_only_protocol_errors(data: bytes) -> None:
    master = ha.MasterSession(SECRET, NONCE_M)
    slave = ha.SlaveSession(SECRET, NONCE_S, slave_max=0, broker_id=1, tail=b"")
    for session in (master, slave):
        try:
            session.receive(data)
        except ProtocolError:
            pass
    slave = _following()
    try:
        slave.receive(data)
    except ProtocolError:
        pass
