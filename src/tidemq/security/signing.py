"""Request signatures, as RocketMQ's ACL signs remoting requests (spec security.md §1).

    content   = the values of every extFields entry but Signature, ordered by key (byte order
                of the keys, as Java's TreeMap), concatenated with no separator, UTF-8,
                then the body bytes
    Signature = Base64(HMAC-SHA1(secret key, content))

A client adds `AccessKey` (and `SecurityToken` when it has one) before signing, so both are
signed too. The server verifies over the fields as they arrived: the decoded extFields dict is
what the peer sent, never a header re-serialised from typed fields.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from tidemq.protocol.frame import RemotingCommand

ACCESS_KEY: Final = "AccessKey"
SECURITY_TOKEN: Final = "SecurityToken"
SIGNATURE: Final = "Signature"
# The C++ client adds its channel ("ALIYUN", "LOCAL"); it is signed like any other field.
ONS_CHANNEL: Final = "OnsChannel"
# Secrets whose keyed HMAC is kept (one per account in use; a table has a handful).
_KEYED_MAX: Final = 1024


@dataclass(frozen=True, slots=True)
class Credentials:
    """An account's keys. The secret never appears in repr, logs or errors."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")


# The key order of each field-set shape seen (a client sends the same keys in the same order
# request after request), as an itemgetter: sorting every request's keys cost more than the
# rest of collecting its values. Bounded: a peer inventing shapes only refills it.
_ORDERS_MAX: Final = 512
_orders: dict[tuple[str, ...], Callable[[dict[str, str]], tuple[str, ...]]] = {}


def _order_of(shape: tuple[str, ...]) -> Callable[[dict[str, str]], tuple[str, ...]]:
    # Java's TreeMap orders String keys by UTF-16 code units; extFields keys are ASCII, where
    # that is Python's order too.
    keys = sorted(shape)
    if SIGNATURE in keys:
        keys.remove(SIGNATURE)
    if len(keys) < 2:  # itemgetter of one key returns the value, of none it cannot be built
        return lambda fields: tuple(fields[key] for key in keys)
    getter: Callable[[dict[str, str]], tuple[str, ...]] = operator.itemgetter(*keys)
    return getter


def _ordered_values(fields: dict[str, str]) -> bytes:
    """The values of `fields` but Signature, ordered by key, UTF-8."""
    shape = tuple(fields)
    order = _orders.get(shape)
    if order is None:
        if len(_orders) >= _ORDERS_MAX:
            _orders.clear()
        order = _orders[shape] = _order_of(shape)
    return "".join(order(fields)).encode()


def signed_content(fields: dict[str, str], body: bytes) -> bytes:
    """What is signed: the values of `fields` but Signature, ordered by key, then `body`."""
    return _ordered_values(fields) + body


# HMAC-SHA1 (RFC 2104): H((K ^ opad) || H((K ^ ipad) || content)), K padded to SHA-1's block.
_BLOCK: Final = 64
_IPAD: Final = bytes(byte ^ 0x36 for byte in range(256))
_OPAD: Final = bytes(byte ^ 0x5C for byte in range(256))


@functools.lru_cache(maxsize=_KEYED_MAX)
def _keyed(secret_key: str) -> tuple[Any, Any]:
    """The inner and outer SHA-1 states with the padded key hashed in, nothing else fed yet:
    copied per request, so the key's blocks are hashed once per secret. Built on hashlib's
    SHA-1 objects rather than hmac.new: copying two digest states costs about half of what
    OpenSSL 3's HMAC context copy does (measured per 1 KiB request; the result is the same
    HMAC, tests/security/test_signing.py checks it against hmac.digest)."""
    key = secret_key.encode()
    if len(key) > _BLOCK:
        key = hashlib.sha1(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha1(key.translate(_IPAD)), hashlib.sha1(key.translate(_OPAD))


def _digest(secret_key: str, fields: dict[str, str], body: bytes) -> bytes:
    """HMAC-SHA1(secret_key, signed_content(fields, body)), the body fed on its own (a 1 MiB
    body is never copied behind the fields)."""
    inner_start, outer_start = _keyed(secret_key)
    inner = inner_start.copy()
    inner.update(_ordered_values(fields))
    if body:
        inner.update(body)
    outer = outer_start.copy()
    outer.update(inner.digest())
    digest: bytes = outer.digest()
    return digest


def signature(secret_key: str, fields: dict[str, str], body: bytes) -> str:
    """Base64(HMAC-SHA1(secret_key, signed_content(fields, body)))."""
    return binascii.b2a_base64(_digest(secret_key, fields, body), newline=False).decode()


def sign(command: RemotingCommand, credentials: Credentials) -> None:
    """Add AccessKey (and SecurityToken) to `command`'s extFields, then its Signature."""
    fields = command.ext_fields
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = signature(credentials.secret_key, fields, command.body)


def signature_matches(secret_key: str, fields: dict[str, str], body: bytes) -> bool:
    """Whether `fields` carry the Signature `secret_key` gives them and `body`, compared in
    constant time. False when there is no Signature."""
    claimed = fields.get(SIGNATURE)
    if claimed is None:
        return False
    try:
        # Decoded once and compared as raw digests; strict: only canonical Base64 matches, as
        # upstream compares the text. Not ASCII (ValueError) or not Base64: no match.
        claimed_digest = binascii.a2b_base64(claimed, strict_mode=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(claimed_digest, _digest(secret_key, fields, body))
