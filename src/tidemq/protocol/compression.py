"""Message body codecs: which compressed bodies to send, and reading every codec a body may carry.

A body flagged COMPRESSED (sysFlag bit 0) names its codec in bits 8-10 (RocketMQ 5's
MessageSysFlag.COMPRESSION_*_TYPE; CompressionType LZ4=1, ZSTD=2, ZLIB=3, shifted left by 8);
bits 8-10 at 0 mean zlib, as every 4.x client writes. The formats are the Java client's: zlib is
an RFC 1950 stream, LZ4 an LZ4 frame (LZ4FrameOutputStream), ZSTD a zstd frame (ZstdOutputStream).

    codec      type bits   needs            cost per MiB here (compress; 1 MiB JSON / random)
    zlib       0 (or 0x300) nothing          level 5: ~9 ms / ~30 ms, ratio 0.12 / 1.0
    lz4        0x100       `lz4` package    ~0.9 ms / ~0.45 ms, ratio 0.20 / 1.0
    zstd       0x200       `zstandard`      level 3: ~1.8 ms / ~0.7 ms, ratio 0.05 / 1.0

zlib stays the producer's default: every official client reads it. LZ4 and ZSTD are opt-in
(`pip install 'tidemq[codecs]'`); a consumer without the package fails the pull with
CodecMissingError naming it (the message is kept, not skipped: installing the package is the
fix), while type bits no RocketMQ version defines make the record undecodable (skipped).

Judging (`worth_compressing`): random, encrypted or already-compressed bodies do not shrink, and
zlib spends ~30 ms of client CPU per MiB finding that out. So before compressing with zlib the
producer compresses two 1 KiB samples (the body's start and middle) at level 1, ~20 us for text
and ~40 us for random bytes, and sends the body as it is unless they shrink to at most
SAMPLE_RATIO_MAX of their size, each. LZ4 and ZSTD are cheaper than the judging for random bytes, so
they are not judged. Whatever the codec, a result that did not shrink to RESULT_RATIO_MAX of the
body is thrown away and the body sent as it is (the consumer and the store pay for every byte).
"""

from __future__ import annotations

import importlib
import zlib
from typing import Any, Final

from tidemq.errors import ClientError, ProtocolError
from tidemq.limits import FRAME_SIZE_MAX

from .message import SysFlag
from .message_batch import INFLATE_CHECK_CHUNK_BYTES, deflate, inflate, inflated_size

TYPE_MASK: Final = SysFlag.COMPRESSION_TYPE_MASK
LZ4: Final = SysFlag.COMPRESSION_LZ4
ZSTD: Final = SysFlag.COMPRESSION_ZSTD
ZLIB: Final = SysFlag.COMPRESSION_ZLIB

# The producer's `compression` names and their type bits (zlib keeps 0, as 4.x clients send).
CODEC_BITS: Final[dict[str, int]] = {"zlib": 0, "lz4": LZ4, "zstd": ZSTD}
_PACKAGES: Final[dict[int, str]] = {LZ4: "lz4", ZSTD: "zstandard"}

SAMPLE_BYTES: Final = 1024
SAMPLE_RATIO_MAX: Final = 0.9
RESULT_RATIO_MAX: Final = 0.95
# Output bytes per step when an LZ4 body's size is checked without holding it: zlib's step.
_CHECK_CHUNK_BYTES: Final = INFLATE_CHECK_CHUNK_BYTES


class CodecMissingError(ClientError):
    """A body's codec needs a package that is not installed (named in the message). A
    ClientError: a consumer's pull loop logs it and pulls again later, keeping the message."""


def _module(bits: int) -> Any:
    package = _PACKAGES[bits]
    try:
        return importlib.import_module("lz4.frame" if bits == LZ4 else package)
    except ImportError:
        raise CodecMissingError(
            f"{package!r} is needed for {codec_name(bits)} message bodies: "
            "pip install 'tidemq[codecs]'"
        ) from None


def codec_name(bits: int) -> str:
    """'zlib', 'lz4' or 'zstd' for a sysFlag's type bits (0 is zlib)."""
    for name, value in CODEC_BITS.items():
        if value == bits & TYPE_MASK:
            return name
    return "zlib" if bits & TYPE_MASK == ZLIB else f"unknown(0x{bits & TYPE_MASK:x})"


def codec_bits(name: str) -> int:
    """The type bits of a producer's `compression` name; the codec's package is imported now,
    so a producer asking for a missing one fails at construction (CodecMissingError)."""
    if name not in CODEC_BITS:
        raise ValueError(f"compression must be one of {sorted(CODEC_BITS)} or None, not {name!r}")
    bits = CODEC_BITS[name]
    if bits:
        _module(bits)
    return bits


def worth_compressing(body: bytes) -> bool:
    """Whether zlib is likely to shrink `body`: each of two samples (start, middle) must shrink
    to SAMPLE_RATIO_MAX of its size at level 1 (a text header before random bytes does not)."""
    view = memoryview(body)
    middle = len(view) // 2
    samples = [view[: 2 * SAMPLE_BYTES]]
    if middle >= SAMPLE_BYTES:
        samples = [view[:SAMPLE_BYTES], view[middle : middle + SAMPLE_BYTES]]
    judge = zlib.compressobj(1)
    for sample in samples:
        # A sync flush ends the sample's output on a byte: its size is the sample's alone.
        size = len(judge.compress(sample)) + len(judge.flush(zlib.Z_SYNC_FLUSH))
        if size > SAMPLE_RATIO_MAX * len(sample):
            return False
    return True


def compress(body: bytes, bits: int, level: int) -> bytes | None:
    """`body` compressed with the codec of `bits` (`level` is zlib's; LZ4 and ZSTD use their
    libraries' defaults), or None when it did not shrink to RESULT_RATIO_MAX: send it as is."""
    if bits == 0:
        if not worth_compressing(body):
            return None
        packed = deflate(body, level)
    elif bits == LZ4:
        frame = _module(LZ4)
        # What lz4-java's LZ4FrameOutputStream writes, which its LZ4FrameInputStream (RocketMQ
        # 5's LZ4 codec) requires: independent blocks (FLG 0x60; linked blocks are refused),
        # no content size, no checksums. Blocks of 64 KiB (Java writes 4 MiB; its reader takes
        # any): a Java consumer then holds 2 x 64 KiB per body, not 2 x 4 MiB.
        packed = frame.compress(
            body,
            block_size=frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
    else:
        packed = _module(ZSTD).ZstdCompressor().compress(body)
    return packed if len(packed) <= RESULT_RATIO_MAX * len(body) else None


def _type_bits(sys_flag: int) -> int:
    bits = sys_flag & TYPE_MASK
    if bits not in (0, ZLIB, LZ4, ZSTD):
        raise ProtocolError(f"unknown compression type bits 0x{bits:x} in sysFlag 0x{sys_flag:x}")
    return bits


def decompress(body: bytes, sys_flag: int, size_max: int = FRAME_SIZE_MAX) -> bytes:
    """A COMPRESSED body's content, by the codec its sysFlag names, at most `size_max` bytes.

    Raises:
        ProtocolError: not data of that codec, truncated, over size_max, or unknown type bits.
        CodecMissingError: the codec's package is not installed.
    """
    bits = _type_bits(sys_flag)
    if bits in (0, ZLIB):
        return inflate(body, size_max)
    if bits == LZ4:
        return b"".join(_lz4_chunks(body, size_max))
    return b"".join(_zstd_chunks(body, size_max))


def decompressed_size(body: bytes, sys_flag: int, size_max: int) -> int:
    """The size `decompress` would return, holding at most a chunk of it (a zstd block): the
    broker's check of every COMPRESSED body.

    Raises:
        as `decompress`.
    """
    bits = _type_bits(sys_flag)
    if bits in (0, ZLIB):
        return inflated_size(body, size_max)
    if bits == LZ4:
        return sum(len(chunk) for chunk in _lz4_chunks(body, size_max))
    return sum(len(chunk) for chunk in _zstd_chunks(body, size_max))


def _lz4_chunks(body: bytes, size_max: int) -> Any:
    frame = _module(LZ4)
    decompressor = frame.LZ4FrameDecompressor()
    size = 0
    data: bytes | memoryview = memoryview(body)
    try:
        while not decompressor.eof:
            chunk = decompressor.decompress(data, max_length=_CHECK_CHUNK_BYTES)
            data = b""
            size += len(chunk)
            if size > size_max:
                raise ProtocolError(f"decompressed lz4 body exceeds {size_max} bytes")
            if not chunk and decompressor.needs_input:
                raise ProtocolError("lz4 body is truncated")
            yield chunk
    except RuntimeError as exc:
        raise ProtocolError(f"body is not lz4 frame data: {exc}") from None
    if decompressor.unused_data:
        raise ProtocolError("lz4 body has data after its frame")


def _zstd_chunks(body: bytes, size_max: int) -> Any:
    """The frame's content, one block's output (at most 128 KiB) at a time: the decoder is fed
    one block per call (`_zstd_pieces`), so a frame without its content size (Java's
    ZstdOutputStream, any streaming writer) is never given size_max bytes of room up front."""
    zstandard = _module(ZSTD)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    size = 0
    try:
        if zstandard.frame_content_size(body) > size_max:
            raise ProtocolError(f"decompressed zstd body exceeds {size_max} bytes")
        for piece in _zstd_pieces(memoryview(body), zstandard.frame_header_size(body)):
            if decompressor.eof and piece:  # (a decompressobj takes nothing after its frame)
                raise ProtocolError("zstd body has data after its frame")
            chunk = decompressor.decompress(piece) if piece else b""
            size += len(chunk)
            if size > size_max:
                raise ProtocolError(f"decompressed zstd body exceeds {size_max} bytes")
            yield chunk
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"body is not zstd frame data: {exc}") from None
    if not decompressor.eof:
        raise ProtocolError("zstd body is truncated")
    if decompressor.unused_data:
        raise ProtocolError("zstd body has data after its frame")


def _zstd_pieces(view: memoryview, header_size: int) -> Any:
    """The frame cut at its block boundaries (RFC 8878 3.1.1.2: a 3-byte little-endian block
    header, bit 0 last block, bits 1-2 type, bits 3-23 size; an RLE block holds one byte of
    input), then its checksum. A block's output is at most 128 KiB, whatever its input. Cut
    wrongly, the decoder still judges the data: only the output per call would grow."""
    has_checksum = len(view) > 4 and view[4] & 0x04
    start = header_size
    yield view[:start]
    last = False
    while not last and start + 3 <= len(view):
        block = int.from_bytes(view[start : start + 3], "little")
        last = bool(block & 1)
        end = start + 3 + (1 if (block >> 1) & 3 == 1 else block >> 3)
        yield view[start:end]
        start = end
    end = start + 4 if last and has_checksum else start
    yield view[start:end]
    if last and end < len(view):
        raise ProtocolError("zstd body has data after its frame")
