"""Permissions and white-listed addresses of RocketMQ's plain ACL (acl 1.0), as upstream reads them.

Permissions are bit sets, as upstream's `Permission`:

    DENY 1   ANY 2   PUB 4   SUB 8          "PUB|SUB" and "SUB|PUB" are 12

    check_permission(needed, owned):  owned has DENY     → refused
                                      needed has ANY     → owned has PUB or SUB
                                      otherwise          → needed & owned != 0

Addresses (`globalWhiteRemoteAddresses`, an account's `whiteRemoteAddress`) in upstream's forms
(RemoteAddressStrategyFactory):

    blank                                   matches nothing
    *   *.*.*.*   *:*:*:*:*:*:*:*           matches every address
    192.168.1.{1,2,10}                      the listed last segments
    10.0.0.1,10.0.0.2                       a comma-separated list of addresses
    192.168.1.*   192.168.1-20.*   10.*.*.* per segment: a number, `*` or a range `a-b`
    192.168.1.2   ::1                       one address (IPv6 compared in its full form)

Upstream accepts `*` and `a-b` in one segment followed only by `*`s; TideMQ accepts a pattern
of any mix of the three per segment, a superset. IPv6 ranges work on the eight groups of the
full form (a pattern must spell all eight). A peer connected over IPv4-mapped IPv6 is matched
as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import IntFlag
from typing import Final


class Perm(IntFlag):
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


PUB_SUB: Final = Perm.PUB | Perm.SUB
# The spellings upstream's parsePermFromString knows; TideMQ refuses any other (upstream reads
# it as DENY silently, so a typo would lock an account out without a word).
_PERM_NAMES: Final[dict[str, Perm]] = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": PUB_SUB,
    "SUB|PUB": PUB_SUB,
}
PERM_SPELLINGS: Final = tuple(_PERM_NAMES)


def parse_perm(text: str) -> Perm:
    """`text` as a permission.

    Raises:
        ValueError: not one of PERM_SPELLINGS.
    """
    perm = _PERM_NAMES.get(text.strip().replace(" ", ""))
    if perm is None:
        raise ValueError(f"unknown permission {text!r} (expected {' | '.join(PERM_SPELLINGS)})")
    return perm


def perm_text(perm: int) -> str:
    if perm & Perm.DENY:
        return "DENY"
    names = [name for name, bit in (("PUB", Perm.PUB), ("SUB", Perm.SUB)) if perm & bit]
    return "|".join(names) or ("PUB or SUB" if perm & Perm.ANY else "none")


# Plain ints for the per-request check: IntFlag's operators cost a microsecond each.
_DENY: Final = int(Perm.DENY)
_ANY: Final = int(Perm.ANY)
_PUB_SUB: Final = int(PUB_SUB)


def check_permission(needed: int, owned: int) -> bool:
    """Whether `owned` grants `needed` (upstream's Permission.checkPermission)."""
    if owned & _DENY:
        return False
    if needed & _ANY:
        return bool(owned & _PUB_SUB)
    return bool(needed & owned)


# -- addresses ------------------------------------------------------------------------------

_WILDCARDS: Final = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})
# (lo, hi) per segment: four octets of an IPv4 address, eight groups of an IPv6 one.
_Ranges = tuple[tuple[int, int], ...]


def peer_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an address (IPv4-mapped IPv6 as IPv4); None when it is not an IP address."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _segments(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, ...]:
    packed = address.packed
    if len(packed) == 4:
        return tuple(packed)
    return tuple(int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2))


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One white-list entry, compiled. `text` is the entry as written."""

    text: str
    everything: bool = False
    exact: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address] = frozenset()
    ranges: tuple[_Ranges, ...] = ()

    def matches(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if self.everything:
            return True
        if address is None or not (self.exact or self.ranges):
            return False
        if address in self.exact:
            return True
        if not self.ranges:
            return False
        segments = _segments(address)
        for ranges in self.ranges:
            if len(ranges) == len(segments) and all(
                lo <= value <= hi for (lo, hi), value in zip(ranges, segments, strict=True)
            ):
                return True
        return False


def _one_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = peer_address(text.strip())
    if address is None:
        raise ValueError(f"{text.strip()!r} is not an IP address")
    return address


def _segment_range(segment: str, base: int, top: int) -> tuple[int, int]:
    segment = segment.strip()
    if segment == "*":
        return (0, top)
    lo_text, dash, hi_text = segment.partition("-")
    try:
        lo = int(lo_text, base)
        hi = int(hi_text, base) if dash else lo
    except ValueError:
        raise ValueError(f"segment {segment!r} is not a number, '*' or 'a-b'") from None
    if not 0 <= lo <= hi <= top:
        raise ValueError(f"segment {segment!r} is out of range 0..{top:x}")
    return (lo, hi)


def _range_pattern(text: str) -> _Ranges:
    if ":" in text:
        parts, base, top, count = text.split(":"), 16, 0xFFFF, 8
    else:
        parts, base, top, count = text.split("."), 10, 255, 4
    if len(parts) != count:
        raise ValueError(f"a range pattern needs {count} segments")
    return tuple(_segment_range(part, base, top) for part in parts)


def compile_address(text: str | None) -> AddressPattern:
    """Compile one white-list entry (forms in the module docstring).

    Raises:
        ValueError: the entry is in none of the forms.
    """
    stripped = (text or "").strip()
    if not stripped:
        return AddressPattern(stripped)
    if stripped in _WILDCARDS:
        return AddressPattern(stripped, everything=True)
    if stripped.endswith("}"):
        head, brace, listed = stripped.rpartition("{")
        if not brace or not head or head[-1] not in ".:":
            raise ValueError(f"{stripped!r}: a list is written prefix.{{a,b}}")
        items = [head + item.strip() for item in listed[:-1].split(",") if item.strip()]
        return AddressPattern(stripped, exact=frozenset(_one_address(i) for i in items))
    if "," in stripped:
        items = [item for item in stripped.split(",") if item.strip()]
        return AddressPattern(stripped, exact=frozenset(_one_address(i) for i in items))
    if "*" in stripped or "-" in stripped:
        return AddressPattern(stripped, ranges=(_range_pattern(stripped),))
    return AddressPattern(stripped, exact=frozenset({_one_address(stripped)}))


def any_matches(
    patterns: tuple[AddressPattern, ...],
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> bool:
    return any(pattern.matches(address) for pattern in patterns)
