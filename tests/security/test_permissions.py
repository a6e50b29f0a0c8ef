"""Permission bits and white-listed address patterns (security/permissions.py) against
upstream's Permission.checkPermission and RemoteAddressStrategyFactory rules."""

from __future__ import annotations

import pytest

from tidemq.security.permissions import (
    PUB_SUB,
    Perm,
    check_permission,
    compile_address,
    parse_perm,
    peer_address,
)


@pytest.mark.parametrize(
    ("text", "perm"),
    [
        ("PUB", Perm.PUB),
        ("SUB", Perm.SUB),
        ("PUB|SUB", PUB_SUB),
        ("SUB|PUB", PUB_SUB),
        (" PUB | SUB ", PUB_SUB),
        ("DENY", Perm.DENY),
    ],
)
def test_parse_perm_knows_upstreams_spellings(text: str, perm: Perm) -> None:
    assert parse_perm(text) == perm


@pytest.mark.parametrize("text", ["pub", "ANY", "PUB,SUB", "", "READ"])
def test_parse_perm_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="unknown permission"):
        parse_perm(text)


@pytest.mark.parametrize(
    ("needed", "owned", "allowed"),
    [
        (Perm.PUB, Perm.PUB, True),
        (Perm.PUB, Perm.SUB, False),
        (Perm.SUB, PUB_SUB, True),
        (Perm.PUB, Perm.DENY, False),
        (Perm.PUB, Perm.DENY | Perm.PUB, False),  # DENY wins over anything beside it
        (Perm.ANY, Perm.SUB, True),
        (Perm.ANY, Perm.PUB, True),
        (Perm.ANY, Perm.DENY, False),
    ],
)
def test_check_permission_as_upstream(needed: Perm, owned: Perm, allowed: bool) -> None:
    assert check_permission(needed, owned) is allowed


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("*", ["1.2.3.4", "::1"], []),
        ("*.*.*.*", ["10.0.0.1"], []),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "10.168.1.1"]),
        ("192.168.1-20.*", ["192.168.1.7", "192.168.20.255"], ["192.168.21.1", "192.168.0.1"]),
        ("10.*.*.*", ["10.200.3.4"], ["11.0.0.1"]),
        ("192.168.0.{1,2,10}", ["192.168.0.1", "192.168.0.10"], ["192.168.0.3"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
        ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
        ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["::2"]),
        ("fe80:0:0:0:0:0:0:1-ff", ["fe80::1", "fe80::ff"], ["fe80::100"]),
        ("", [], ["127.0.0.1"]),
    ],
)
def test_address_patterns(pattern: str, inside: list[str], outside: list[str]) -> None:
    compiled = compile_address(pattern)
    for host in inside:
        assert compiled.matches(peer_address(host)), (pattern, host)
    for host in outside:
        assert not compiled.matches(peer_address(host)), (pattern, host)


def test_a_peer_that_is_no_address_matches_only_the_wildcard() -> None:
    assert peer_address("localhost") is None
    assert not compile_address("127.0.0.1").matches(None)
    assert compile_address("*").matches(None)


@pytest.mark.parametrize(
    "pattern", ["192.168.1", "192.168.300.*", "192.168.5-2.*", "host.example", "1.2.3.{x}"]
)
def test_bad_address_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        compile_address(pattern)
