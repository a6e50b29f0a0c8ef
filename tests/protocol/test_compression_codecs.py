"""The LZ4 and ZSTD bodies as the Java client writes and reads them (protocol/compression.py).

RocketMQ 5's LZ4 codec reads with lz4-java's LZ4FrameInputStream, which refuses a frame whose
blocks are linked; its ZSTD codec writes with zstd-jni's ZstdOutputStream, whose frames carry no
content size. The Java half runs the real libraries (the jars pyspark ships) when Java is here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from tidemq.errors import ProtocolError
from tidemq.protocol import compression
from tidemq.protocol.message import SysFlag

lz4_frame = pytest.importorskip("lz4.frame")
zstandard = pytest.importorskip("zstandard")

MIB = 1024 * 1024
TEXT = b"".join(b"row %d, value %d, some text\n" % (i, i * 7) for i in range(40_000))
LZ4 = SysFlag.COMPRESSED | SysFlag.COMPRESSION_LZ4
ZSTD = SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZSTD

# FLG: version 01 in bits 6-7, block independence bit 5; content checksum 2, content size 3,
# block checksum 4 (lz4 frame format 3.1.1).
FLG_INDEPENDENT = 0x20


def _streamed_zstd(body: bytes, *, checksum: bool = False) -> bytes:
    """A frame without its content size, as a streaming writer (Java's) makes it."""
    writer = zstandard.ZstdCompressor(write_checksum=checksum).compressobj()
    frame: bytes = writer.compress(body) + writer.flush()
    return frame


def test_lz4_frames_have_independent_blocks_and_what_lz4_java_reads() -> None:
    packed = compression.compress(TEXT, SysFlag.COMPRESSION_LZ4, 5)
    assert packed is not None
    flg, bd = packed[4], packed[5]
    assert flg & FLG_INDEPENDENT
    assert flg == 0x60  # version 1, independent blocks, no checksums, no content size
    assert bd == 0x40  # 64 KiB blocks
    info = lz4_frame.get_frame_info(packed)
    assert not info["block_linked"]
    assert compression.decompress(packed, LZ4) == TEXT


def test_zstd_frame_without_content_size_is_read_in_bounded_chunks() -> None:
    zeros = _streamed_zstd(bytes(4 * MIB))
    assert zstandard.frame_content_size(zeros) == -1
    tracemalloc.start()
    try:
        assert compression.decompressed_size(zeros, ZSTD, 16 * MIB) == 4 * MIB
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MIB  # one block's output at a time, not room for size_max (16 MiB)
    with pytest.raises(ProtocolError, match="exceeds 1048576"):
        compression.decompressed_size(zeros, ZSTD, MIB)


@pytest.mark.parametrize("checksum", [False, True])
def test_zstd_streamed_frames_round_trip_and_bad_ones_are_refused(checksum: bool) -> None:
    for body in (TEXT, os.urandom(300_000), b"", b"x"):
        frame = _streamed_zstd(body, checksum=checksum)
        assert compression.decompress(frame, ZSTD) == body
        assert compression.decompressed_size(frame, ZSTD, len(body)) == len(body)
        with pytest.raises(ProtocolError, match=r"truncated|not zstd"):
            compression.decompress(frame[:-1], ZSTD)
        with pytest.raises(ProtocolError, match="after its frame"):
            compression.decompress(frame + b"x", ZSTD)
        with pytest.raises(ProtocolError, match="after its frame"):
            compression.decompress(frame + frame, ZSTD)


def _java_classpath() -> str | None:
    spec = importlib.util.find_spec("pyspark")
    if shutil.which("java") is None or spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    found = [*jars.glob("lz4-java-*.jar"), *jars.glob("zstd-jni-*.jar")]
    return os.pathsep.join(str(jar) for jar in found) if len(found) == 2 else None


# Reads each .lz4 argument with LZ4FrameInputStream (prints "ok <size>" or the error), and
# writes <dir>/java.zst: the .raw argument through ZstdOutputStream (level 5).
_PROBE = """
import java.io.*;
import java.nio.file.*;
import net.jpountz.lz4.LZ4FrameInputStream;
import com.github.luben.zstd.ZstdOutputStream;

public class CodecProbe {
    public static void main(String[] args) throws Exception {
        for (String name : args) {
            Path path = Paths.get(name);
            if (name.endsWith(".lz4")) {
                byte[] packed = Files.readAllBytes(path);
                try (InputStream in = new LZ4FrameInputStream(new ByteArrayInputStream(packed))) {
                    System.out.println("ok " + in.readAllBytes().length);
                } catch (Exception e) {
                    System.out.println("error " + e.getMessage());
                }
            } else {
                ByteArrayOutputStream packed = new ByteArrayOutputStream();
                try (ZstdOutputStream out = new ZstdOutputStream(packed, 5)) {
                    out.write(Files.readAllBytes(path));
                }
                Files.write(path.resolveSibling("java.zst"), packed.toByteArray());
            }
        }
    }
}
"""


def test_java_client_codecs_read_ours_and_we_read_theirs(tmp_path: Path) -> None:
    classpath = _java_classpath()
    if classpath is None:
        pytest.skip("needs java and pyspark's lz4-java and zstd-jni jars")
    ours = compression.compress(TEXT, SysFlag.COMPRESSION_LZ4, 5)
    assert ours is not None
    (tmp_path / "ours.lz4").write_bytes(ours)
    (tmp_path / "linked.lz4").write_bytes(lz4_frame.compress(TEXT))  # the library's default
    (tmp_path / "text.raw").write_bytes(TEXT)
    (tmp_path / "CodecProbe.java").write_text(_PROBE)
    run = subprocess.run(
        ["java", "-cp", classpath, str(tmp_path / "CodecProbe.java")]
        + [str(tmp_path / name) for name in ("ours.lz4", "linked.lz4", "text.raw")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ours_line, linked_line = run.stdout.splitlines()
    assert ours_line == f"ok {len(TEXT)}"
    assert "Dependent block stream is unsupported" in linked_line  # what a linked frame meets
    theirs = (tmp_path / "java.zst").read_bytes()
    assert zstandard.frame_content_size(theirs) == -1
    assert compression.decompress(theirs, ZSTD) == TEXT
    assert compression.decompressed_size(theirs, ZSTD, len(TEXT)) == len(TEXT)
