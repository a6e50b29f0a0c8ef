"""The remoting frame: one request or response, and its incremental decoder.

    +----------------+-------------+--------------+--------------+--------------+
    | total_len: u32 | ser_type:u8 | hdr_len: u24 | header bytes | body bytes   |
    +----------------+-------------+--------------+--------------+--------------+
      total_len = 4 + hdr_len + body_len (it does not count its own four bytes)

The header is JSON (ser_type 0) or RocketMQ's binary layout (ser_type 1):

    JSON:   {"code":10,"extFields":{"topic":"T",...},"flag":0,"language":"JAVA",
             "opaque":5,"remark":null,"serializeTypeCurrentRPC":"JSON","version":407}

    binary: code:i16 | language:u8 | version:i16 | opaque:i32 | flag:i32
            | remark_len:i32 | remark | ext_len:i32 | (key_len:i16 key val_len:i32 val)*

A response is sent in the serialisation type of its request: the C++ and Node clients read the
second int unmasked, so they must only ever see JSON (ser_type 0).

extFields values arrive as JSON strings, numbers or booleans depending on the client; the decoder
turns every scalar into its text form ("4", "true") so the typed headers parse one representation.
Outbound values are always strings, because the C++ client ignores fields that are not.

A header over FRAME_HEADER_SIZE_MAX inside a frame within the frame limit is raised as
HeaderTooLargeError carrying what the answer needs: FrameDecoder sets it aside (`oversized`) and
goes on with the next frame, so the connection answers that request with a code and a remark
instead of closing (remoting/inbound.py). It is decoded no further than that takes, since an
unsigned peer can send one after another (a 15 MiB binary header of empty fields took 2.4 s to
walk, a 15 MiB JSON header of 1.3 M keys 0.8 s and 316 MiB):

    binary   the 17-byte fixed part only (code, language, version, opaque, flag); extFields,
             remark and body are never read
    JSON     parsed (orjson, in C) up to OVERSIZED_JSON_HEADER_MAX, twice the limit: room for
             the C++ client's 1 MiB KEYS property, whose answer names the properties' size.
             Only the fixed fields and a send's properties field are kept; no extFields value
             is looked at in Python. Over it the frame is malformed (ProtocolError: the
             connection closes)

Either way the command is not the whole frame (`complete` False): a response's waiter gets a
stand-in (remoting/inbound.py oversized_response), never a response without its fields.

Only a malformed frame (a bad length, an undecodable header) leaves the stream unusable.

`encode_send_success` encodes a SUCCESS send answer to a JSON request from a template of what
`encode_parts` writes for `headers_send.send_response_fields`, made at import: the coalescer
answers every plain send with it; the send handler's other answers (batches, delayed sends) are
commands of the same fields, encoded by `encode_parts`.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

import orjson

from tidemq.errors import ProtocolError
from tidemq.limits import FRAME_HEADER_SIZE_MAX, FRAME_SIZE_MAX
from tidemq.protocol.codes import VERSION_CURRENT, LanguageCode, ResponseCode
from tidemq.protocol.headers_send import send_response_fields

FLAG_RESPONSE: Final = 0x1
FLAG_ONEWAY: Final = 0x2

_LENGTHS = struct.Struct(">II")  # total_len, (ser_type << 24) | hdr_len
assert _LENGTHS.size == 8
_BINARY_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark_len
assert _BINARY_FIXED.size == 17
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_HEADER_LEN_MASK: Final = 0xFFFFFF
# The largest JSON header over FRAME_HEADER_SIZE_MAX still parsed to be answered. Parsing costs
# at most about what an accepted header's decoding does (2 MiB of empty arrays: about 0.1 s).
OVERSIZED_JSON_HEADER_MAX: Final = 2 * FRAME_HEADER_SIZE_MAX
# The extFields an oversized JSON request keeps: a send's properties (SEND_MESSAGE's name and
# SEND_MESSAGE_V2's), which its answer measures.
OVERSIZED_KEPT_FIELDS: Final = ("properties", "i")
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


_JSON: Final = SerializeType.JSON
# The keys every client's JSON header has (remark is optional), read in one call.
_JSON_KEYS: Final = operator.itemgetter(
    "code", "opaque", "flag", "version", "extFields", "language"
)


class HeaderTooLargeError(ProtocolError):
    """A well-formed frame whose header is over FRAME_HEADER_SIZE_MAX: `header_size` its
    header's bytes; `command` the whole frame (header and body) when `complete`, else only its
    code, language, version, opaque and flag (and from a JSON header, OVERSIZED_KEPT_FIELDS)."""

    def __init__(
        self, command: RemotingCommand, header_size: int, *, complete: bool = True
    ) -> None:
        super().__init__(
            f"header of {header_size} bytes exceeds the limit of {FRAME_HEADER_SIZE_MAX} bytes"
        )
        self.command = command
        self.header_size = header_size
        self.complete = complete


@dataclass(slots=True)
class RemotingCommand:
    """One frame. `ext_fields` holds the custom header as strings; `body` is opaque bytes."""

    code: int
    opaque: int = 0
    flag: int = 0
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    language: str = "PYTHON"
    version: int = VERSION_CURRENT
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self,
        code: int,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        remark: str | None = None,
    ) -> RemotingCommand:
        """A response to this request: same opaque and serialisation type, response bit set."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            ext_fields=ext_fields if ext_fields is not None else {},
            body=body,
            remark=remark,
            language="JAVA",
            serialize_type=self.serialize_type,
        )


def encode(command: RemotingCommand) -> bytes:
    """The whole frame as one bytes object."""
    head, body = encode_parts(command)
    return head + body if body else head


def encode_parts(command: RemotingCommand) -> tuple[bytes, bytes]:
    """(length prefix + header, body): lets the transport write a large body without a copy."""
    if command.serialize_type is SerializeType.ROCKETMQ:
        header = _encode_binary_header(command)
    else:
        header = _encode_json_header(command)
    header_len = len(header)
    if header_len > FRAME_HEADER_SIZE_MAX:
        raise ProtocolError(f"header of {header_len} bytes exceeds {FRAME_HEADER_SIZE_MAX}")
    total = 4 + header_len + len(command.body)
    lengths = _LENGTHS.pack(total, (int(command.serialize_type) << 24) | header_len)
    return lengths + header, command.body


def _encode_json_header(command: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": command.code,
        "extFields": command.ext_fields,
        "flag": command.flag,
        "language": command.language,
        "opaque": command.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": command.version,
    }
    if command.remark is not None:
        header["remark"] = command.remark
    return orjson.dumps(header)


# -- the SUCCESS answer to a send, from a template (one per coalesced send) -------------------


def _send_success_template() -> str:
    """The JSON header of a SUCCESS send answer as `encode_parts` writes it, with %s/%d where the
    message id, queue id, queue offset and opaque go (in that order)."""
    markers = ("@msgId@", "@queueId@", "@queueOffset@", "2147483646")
    request = RemotingCommand(code=0, opaque=int(markers[3]))
    fields = send_response_fields(markers[0], 0, 0)
    fields.update(queueId=markers[1], queueOffset=markers[2])
    head, _ = encode_parts(request.response(ResponseCode.SUCCESS, fields))
    text = head[_LENGTHS.size :].decode().replace("%", "%%")
    positions = [text.index(marker) for marker in markers]
    assert positions == sorted(positions), "the template's order changed"
    assert all(text.count(marker) == 1 for marker in markers)
    for marker, spec in zip(markers, ("%s", "%d", "%d", "%d"), strict=True):
        text = text.replace(marker, spec)
    return text


_SEND_SUCCESS_HEADER: Final = _send_success_template()


def encode_send_success(opaque: int, msg_id: str, queue_id: int, queue_offset: int) -> bytes:
    """The whole frame of a SUCCESS answer to a JSON send request with `opaque`: what
    `encode(request.response(ResponseCode.SUCCESS, send_response_fields(msg_id, queue_id,
    queue_offset)))` makes, byte for byte, from a template (encoding the command costs several
    times more than the rest of a coalesced send's way out). JSON only: a request in the binary
    serialisation is answered in it, through `encode_parts`.
    """
    header = (_SEND_SUCCESS_HEADER % (msg_id, queue_id, queue_offset, opaque)).encode()
    return _LENGTHS.pack(4 + len(header), len(header)) + header


def _encode_binary_header(command: RemotingCommand) -> bytes:
    remark = command.remark.encode() if command.remark else b""
    try:
        language = LanguageCode[command.language].value
    except KeyError:
        language = LanguageCode.OTHER.value
    parts = [
        _BINARY_FIXED.pack(
            command.code, language, command.version, command.opaque, command.flag, len(remark)
        ),
        remark,
    ]
    fields = bytearray()
    for key, value in command.ext_fields.items():
        key_bytes, value_bytes = key.encode(), value.encode()
        fields += _I16.pack(len(key_bytes)) + key_bytes + _I32.pack(len(value_bytes)) + value_bytes
    parts.append(_I32.pack(len(fields)))
    parts.append(bytes(fields))
    return b"".join(parts)


def _field_text(value: Any) -> str | None:
    """The text form of one inbound extFields value (None: drop the field, as Java does)."""
    if value is None:
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        # orjson reads 1024 levels of nesting but writes only 254 (found by tests/fuzz).
        raise ProtocolError("an extFields value is nested too deep") from None


def _decode_json_header(data: bytes | bytearray) -> RemotingCommand:
    try:
        header = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    # The fast path: what every client sends (int code/opaque/flag/version in range, extFields
    # an object of strings, remark a string or null, language a string). Anything else takes
    # the careful path, so both decode every header alike (tests/protocol/test_frame_fast.py).
    if header.__class__ is dict:
        try:
            code, opaque, flag, version, ext_fields, language = _JSON_KEYS(header)
        except KeyError:
            return _decode_json_object(header)
        remark = header.get("remark")
        if (
            code.__class__ is int
            and opaque.__class__ is int
            and flag.__class__ is int
            and version.__class__ is int
            and ext_fields.__class__ is dict
            and (remark is None or remark.__class__ is str)
            and language.__class__ is str
            and _INT32_MIN <= code <= _INT32_MAX
            and _INT32_MIN <= opaque <= _INT32_MAX
            and _INT32_MIN <= flag <= _INT32_MAX
            and _INT32_MIN <= version <= _INT32_MAX
        ):
            try:
                # str.join refuses any value that is not a str: the all-strings check in C.
                "".join(ext_fields.values())
            except TypeError:
                pass
            else:
                return RemotingCommand(
                    code, opaque, flag, ext_fields, b"", remark, language, version, _JSON
                )
    return _decode_json_object(header)


def _decode_json_object(header: Any) -> RemotingCommand:
    """The careful path: any JSON value, lenient where Java is (numbers as text, booleans,
    nulls dropped), refused where no peer could mean it."""
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    code, opaque, flag, version = _json_ints(header)
    raw_fields = header.get("extFields") or {}
    if not isinstance(raw_fields, dict):
        raise ProtocolError("extFields is not a JSON object")
    ext_fields: dict[str, str]
    if all(value.__class__ is str for value in raw_fields.values()):
        ext_fields = raw_fields  # the common case (every client sends strings): no copy
    else:
        ext_fields = {}
        for key, value in raw_fields.items():
            text = _field_text(value)
            if text is not None:
                ext_fields[key] = text
    remark = header.get("remark")
    language = header.get("language", "OTHER")
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        ext_fields=ext_fields,
        remark=remark if isinstance(remark, str) else None,
        language=language if isinstance(language, str) else "OTHER",
        version=version,
        serialize_type=SerializeType.JSON,
    )


def _json_ints(header: dict[str, Any]) -> tuple[int, int, int, int]:
    """code, opaque, flag and version of a JSON header, lenient where Java is (numbers as text).

    Raises:
        ProtocolError: code missing, or any of them not a 32-bit integer.
    """
    try:
        code = int(header["code"])
        opaque = int(header.get("opaque", 0))
        flag = int(header.get("flag", 0))
        version = int(header.get("version", 0))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"header lacks a valid code/opaque/flag/version: {exc!r}") from None
    # Every peer keeps these in 32-bit ints; a larger value could not be echoed in a response.
    if not (
        _INT32_MIN <= code <= _INT32_MAX
        and _INT32_MIN <= opaque <= _INT32_MAX
        and _INT32_MIN <= flag <= _INT32_MAX
        and _INT32_MIN <= version <= _INT32_MAX
    ):
        raise ProtocolError(
            f"header field out of 32-bit range: code={code} opaque={opaque} flag={flag} "
            f"version={version}"
        )
    return code, opaque, flag, version


def _decode_binary_header(data: bytes) -> RemotingCommand:
    try:
        code, language, version, opaque, flag, remark_len = _BINARY_FIXED.unpack_from(data, 0)
        position = _BINARY_FIXED.size
        if remark_len < 0 or position + remark_len > len(data):
            raise ProtocolError("binary header: remark length out of range")
        remark = data[position : position + remark_len].decode() if remark_len else None
        position += remark_len
        (fields_len,) = _I32.unpack_from(data, position)
        position += 4
        end = position + fields_len
        if fields_len < 0 or end > len(data):
            raise ProtocolError("binary header: extFields length out of range")
        ext_fields: dict[str, str] = {}
        while position < end:
            (key_len,) = _I16.unpack_from(data, position)
            position += 2
            key = data[position : position + key_len].decode()
            position += key_len
            (value_len,) = _I32.unpack_from(data, position)
            position += 4
            if key_len < 0 or value_len < 0 or position + value_len > end:
                raise ProtocolError("binary header: field length out of range")
            value = data[position : position + value_len].decode()
            position += value_len
            if key and value:
                ext_fields[key] = value
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"binary header: {exc}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        ext_fields=ext_fields,
        remark=remark,
        language=_language_name(language),
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def _language_name(language: int) -> str:
    try:
        return LanguageCode(language).name
    except ValueError:
        return "OTHER"


def _oversized(
    source: bytes | bytearray, start: int, serialize_type: int, header_len: int
) -> HeaderTooLargeError:
    """The refusal of the frame at source[start:], whose header of `header_len` bytes is over
    FRAME_HEADER_SIZE_MAX, decoded no further than its answer needs (module docstring).

    Raises:
        ProtocolError: a JSON header over OVERSIZED_JSON_HEADER_MAX, or an unknown type.
    """
    header_start = start + 4
    if serialize_type == SerializeType.ROCKETMQ:
        # header_len > FRAME_HEADER_SIZE_MAX: the fixed part is there.
        code, language, version, opaque, flag, _ = _BINARY_FIXED.unpack_from(source, header_start)
        command = RemotingCommand(
            code, opaque, flag, {}, b"", None, _language_name(language), version,
            SerializeType.ROCKETMQ,
        )  # fmt: skip
        return HeaderTooLargeError(command, header_len, complete=False)
    if serialize_type != SerializeType.JSON:
        raise ProtocolError(f"unknown serialisation type {serialize_type}")
    if header_len > OVERSIZED_JSON_HEADER_MAX:
        raise ProtocolError(
            f"JSON header of {header_len} bytes is over {OVERSIZED_JSON_HEADER_MAX} bytes "
            f"(the limit is {FRAME_HEADER_SIZE_MAX})"
        )
    try:
        header = orjson.loads(source[header_start : header_start + header_len])
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    code, opaque, flag, version = _json_ints(header)
    raw_fields = header.get("extFields")
    kept: dict[str, str] = {}
    if isinstance(raw_fields, dict):
        for name in OVERSIZED_KEPT_FIELDS:
            value = raw_fields.get(name)
            if isinstance(value, str):
                kept[name] = value
    language = header.get("language")
    command = RemotingCommand(
        code, opaque, flag, kept, b"", None,
        language if isinstance(language, str) else "OTHER", version, _JSON,
    )  # fmt: skip
    return HeaderTooLargeError(command, header_len, complete=False)


def decode_frame(frame: bytes) -> RemotingCommand:
    """Decode one frame given without its length prefix (ser/len int, header, body)."""
    return _decode_frame_at(frame, 0, len(frame))


def _decode_frame_at(source: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    """decode_frame of source[start:end], slicing the header and body out of `source` directly
    (one copy each) rather than copying the frame first."""
    size = end - start
    if size < 4:
        raise ProtocolError(f"frame of {size} bytes is shorter than its header length")
    (type_and_length,) = _U32.unpack_from(source, start)
    serialize_type = type_and_length >> 24
    header_len = type_and_length & _HEADER_LEN_MASK
    if header_len > size - 4:
        raise ProtocolError(f"header length {header_len} exceeds frame length {size}")
    if header_len > FRAME_HEADER_SIZE_MAX:
        raise _oversized(source, start, serialize_type, header_len)
    body_start = start + 4 + header_len
    if serialize_type == SerializeType.JSON:
        # orjson reads a bytearray slice as well as bytes: no second copy of the header.
        command = _decode_json_header(source[start + 4 : body_start])
    elif serialize_type == SerializeType.ROCKETMQ:
        command = _decode_binary_header(bytes(source[start + 4 : body_start]))
    else:
        raise ProtocolError(f"unknown serialisation type {serialize_type}")
    if source.__class__ is bytes:
        command.body = source[body_start:end]
    else:
        # A bytearray (a frame that came in several reads): one copy, not a bytearray slice and
        # then bytes of it (two copies of a 1 MiB body). The view is gone before `feed` resizes.
        with memoryview(source) as view:
            command.body = bytes(view[body_start:end])
    return command


LARGE_FRAME_BYTES: Final = 64 * 1024  # see FrameDecoder


class FrameDecoder:
    """Incremental decoder: `feed(data)` returns the frames completed so far and keeps the rest.

    Raises ProtocolError for a length below the minimum or above `frame_size_max`; after an error
    the decoder's state is undefined and the connection must be closed. A frame whose header is
    over FRAME_HEADER_SIZE_MAX is not among the commands returned: it is appended to `oversized`
    (the caller answers and clears it) and decoding goes on.

    A frame of LARGE_FRAME_BYTES or more that a read leaves incomplete is held as the reads that
    bring it (`_parts`, not copied), and its body joined from them once whole: one copy of the
    body, not two (into the buffer, then out of it).
    """

    __slots__ = ("_buffer", "_frame_size_max", "_parts", "_parts_size", "oversized")

    def __init__(self, frame_size_max: int = FRAME_SIZE_MAX) -> None:
        self._buffer = bytearray()
        self._frame_size_max = frame_size_max
        self._parts: list[bytes | memoryview] = []
        self._parts_size = 0
        self.oversized: list[HeaderTooLargeError] = []

    @property
    def buffered(self) -> int:
        return len(self._buffer) + self._parts_size

    def feed(self, data: bytes) -> list[RemotingCommand]:
        if self._parts:
            return self._feed_part(data)
        buffer = self._buffer
        # Frames that arrive whole are decoded straight from `data`; only a partial tail (or data
        # completing an earlier tail) goes through the buffer.
        source: bytes | bytearray
        if buffer:
            buffer += data
            source = buffer
        else:
            source = data
        commands: list[RemotingCommand] = []
        position = 0
        available = len(source)
        frame_size_max = self._frame_size_max
        while available - position >= 4:
            (total,) = _U32.unpack_from(source, position)
            if total < 4:
                raise ProtocolError(f"frame length {total} is below the minimum of 4")
            if total > frame_size_max:
                raise ProtocolError(f"frame length {total} exceeds the limit {frame_size_max}")
            end = position + 4 + total
            if end > available:
                break
            try:
                commands.append(_decode_frame_at(source, position + 4, end))
            except HeaderTooLargeError as exc:
                self.oversized.append(exc)
            position = end
        if source is buffer:
            if position < available and self._hold_large(buffer, position, data):
                buffer.clear()
            elif position:
                del buffer[:position]
        elif position < available and not self._hold_large(data, position, data):
            with memoryview(data) as view:
                buffer += view[position:]  # one copy of the partial tail, not two
        return commands

    def _hold_large(self, source: bytes | bytearray, position: int, data: bytes) -> bool:
        """Hold the incomplete frame at source[position:] as parts if it is large (its length
        checked by feed's loop) with a header within the limit; `data`, this read, ends source."""
        if len(source) - position < _LENGTHS.size:
            return False
        total, type_and_length = _LENGTHS.unpack_from(source, position)
        header_len = type_and_length & _HEADER_LEN_MASK  # malformed or oversized: feed's way
        if total < LARGE_FRAME_BYTES or header_len > min(FRAME_HEADER_SIZE_MAX, total - 4):
            return False
        in_data = position - (len(source) - len(data))  # where the frame starts in `data`
        if in_data >= 0:
            self._parts.append(memoryview(data)[in_data:] if in_data else data)
        else:  # it began in an earlier read: a copy of the buffer's tail (at most a read more)
            self._parts.append(bytes(source[position:]))
        self._parts_size = len(source) - position
        return True

    def _feed_part(self, data: bytes) -> list[RemotingCommand]:
        parts = self._parts
        parts.append(data)
        self._parts_size += len(data)
        total, type_and_length = _LENGTHS.unpack_from(parts[0], 0)
        if self._parts_size < (need := 4 + total):
            return []
        head_len = _LENGTHS.size + (type_and_length & _HEADER_LEN_MASK)
        head, body, at = [], [], 0  # at: where the part begins in the frame
        for part in parts:
            view = memoryview(part)
            if at < head_len:
                head.append(view[: head_len - at])
            low, high = max(head_len - at, 0), min(need - at, len(view))
            if low < high:
                body.append(view[low:high])
            at += len(view)
        rest = bytes(view[len(view) - (at - need) :])
        self._parts, self._parts_size = [], 0
        command = _decode_frame_at(b"".join(head), 4, head_len)
        command.body = b"".join(body)  # the one copy of the body
        return [command, *self.feed(rest)] if rest else [command]
