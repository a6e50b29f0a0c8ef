"""The ACL decision for one request, and the watcher that reloads plain_acl.yml.

    check(cmd, peer_host):
      code open on this server (the name server's reads)           → allowed
      peer in globalWhiteRemoteAddresses                           → allowed
      no AccessKey                        SYSTEM_ERROR  "No accessKey is configured"
      AccessKey not in the file           SYSTEM_ERROR  "No acl config for <ak>"
      peer not in the account's whiteRemoteAddress and the Signature does not match the
      fields as received (constant time; or without _UNIQUE_KEY_QUERY, as upstream)
                                          SYSTEM_ERROR  "Check signature failed for accessKey=<ak>"
      admin code, account not admin       NO_PERMISSION "Need admin permission for request
                                                         code=<n>, but accessKey=<ak> is not"
      a resource the account may not use  NO_PERMISSION "No permission for topic:<t>" (or
                                                         group:<g>), with what was needed
      otherwise                                                     → allowed

    refusal(cmd, peer_host, resource, perm) / permits(...): a handler's question about a
    resource it read from the data the request names (broker/access.py AccessGate), asked
    after check() authenticated the AccessKey.

A system topic or group (resources.is_system_resource: SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, %DLQ%*,
...) never falls under defaultTopicPerm / defaultGroupPerm: an admin account may use it, any
other only through an explicit entry.

Remarks use upstream's words (PlainPermissionManager). They name only what the request itself
named: whether a topic exists is never looked at, so never told. Upstream answers every refusal
SYSTEM_ERROR (its hook throws); TideMQ answers the permission refusals NO_PERMISSION, a code
every client already treats as a refusal, and keeps SYSTEM_ERROR for failed authentication.
An account's whiteRemoteAddress skips the signature only: its permissions still apply (upstream
skips those too; TideMQ does not, so an address never grants more than the account has).

Cost per request: two small dict lookups for the peer's address (cached per host), one for the
account, the HMAC over the fields, and for a send one extField read and one dict lookup.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_query import UNIQUE_KEY_QUERY_FIELD
from tidemq.protocol.names import group_of_retry_topic
from tidemq.security.acl_file import Account, AclFileError, AclTable, parse_acl
from tidemq.security.permissions import (
    PUB_SUB,
    Perm,
    any_matches,
    check_permission,
    peer_address,
    perm_text,
)
from tidemq.security.resources import BROKER_POLICY, Policy, is_system_resource
from tidemq.security.signing import ACCESS_KEY, signature_matches

log = logging.getLogger(__name__)

# How often an ACL file is looked at (brokers and name servers): a revoked key stops working
# within about this long.
ACL_RELOAD_INTERVAL_MS: Final = 1_000
# Distinct peer hosts whose parsed address is remembered; past it the cache starts over
# (a broker has a few thousand clients at most, each from one host).
_HOST_CACHE_MAX: Final = 4096

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address | None
_PUB_SUB: Final = int(PUB_SUB)
_DENY: Final = int(Perm.DENY)


def _signed(secret_key: str, fields: dict[str, str], body: bytes) -> bool:
    """The signature matches the fields as received, or (upstream's exception) the fields
    without `_UNIQUE_KEY_QUERY_FIELD`: Java clients before 4.9.4 add that flag to QUERY_MESSAGE
    after signing, and upstream brokers leave it out of the signed content."""
    if signature_matches(secret_key, fields, body):
        return True
    if UNIQUE_KEY_QUERY_FIELD not in fields:
        return False
    trimmed = {key: value for key, value in fields.items() if key != UNIQUE_KEY_QUERY_FIELD}
    return signature_matches(secret_key, trimmed, body)


def resource_text(resource: str) -> str:
    """ "topic:T" or "group:G" (upstream's PlainAccessResource.printStr)."""
    group = group_of_retry_topic(resource)
    return "topic:" + resource if group is None else "group:" + group


class Authorizer:
    """Decides requests against one AclTable (replaced whole on reload)."""

    __slots__ = ("_addresses", "_globally_white", "_policy", "_table")

    def __init__(self, table: AclTable, policy: Policy = BROKER_POLICY) -> None:
        self._policy = policy
        self._addresses: dict[str, _Address] = {}
        self._table = table
        self._globally_white: dict[str, bool] = {}

    @property
    def table(self) -> AclTable:
        return self._table

    @property
    def policy(self) -> Policy:
        return self._policy

    def replace(self, table: AclTable) -> None:
        """Decide from `table` from now on (a reload)."""
        self._table = table
        self._globally_white = {}

    def _address(self, host: str) -> _Address:
        address = self._addresses.get(host, False)
        if address is False:
            if len(self._addresses) >= _HOST_CACHE_MAX:
                self._addresses.clear()
            address = self._addresses[host] = peer_address(host)
        return address  # type: ignore[return-value]

    def _is_globally_white(self, host: str) -> bool:
        white = self._globally_white.get(host)
        if white is None:
            if len(self._globally_white) >= _HOST_CACHE_MAX:
                self._globally_white.clear()
            white = any_matches(self._table.global_white, self._address(host))
            self._globally_white[host] = white
        return white

    def check(self, cmd: RemotingCommand, peer_host: str) -> RemotingCommand | None:
        """None when `cmd` from `peer_host` may proceed, else the refusal to answer with.

        Raises:
            ProtocolError: a HEART_BEAT body that is not one (after authentication).
        """
        policy = self._policy
        if cmd.code in policy.open_codes or self._is_globally_white(peer_host):
            return None
        fields = cmd.ext_fields
        access_key = fields.get(ACCESS_KEY)
        if not access_key:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="No accessKey is configured")
        account = self._table.accounts.get(access_key)
        if account is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"No acl config for {access_key}")
        if not account.white.matches(self._address(peer_host)) and not _signed(
            account.secret_key, fields, cmd.body
        ):
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                remark=f"Check signature failed for accessKey={access_key}",
            )
        if policy.needs_admin(cmd.code) and not account.admin:
            return cmd.response(
                ResponseCode.NO_PERMISSION,
                remark=f"Need admin permission for request code={cmd.code}, "
                f"but accessKey={access_key} is not",
            )
        if account.unrestricted:
            return None
        for resource, needed in policy.needs(cmd):
            if not check_permission(needed, _perm_of(account, resource)):
                return cmd.response(
                    ResponseCode.NO_PERMISSION,
                    remark=f"No permission for {resource_text(resource)}: accessKey="
                    f"{access_key} needs {perm_text(needed)}",
                )
        return None

    def refusal(
        self,
        cmd: RemotingCommand,
        peer_host: str,
        resource: str,
        needed: int,
        *,
        shown: str | None = None,
    ) -> RemotingCommand | None:
        """For a handler, after `check` let `cmd` through: None when its account (the
        AccessKey `check` authenticated) has `needed` on `resource`, else NO_PERMISSION.
        `shown` stands for the resource in the remark when the request did not name it (a
        topic read from a record is not told to an account that may not read it)."""
        access_key = cmd.ext_fields.get(ACCESS_KEY, "")
        if self.permits(access_key, peer_host, resource, needed):
            return None
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            remark=f"No permission for {shown or resource_text(resource)}: accessKey="
            f"{access_key} needs {perm_text(needed)}",
        )

    def permits(self, access_key: str | None, peer_host: str, resource: str, needed: int) -> bool:
        """Whether a request from `peer_host` signed with `access_key` (authenticated before)
        may use `resource` with `needed`: a globally white-listed peer may do anything."""
        if self._is_globally_white(peer_host):
            return True
        account = self._table.accounts.get(access_key or "")
        if account is None:
            return False
        return account.unrestricted or check_permission(needed, _perm_of(account, resource))


def _perm_of(account: Account, resource: str) -> int:
    """The account's permission on `resource`; a system topic or group (SCHEDULE_TOPIC_XXXX,
    %DLQ%*, RMQ_SYS_*, ...) never falls under a default: an admin account's, else DENY unless
    the file names it."""
    if is_system_resource(resource) and resource not in account.resource_perms:
        return _PUB_SUB if account.admin else _DENY
    return account.perm_of(resource)


@dataclass(frozen=True, slots=True)
class _Seen:
    mtime_ns: int
    size: int
    digest: bytes


class AclFileWatcher:
    """Reloads the ACL file into an Authorizer when the file changes.

    `poll()` (a periodic service calls it, about every second) reads the file and compares
    its SHA-256 (the file is a few KiB): an unchanged rewrite reloads nothing, and a same-size
    edit that left mtime where it was reloads all the same. A file that
    no longer parses keeps the table in force, and is logged once per distinct error (a file
    left broken is not logged every second); so is a file that cannot be read.
    """

    def __init__(self, path: Path, authorizer: Authorizer, seen: _Seen | None = None) -> None:
        """`seen`: the file as the authorizer's table was read from it (None: the first
        poll reads it)."""
        self.path = path
        self._authorizer = authorizer
        self._seen = seen
        self._last_error: str | None = None
        self.reloads = 0

    @property
    def last_error(self) -> str | None:
        """Why the file on disk is not the table in force, or None."""
        return self._last_error

    def poll(self) -> bool:
        """Reload if the file changed; True when a new table took effect."""
        # Hashed on every poll, not only when mtime or size moved: an edit of the same size
        # within the file system's mtime tick (or an mtime set back) changes neither.
        seen = self._seen
        try:
            stat = self.path.stat()
            data = self.path.read_bytes()
        except OSError as exc:
            self._failed(f"{self.path}: cannot read: {exc.strerror or exc}")
            return False
        current = _Seen(stat.st_mtime_ns, stat.st_size, _digest(data))
        if seen is not None and current.digest == seen.digest:
            self._seen = current
            return False
        try:
            table = _parse_bytes(data, self.path)
        except AclFileError as exc:
            self._seen = current  # retried when the file changes again
            self._failed(str(exc))
            return False
        self._seen = current
        self._last_error = None
        self._authorizer.replace(table)
        self.reloads += 1
        log.info("%s reloaded: %d accounts", self.path, len(table.accounts))
        return True

    def _failed(self, error: str) -> None:
        if error != self._last_error:
            log.error("ACL file not reloaded, the previous table stays in force: %s", error)
        self._last_error = error


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _parse_bytes(data: bytes, path: Path) -> AclTable:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AclFileError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return parse_acl(text, str(path))


def load_authorizer(
    path: Path, policy: Policy = BROKER_POLICY
) -> tuple[Authorizer, AclFileWatcher]:
    """An Authorizer over the file at `path` and its watcher.

    Raises:
        AclFileError: the file cannot be used (a server refuses to start on it).
    """
    try:
        stat = path.stat()
        data = path.read_bytes()
    except OSError as exc:
        raise AclFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    authorizer = Authorizer(_parse_bytes(data, path), policy)
    seen = _Seen(stat.st_mtime_ns, stat.st_size, _digest(data))
    return authorizer, AclFileWatcher(path, authorizer, seen)
