"""Signature verification compares raw digests (the claimed Base64 decoded once, strictly) and
keys one HMAC per secret: pinned vectors, malformed claims, and the keyed HMAC kept."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from tidemq.security import signing
from tidemq.security.signing import SIGNATURE, signature, signature_matches

SECRET = "pinnedSK-example"
FIELDS = {"b": "TopicA", "a": "PG", "AccessKey": "producerAK", "OnsChannel": "LOCAL"}


def by_hand(secret: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


@pytest.mark.parametrize("body", [b"", b"\x00body\xff", bytes(range(256)) * 4096])
def test_signature_is_hmac_sha1_over_the_ordered_values_then_the_body(body: bytes) -> None:
    content = b"producerAK" + b"LOCAL" + b"PG" + b"TopicA" + body
    expected = by_hand(SECRET, content)
    assert signature(SECRET, dict(FIELDS), body) == expected
    assert signature_matches(SECRET, {**FIELDS, SIGNATURE: expected}, body)
    assert not signature_matches("otherSK-example", {**FIELDS, SIGNATURE: expected}, body)


def test_pinned_vector() -> None:
    # Computed with `openssl dgst -sha1 -hmac producerSK-example`.
    fields = {**FIELDS, SIGNATURE: "U1X8zhcXCnmzI019HKPPzrLdMVg="}
    assert signature_matches("producerSK-example", fields, b"\x00body\xff")


@pytest.mark.parametrize(
    "claimed",
    [
        "",
        "not base64!",
        "U1X8zhcXCnmzI019HKPPzrLdMVg",  # padding missing
        "U1X8zhcXCnmzI019HKPPzrLdMVg=\n",  # trailing junk a lenient decoder would skip
        "U1X8zhcXCnmzI019HKPPzrLdMVg==",
        "U1X8zhcXCnmzI019HKPPzrLdMVgé=",  # not ASCII
        "AAAA",  # valid Base64, wrong length
    ],
)
def test_a_malformed_or_wrong_claim_does_not_match(claimed: str) -> None:
    assert not signature_matches("producerSK-example", {**FIELDS, SIGNATURE: claimed}, b"")


def test_one_keyed_hmac_per_secret_is_kept() -> None:
    signing._keyed.cache_clear()
    for i in range(50):
        signature("cacheSK-example", {"n": str(i)}, b"x")
        signature("cacheSK-other", {"n": str(i)}, b"x")
    info = signing._keyed.cache_info()
    assert (info.misses, info.hits) == (2, 98)
    # Copies are fed, never the kept one: the same request signs the same every time.
    assert signature("cacheSK-example", {"n": "1"}, b"x") == by_hand("cacheSK-example", b"1x")


@pytest.mark.parametrize(
    "secret",
    [
        "k",  # far shorter than SHA-1's 64-byte block: zero-padded
        "s" * 64,  # exactly one block
        "long-secret-" * 10,  # over one block: hashed first, as RFC 2104 says
        "секрет-ключ",  # non-ASCII: its UTF-8 bytes are the key
    ],
)
def test_hmac_over_hashlib_states_is_hmac_sha1_for_every_key_length(secret: str) -> None:
    body = bytes(range(256)) * 5
    assert signature(secret, dict(FIELDS), body) == by_hand(
        secret, b"producerAKLOCALPGTopicA" + body
    )


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {SIGNATURE: "x"},
        {"only": "v"},
        {"only": "v", SIGNATURE: "x"},
        {"b": "2", SIGNATURE: "x", "a": "1"},
        {"b": "2", "a": "1"},  # the same keys in another order: another shape, the same text
    ],
)
def test_values_are_ordered_by_key_whatever_the_shape(fields: dict[str, str]) -> None:
    expected = "".join(fields[key] for key in sorted(fields) if key != SIGNATURE).encode()
    assert signing.signed_content(fields, b"!") == expected + b"!"
    assert signing.signed_content(dict(fields), b"") == expected  # the cached order again


def test_the_order_cache_is_bounded() -> None:
    for i in range(signing._ORDERS_MAX * 2):
        assert signing.signed_content({f"k{i}": "v", "a": "1"}, b"") == (
            b"1v" if f"k{i}" > "a" else b"v1"
        )
    assert len(signing._orders) <= signing._ORDERS_MAX
