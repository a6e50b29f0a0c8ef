"""The fuzz targets: one per decoder, each a strategy of cases and a check of one case.

A check passes when the decoder returns a value (of the documented shape) or raises the error it
documents, and, for an unmutated case, when the value is what was encoded. Anything else is a
finding: another exception type, an assertion about the value, a hang (the runner's alarm) or an
allocation far beyond the input (`bounded_memory`: tracemalloc's peak around the decoder).

    target          decoder(s)                                      documented error
    frames          FrameDecoder.feed (JSON + ROCKETMQ headers)     ProtocolError
    json_header     decode_frame of a header with a weird value     ProtocolError
    typed_headers   every *Header.from_fields in protocol.headers   ProtocolError
    properties      decode_properties / encode_properties           never / ProtocolError
    batch           decode_batch, inflate, inflated_size            ProtocolError
    record          decode_record(s), check_record, placed_record_at CorruptRecordError / None
    sql92           sql92.parse, evaluate, tag_codes, build_filter  SqlSyntaxError/FilterRefused
    ha_handshake    protocol.ha MasterSession / SlaveSession.receive ProtocolError

tests/fuzz runs each for a bounded number of examples; `python -m tidemq.testing.fuzz` runs them
for a time budget (`make fuzz`).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st

from tidemq.broker.filter import FilterRefused, build_filter, sql92
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import ha, headers
from tidemq.protocol import record as rec
from tidemq.protocol.frame import FrameDecoder, RemotingCommand, decode_frame
from tidemq.protocol.headers_send import SEND_V1_KEYS, SEND_V2_KEYS
from tidemq.protocol.message import (
    decode_batch,
    decode_properties,
    encode_properties,
    inflate,
    parse_tag_expression,
    properties_are_canonical,
)
from tidemq.protocol.message_batch import inflated_size
from tidemq.testing.fuzz import strategies as fs
from tidemq.testing.fuzz.mutations import Sample, apply, mutation_lists

# A decoder may hold a few copies of its input (slices, the decoded strings, a dict) but never
# memory sized by a length field it has not checked: peak traced bytes <= factor x input + slack.
ALLOCATION_FACTOR: Final = 16
ALLOCATION_SLACK_BYTES: Final = 256 * 1024
# Output limit of the inflate checks: small, so a zlib bomb is refused after little work.
INFLATE_SIZE_MAX: Final = 64 * 1024


class FuzzFinding(AssertionError):
    """A decoder broke its contract on a case (the message says how)."""


@contextlib.contextmanager
def bounded_memory(input_size: int) -> Iterator[None]:
    """Fail when the block's peak traced allocation exceeds the bound. Traces the block only:
    tracing Hypothesis's own drawing too made a run several times slower."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    bound = ALLOCATION_FACTOR * input_size + ALLOCATION_SLACK_BYTES
    if peak - before > bound:
        raise FuzzFinding(f"allocated {peak - before} bytes for {input_size} input bytes")


def _command_is_well_formed(command: RemotingCommand) -> None:
    """What every handler may rely on in a decoded command."""
    limits = -(2**31), 2**31 - 1
    for name in ("code", "opaque", "flag", "version"):
        value = getattr(command, name)
        if value.__class__ is not int or not limits[0] <= value <= limits[1]:
            raise FuzzFinding(f"{name}={value!r} is not a 32-bit int")
    if not all(k.__class__ is str and v.__class__ is str for k, v in command.ext_fields.items()):
        raise FuzzFinding(f"extFields not all strings: {command.ext_fields!r}")
    if command.body.__class__ is not bytes or not isinstance(command.language, str):
        raise FuzzFinding("body is not bytes or language not text")
    if command.remark is not None and not isinstance(command.remark, str):
        raise FuzzFinding(f"remark {command.remark!r} is not text")


# -- frames and headers ------------------------------------------------------------------------

# One case in four is left intact, for the round trip; the rest are mutated.
maybe_edits = st.one_of(st.just(()), mutation_lists, mutation_lists, mutation_lists)


@dataclass(frozen=True, slots=True)
class Case:
    """A valid structure (`expected`: what encoding it started from), its sample and edits."""

    expected: Any
    sample: Sample
    edits: tuple[Any, ...]
    extra: Any = None  # the target's own parameter (chunk sizes, properties, ...)

    @property
    def data(self) -> bytes:
        return apply(self.sample, self.edits) if self.edits else self.sample.data

    @property
    def intact(self) -> bool:
        return self.data == self.sample.data


@st.composite
def frame_cases(draw: st.DrawFn) -> Case:
    commands, sample = draw(fs.frame_streams())
    splits = draw(st.lists(st.integers(1, 64), max_size=6))
    return Case(commands, sample, tuple(draw(maybe_edits)), splits)


def check_frames(case: Case) -> None:
    """Feed the (mutated) stream in chunks: frames or ProtocolError; intact: the same frames."""
    data = case.data
    decoder = FrameDecoder()
    decoded: list[RemotingCommand] = []
    position = 0
    try:
        with bounded_memory(len(data)):
            for step in [*case.extra, len(data)]:
                decoded += decoder.feed(data[position : position + step])
                position += step
    except ProtocolError:
        if case.intact:
            raise FuzzFinding("ProtocolError on an intact stream") from None
        return
    for command in decoded:
        _command_is_well_formed(command)
    if case.intact and (decoded != case.expected or decoder.buffered):
        raise FuzzFinding("intact stream did not round-trip")


@st.composite
def json_header_cases(draw: st.DrawFn) -> Case:
    return Case(None, draw(fs.json_headers()), tuple(draw(maybe_edits)))


def check_json_header(case: Case) -> None:
    """A header with a weird value: a well-formed command or ProtocolError, and the typed
    headers parse its extFields or raise ProtocolError."""
    data = case.data
    try:
        with bounded_memory(len(data)):
            command = decode_frame(data)
    except ProtocolError:
        return
    _command_is_well_formed(command)
    _parse_every_header(command.ext_fields)


# Any: each class's from_fields returns its own type; only that it parses matters here.
HEADER_CLASSES: Final[tuple[Any, ...]] = tuple(
    sorted(
        {
            obj
            for obj in vars(headers).values()
            if inspect.isclass(obj) and callable(getattr(obj, "from_fields", None))
        },
        key=lambda cls: cls.__name__,
    )
)
# The wire names the typed headers read: every string literal in their from_fields, and the
# send header's names from its table (v1 and the v2 letters).
WIRE_NAMES: Final = tuple(
    sorted(
        {
            name
            for cls in HEADER_CLASSES
            for name in re.findall(r'"([A-Za-z][A-Za-z0-9]*)"', inspect.getsource(cls.from_fields))
        }
        | {*SEND_V1_KEYS, *SEND_V2_KEYS}
    )
)


def _parse_every_header(fields: dict[str, str]) -> None:
    for cls in HEADER_CLASSES:
        with contextlib.suppress(ProtocolError):
            cls.from_fields(fields)


typed_header_cases = st.dictionaries(
    st.sampled_from(WIRE_NAMES) | fs.texts, fs.field_values, max_size=len(WIRE_NAMES)
)


def check_typed_headers(fields: dict[str, str]) -> None:
    """Every typed header parses `fields` or raises ProtocolError."""
    with bounded_memory(sum(len(k) + len(v) for k, v in fields.items())):
        _parse_every_header(fields)


# -- properties and batches ----------------------------------------------------------------------


@st.composite
def properties_cases(draw: st.DrawFn) -> Case:
    props = draw(fs.properties_maps)
    return Case(props, Sample(encode_properties(props).encode()), tuple(draw(maybe_edits)))


def check_properties(case: Case) -> None:
    """decode_properties never raises; intact: the map round-trips and the text is canonical."""
    text = case.data.decode("utf-8", "surrogateescape")
    with bounded_memory(len(case.data)):
        props = decode_properties(text)
    if not all(k and v and "\x02" not in k + v and "\x01" not in k for k, v in props.items()):
        raise FuzzFinding(f"decoded an empty or separator-holding pair: {props!r}")
    if case.intact and (props != case.expected or not properties_are_canonical(text, props)):
        raise FuzzFinding("intact properties did not round-trip")
    try:
        again = encode_properties(props)
    except ProtocolError:
        return  # a value holding \x01 is readable but not writable
    if decode_properties(again) != props:
        raise FuzzFinding("re-encoded properties decode differently")


@st.composite
def batch_cases(draw: st.DrawFn) -> Case:
    items, sample = draw(fs.batch_bodies())
    compressed = draw(st.booleans())
    if compressed:
        sample = Sample(zlib.compress(sample.data, 5), ())
    return Case(items, sample, tuple(draw(maybe_edits)), compressed)


ZLIB_BOMB: Final = zlib.compress(bytes(INFLATE_SIZE_MAX * 64), 9)


def check_batch(case: Case) -> None:
    """decode_batch: items or ProtocolError; inflate and inflated_size agree on every input."""
    data = case.data
    if case.extra:
        with bounded_memory(len(data) + INFLATE_SIZE_MAX):
            inflated = _inflate_agreeing(data)
            bomb = _inflate_agreeing(ZLIB_BOMB + data)
        if bomb is not None:
            raise FuzzFinding("a zlib bomb inflated past the limit")
        if inflated is None:
            if case.intact:
                raise FuzzFinding("an intact compressed batch did not inflate")
            return
        data = inflated
    try:
        with bounded_memory(len(data)):
            items = decode_batch(data)
    except ProtocolError:
        if case.intact:
            raise FuzzFinding("ProtocolError on an intact batch") from None
        return
    if case.intact and items != case.expected:
        raise FuzzFinding("intact batch did not round-trip")


def _inflate_agreeing(data: bytes) -> bytes | None:
    """inflate(data), checking inflated_size says the same; None when both refuse."""
    try:
        inflated = inflate(data, INFLATE_SIZE_MAX)
    except ProtocolError:
        inflated = None
    try:
        size = inflated_size(data, INFLATE_SIZE_MAX)
    except ProtocolError:
        size = None
    if (None if inflated is None else len(inflated)) != size:
        raise FuzzFinding(f"inflate gave {inflated and len(inflated)} bytes, inflated_size {size}")
    return inflated


# -- stored records ------------------------------------------------------------------------------


@st.composite
def record_cases(draw: st.DrawFn) -> Case:
    fields = draw(fs.record_fields)
    return Case(fields, fs.record_sample(fields), tuple(draw(maybe_edits)))


def check_record(case: Case) -> None:
    """decode_record / check_record / decode_records: a record or CorruptRecordError;
    placed_record_at finds a record exactly when decode_record(require_crc=True) does."""
    data, fields = case.data, case.expected
    with bounded_memory(len(data)):
        decoded = _or_corrupt(lambda: rec.decode_record(data, require_crc=True))
        checked = _or_corrupt(lambda: rec.check_record(data))
        _or_corrupt(lambda: rec.decode_records(data + data))
        placed = rec.placed_record_at(memoryview(data), 0, fields["physical_offset"], len(data))
    if case.intact and (decoded is None or placed is None or checked != len(data)):
        raise FuzzFinding("an intact record did not decode")
    if decoded is None:
        if placed is not None:
            raise FuzzFinding("placed_record_at accepted what decode_record refused")
        return
    claimed = decoded.physical_offset == fields["physical_offset"]
    if claimed and decoded.total_size == len(data) and placed is None:
        raise FuzzFinding("placed_record_at refused what decode_record accepted")
    if placed is not None and (placed.topic, placed.properties, placed.queue_offset) != (
        decoded.topic,
        decoded.properties,
        decoded.queue_offset,
    ):
        raise FuzzFinding("placed_record_at and decode_record disagree")
    if case.intact:
        for name, value in fields.items():
            if name != "properties" and getattr(decoded, name) != value:
                raise FuzzFinding(f"{name} did not round-trip")


def _or_corrupt(decode: Callable[[], Any]) -> Any:
    try:
        return decode()
    except CorruptRecordError:
        return None


# -- SQL92 and tag filters -----------------------------------------------------------------------


@st.composite
def sql_cases(draw: st.DrawFn) -> Case:
    """An expression tree, its text, noise put into the text, and a message's properties."""
    expr = draw(fs.sql_exprs)
    text = fs.render_sql(expr)
    noise = draw(st.lists(st.tuples(st.integers(0, 2**16), st.sampled_from(fs.SQL_NOISE))))
    for position, piece in noise[:3]:
        at = position % (len(text) + 1)
        text = text[:at] + piece + text[at:]
    edits = tuple(draw(st.one_of(st.just(()), mutation_lists))) if not noise else ()
    # With noise the text is no longer the tree's: there is nothing to round-trip.
    return Case(None if noise else expr, Sample(text.encode()), edits, draw(fs.property_dicts))


def check_sql(case: Case) -> None:
    """parse: a tree or SqlSyntaxError; evaluate and tag_codes never raise on a tree; the
    rendered text of a tree parses back to it; build_filter raises only FilterRefused."""
    text = case.data.decode("utf-8", "replace")
    with bounded_memory(len(case.data)):
        try:
            expr = sql92.parse(text)
        except sql92.SqlSyntaxError:
            expr = None
        with contextlib.suppress(FilterRefused):
            build_filter(text, "SQL92", sql_enabled=True)
        with contextlib.suppress(FilterRefused):
            build_filter(text, "TAG", sql_enabled=False)
        with contextlib.suppress(ProtocolError):
            parse_tag_expression(text)
    if case.expected is not None and case.intact and expr != case.expected:
        raise FuzzFinding(f"{text!r} parsed as {expr!r}, not {case.expected!r}")
    if expr is not None:
        result = sql92.evaluate(expr, case.extra)
        if result not in (True, False, None):
            raise FuzzFinding(f"evaluate gave {result!r}")
        sql92.tag_codes(expr)


# -- the HA handshake ---------------------------------------------------------------------------

HA_SECRET: Final = b"fuzz-ha-secret-0123456789"
_nonces = st.binary(min_size=ha.NONCE_SIZE, max_size=ha.NONCE_SIZE)
_offsets = st.integers(0, 2**40)


@dataclass(frozen=True, slots=True)
class HaExpected:
    """What an intact case decodes to: the peer's first message, and the reports or frames."""

    slave_side: bool
    nonce_m: bytes
    nonce_s: bytes
    first: ha.Auth | ha.Verdict
    then: tuple[int, ...]  # report offsets (master side) or frame sizes (slave side)


@st.composite
def ha_cases(draw: st.DrawFn) -> Case:
    """The bytes one end of an HA connection receives before and after its handshake: a slave's
    AUTH and reports (the master side: untrusted, before any authentication) or a master's
    HELLO, VERDICT and frames (the slave side); the MAC right or not; then mutated."""
    nonce_m, nonce_s, start = draw(_nonces), draw(_nonces), draw(_offsets)
    steps = draw(st.lists(st.integers(0, 300), max_size=5))
    good_mac = draw(st.booleans())
    if draw(st.booleans()):
        mac = ha.master_mac(HA_SECRET, nonce_m, nonce_s) if good_mac else draw(_nonces) * 2
        verdict = ha.Verdict(ha.VerdictStatus.OK, mac, start, start + sum(steps))
        data = ha.encode_hello(nonce_m) + ha.encode_verdict(verdict)
        fields = [(4, 1), (21, 1), (54, 8), (62, 8)]
        for size in steps:
            fields.append((len(data) + 8, 4))
            data += ha.encode_frame_header(start, size) + bytes(size)
            start += size
        expected = HaExpected(True, nonce_m, nonce_s, verdict, tuple(steps))
    else:
        tail = bytes(min(start, draw(st.integers(0, ha.TAIL_SIZE_MAX))))
        mac = ha.slave_mac(HA_SECRET, nonce_m, nonce_s) if good_mac else draw(_nonces) * 2
        auth = ha.Auth(nonce_s, mac, start, draw(_offsets), len(tail), ha.tail_crc(tail))
        data = ha.encode_auth(auth)
        fields = [(4, 1), (53, 8), (61, 8), (69, 4), (73, 4)]
        reports = [start + sum(steps[: i + 1]) for i in range(len(steps))]
        for offset in reports:
            fields.append((len(data), 8))
            data += ha.encode_report(offset)
        expected = HaExpected(False, nonce_m, nonce_s, auth, tuple(reports))
    sample = Sample(data, tuple(fields))
    return Case(expected, sample, tuple(draw(maybe_edits)), draw(st.lists(st.integers(1, 80))))


def _chunks(data: bytes, splits: list[int]) -> Iterator[bytes]:
    position = 0
    for step in [*splits, len(data)]:
        if position < len(data):
            yield data[position : position + step]
        position += step


def check_ha(case: Case) -> None:
    """Each side's session takes the bytes in chunks: events or ProtocolError; the events are
    consistent (a MAC judged right only when it is, reports and frames in order); an intact
    case gives back its handshake and its reports or frames."""
    expected: HaExpected = case.expected
    data = case.data
    try:
        with bounded_memory(len(data)):
            got = (_ha_slave if expected.slave_side else _ha_master)(expected, data, case.extra)
    except ProtocolError:
        if case.intact and expected.first.mac == _right_mac(expected):
            raise FuzzFinding("ProtocolError on an intact HA stream") from None
        return
    if case.intact and got[0] is not None and got != (expected.first, expected.then):
        raise FuzzFinding(f"intact HA stream decoded as {got!r}")


def _right_mac(expected: HaExpected) -> bytes:
    mac = ha.master_mac if expected.slave_side else ha.slave_mac
    return mac(HA_SECRET, expected.nonce_m, expected.nonce_s)


def _ha_master(expected: HaExpected, data: bytes, splits: list[int]) -> tuple[Any, tuple[int, ...]]:
    """The master's session on a slave's bytes; the master's log is zeros (so an intact tail
    matches) and ends past every report."""
    session = ha.MasterSession(HA_SECRET, expected.nonce_m)
    auth: ha.Auth | None = None
    reports: list[int] = []
    # A slave sends its reports only after the VERDICT: the AUTH's bytes come first, alone.
    for chunk in [*_chunks(data[: ha.AUTH.size], splits), *_chunks(data[ha.AUTH.size :], splits)]:
        for event in session.receive(chunk):
            if isinstance(event, ha.AuthReceived):
                auth = event.auth
                if event.mac_ok != (
                    auth.mac == ha.slave_mac(HA_SECRET, expected.nonce_m, auth.nonce)
                ):
                    raise FuzzFinding("AuthReceived.mac_ok is not whether the MAC is right")
                status, start = ha.judge(
                    auth,
                    mac_ok=event.mac_ok,
                    offset_min=0,
                    offset_max=2**62,
                    tail_before=lambda _end, size: bytes(size),
                )
                session.send_verdict(status, start, 2**62)
                session.note_sent(2**62)
            else:
                if event.offset < (reports[-1] if reports else 0):
                    raise FuzzFinding(f"report {event.offset} went back")
                reports.append(event.offset)
    return auth, tuple(reports)


def _ha_slave(expected: HaExpected, data: bytes, splits: list[int]) -> tuple[Any, tuple[int, ...]]:
    """The slave's session on a master's bytes: its AUTH decodes; frames are contiguous and
    their pieces add up to at most their size."""
    session = ha.SlaveSession(HA_SECRET, expected.nonce_s, slave_max=5, broker_id=1, tail=b"tail")
    verdict: ha.Verdict | None = None
    sizes: list[int] = []
    left = 0
    for chunk in _chunks(data, splits):
        for event in session.receive(chunk):
            if isinstance(event, ha.VerdictReceived):
                verdict = event.verdict
            elif isinstance(event, ha.FrameStart):
                if left or not 0 <= event.size <= ha.FRAME_DATA_SIZE_MAX:
                    raise FuzzFinding(f"frame of {event.size} with {left} bytes left of the last")
                sizes.append(event.size)
                left = event.size
            else:
                left -= len(event.data)
                if left < 0:
                    raise FuzzFinding("a frame's pieces exceed its size")
        if out := session.data_to_send():
            ha.decode_auth(out)  # what the slave sends back is a valid AUTH
    return verdict, tuple(sizes)


# -- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    cases: st.SearchStrategy[Any]
    check: Callable[[Any], None]


TARGETS: Final = {
    target.name: target
    for target in (
        Target("frames", frame_cases(), check_frames),
        Target("json_header", json_header_cases(), check_json_header),
        Target("typed_headers", typed_header_cases, check_typed_headers),
        Target("properties", properties_cases(), check_properties),
        Target("batch", batch_cases(), check_batch),
        Target("record", record_cases(), check_record),
        Target("sql92", sql_cases(), check_sql),
        Target("ha_handshake", ha_cases(), check_ha),
    )
}
