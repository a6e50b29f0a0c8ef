"""The broker's ACL parts (aclEnable): the request hook, the file reload, and the signer of
the broker's own requests.

    aclEnable=true ─▶ plain_acl.yml read at construction (a bad file: the broker does not start)
                 ─▶ every request on the client port passes Authorizer.check (security/acl.py)
                    before its handler; a refusal is answered in its place
                 ─▶ "acl-reload" polls the file every ACL_RELOAD_INTERVAL_MS (a bad edit keeps
                    the table in force and is logged)
    innerClientAuthenticationCredentials ─▶ `signer`: REGISTER_BROKER / UNREGISTER_BROKER to
                    the name servers and a slave's requests to its master are signed with it
                    (whether or not this broker checks requests itself)
"""

from __future__ import annotations

import functools
import logging
from typing import Final

from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.handlers.common import Refusal
from tidemq.broker.service import PeriodicService
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import Connection, RequestHook, Signer
from tidemq.remoting.handlers import refusing_hook
from tidemq.security.acl import (
    ACL_RELOAD_INTERVAL_MS,
    AclFileWatcher,
    Authorizer,
    load_authorizer,
)
from tidemq.security.acl_file import AclFileError
from tidemq.security.resources import BROKER_POLICY
from tidemq.security.signing import sign

log = logging.getLogger(__name__)


def inner_signer(config: BrokerConfig) -> Signer | None:
    """What the broker's outbound clients sign requests with; None without credentials."""
    credentials = config.inner_credentials
    if credentials is None:
        return None
    return functools.partial(sign, credentials=credentials)


class AccessGate:
    """What a handler asks when the resource is in the data a request names (a record, a
    half message, a batch's halves), after the request hook let the request through: its
    AccessKey is then authenticated (or the peer is globally white-listed: everything is
    permitted). NO_ACL, the gate of a broker without aclEnable, permits everything at the
    cost of one attribute test."""

    __slots__ = ("_authorizer",)

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self._authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self._authorizer is not None

    def refusal(
        self,
        connection: Connection,
        cmd: RemotingCommand,
        resource: str,
        needed: int,
        *,
        shown: str | None = None,
    ) -> RemotingCommand | None:
        """None when the request's account has `needed` (Perm bits) on `resource` (a topic,
        or a group as group_resource(g)); else the NO_PERMISSION answer, whose remark names
        `shown` in place of a resource the request itself did not name."""
        if self._authorizer is None:
            return None
        return self._authorizer.refusal(cmd, connection.peer[0], resource, needed, shown=shown)

    def require(
        self,
        connection: Connection,
        cmd: RemotingCommand,
        resource: str,
        needed: int,
        *,
        shown: str | None = None,
    ) -> None:
        """`refusal` raised as a Refusal (handlers.common.guarded answers and logs it)."""
        refused = self.refusal(connection, cmd, resource, needed, shown=shown)
        if refused is not None:
            raise Refusal(refused.code, refused.remark or "")


NO_ACL: Final = AccessGate()


class BrokerAcl:
    """The Authorizer over aclFilePath and its watcher.

    Raises (constructor):
        ConfigError: the file cannot be read or is not a valid ACL file.
    """

    def __init__(self, config: BrokerConfig) -> None:
        assert config.acl_enable
        assert config.acl_file_path is not None
        try:
            self.authorizer, self.watcher = load_authorizer(config.acl_file_path, BROKER_POLICY)
        except AclFileError as exc:
            raise ConfigError(f"aclFilePath: {exc}") from None
        log.info(
            "ACL on: %d accounts from %s",
            len(self.authorizer.table.accounts),
            config.acl_file_path,
        )
        # The RemotingServer's request hook: None lets the request through.
        self.hook: RequestHook = refusing_hook(self.authorizer.check, "ACL")

    @property
    def gate(self) -> AccessGate:
        return AccessGate(self.authorizer)

    def reload_service(self) -> PeriodicService:
        return PeriodicService("acl-reload", ACL_RELOAD_INTERVAL_MS, self._poll)

    def _poll(self) -> None:
        self.watcher.poll()


__all__ = [
    "ACL_RELOAD_INTERVAL_MS",
    "NO_ACL",
    "AccessGate",
    "AclFileWatcher",
    "Authorizer",
    "BrokerAcl",
    "inner_signer",
]
