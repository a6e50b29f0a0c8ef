"""CRC-32 of a record whose body's CRC is already known, without reading the body again.

A stored record carries two CRCs over its body: BODYCRC (the body alone) and the `__CRC32#`
digits (every byte before them, body included; protocol/record.py). Computed directly, a 1 MiB
body is read twice (~0.35 ms each here). zlib's crc32_combine gives CRC(A + B) from CRC(A),
CRC(B) and len(B) by multiplying CRC(A) by x^(8 len(B)) modulo the CRC polynomial; Python's zlib
does not expose it, so it is written here (the method of zlib 1.2.12's crc32.c: a table of
x^(2^k) and carry-less multiplication modulo the reflected polynomial). The operator for a
length is cached: bodies come in few sizes. Cost here: ~45 us uncached, ~15 us cached, against
~0.35-0.6 ms for a 1 MiB crc32, so the record encoder combines only for bodies of
COMBINE_MIN_BYTES or more.
"""

from __future__ import annotations

import functools
import zlib
from typing import Final

_POLY: Final = 0xEDB88320  # CRC-32 (zlib), reflected
_TOP: Final = 1 << 31  # x^0 in the reflected representation
COMBINE_MIN_BYTES: Final = 64 * 1024


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial (reflected bit order)."""
    m = _TOP
    product = 0
    while m:
        if a & m:
            product ^= b
            if not a & (m - 1):
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> tuple[int, ...]:
    power = _TOP >> 1  # x^1
    table = [power]
    for _ in range(31):
        power = _multmodp(power, power)
        table.append(power)
    return tuple(table)


_X2N: Final = _powers()  # x^(2^k) modulo the polynomial, k = 0..31


@functools.lru_cache(maxsize=256)
def _shift(length: int) -> int:
    """x^(8 * length) modulo the polynomial: the operator that appends `length` bytes."""
    power = _TOP
    k = 3  # 8 bits a byte
    while length:
        if length & 1:
            power = _multmodp(_X2N[k & 31], power)
        length >>= 1
        k += 1
    return power


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """zlib.crc32(a + b) given zlib.crc32(a), zlib.crc32(b) and len(b)."""
    return _multmodp(_shift(length_b), crc_a) ^ crc_b


def crc32_around(head: bytes, body: bytes, body_crc: int, tail: bytes) -> int:
    """zlib.crc32(head + body + tail), where body_crc is zlib.crc32(body) (unmasked): the body is
    read again only when it is small (combining costs more than reading it then)."""
    crc = zlib.crc32(head)
    if len(body) >= COMBINE_MIN_BYTES:
        crc = crc32_combine(crc, body_crc, len(body))
    else:
        crc = zlib.crc32(body, crc)
    return zlib.crc32(tail, crc)
