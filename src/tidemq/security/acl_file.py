"""plain_acl.yml, RocketMQ's ACL file, read into an immutable AclTable.

    globalWhiteRemoteAddresses:          # need no signature at all (permissions.py: forms)
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ              # at least 7 characters, unique
        secretKey: 12345678              # at least 7 characters
        whiteRemoteAddress: 192.168.0.*  # requests from here need no signature
        admin: false                     # admin codes (resources.py) need true
        defaultTopicPerm: DENY           # DENY | PUB | SUB | PUB|SUB (absent: DENY)
        defaultGroupPerm: SUB
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
        groupPerms:
          - groupA=SUB

Groups are kept as upstream keeps them: under their retry topic, `%RETRY%<group>`, in one
resource table with the topics, so a request naming `%RETRY%g` (a consumer's retry topic) is
checked against group g's permission. An admin account that lists no topic or group
permission may use every resource (upstream's PlainPermissionChecker); one that lists some is
checked like any other account.

Errors name the file, the line and the field; a secret never appears in one (nor in repr).
Keys TideMQ does not know are refused inside an account (a restriction it cannot enforce must
not be dropped silently) and ignored at the top level (upstream writes `dataVersion` there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml

from tidemq.protocol.names import is_retry_topic, retry_topic
from tidemq.security.permissions import AddressPattern, Perm, compile_address, parse_perm

log = logging.getLogger(__name__)

# Upstream's buildPlainAccessResource refuses keys of 6 characters or fewer.
KEY_LENGTH_MIN: Final = 7
_ACCOUNT_KEYS: Final = frozenset(
    {
        "accessKey",
        "secretKey",
        "whiteRemoteAddress",
        "admin",
        "defaultTopicPerm",
        "defaultGroupPerm",
        "topicPerms",
        "groupPerms",
    }
)
_TOP_KEYS: Final = frozenset({"globalWhiteRemoteAddresses", "accounts"})
_NULL_TAG: Final = "tag:yaml.org,2002:null"


class AclFileError(ValueError):
    """plain_acl.yml cannot be used; the message names where and why (never a secret)."""


def group_resource(group: str) -> str:
    """The key a group's permission is kept and checked under: its retry topic."""
    return retry_topic(group)


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    white: AddressPattern
    admin: bool
    # Permissions are Perm bits kept as plain ints: the per-request check stays off IntFlag's
    # operators (permissions.check_permission).
    default_topic_perm: int
    default_group_perm: int
    # Topics by name, groups by retry topic (group_resource).
    resource_perms: Mapping[str, int]
    # Upstream: an admin listing no topic or group permission is not checked per resource.
    unrestricted: bool

    def perm_of(self, resource: str) -> int:
        perm = self.resource_perms.get(resource)
        if perm is not None:
            return perm
        if is_retry_topic(resource):
            return self.default_group_perm
        return self.default_topic_perm


@dataclass(frozen=True, slots=True)
class AclTable:
    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def global_white_remote_addresses(self) -> tuple[str, ...]:
        return tuple(pattern.text for pattern in self.global_white)


def load_acl_file(path: Path) -> AclTable:
    """Read and parse the file at `path`.

    Raises:
        AclFileError: unreadable, not YAML, or not a valid ACL table.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AclFileError(f"{path}: cannot read: {exc}") from None
    return parse_acl(text, str(path))


def parse_acl(text: str, source: str = "plain_acl.yml") -> AclTable:
    """Parse plain_acl.yml text; `source` names it in errors.

    Raises:
        AclFileError: not YAML, or not a valid ACL table.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise AclFileError(f"{source}{where}: {problem}") from None
    if root is None:
        raise AclFileError(f"{source}: empty file (no accounts, no white list)")
    reader = _Reader(source)
    top = reader.mapping(root, "the file")
    for key in top:
        if key not in _TOP_KEYS:
            log.info("%s: ignoring top-level key %s", source, key)
    white_node = top.get("globalWhiteRemoteAddresses")
    global_white: list[AddressPattern] = []
    if white_node is not None:
        for node in reader.sequence(white_node, "globalWhiteRemoteAddresses"):
            entry = reader.scalar_text(node, "globalWhiteRemoteAddresses")
            global_white.append(reader.address(node, entry, "globalWhiteRemoteAddresses"))
    accounts: dict[str, Account] = {}
    accounts_node = top.get("accounts")
    if accounts_node is not None:
        for node in reader.sequence(accounts_node, "accounts"):
            account = reader.account(node)
            if account.access_key in accounts:
                raise AclFileError(
                    f"{reader.at(node)}: accessKey {account.access_key!r} appears twice"
                )
            accounts[account.access_key] = account
    return AclTable(tuple(global_white), MappingProxyType(accounts))


class _Reader:
    """Walks the composed YAML nodes, so every error can name its line."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._constructor = yaml.SafeLoader("")

    def at(self, node: yaml.Node) -> str:
        return f"{self._source} line {node.start_mark.line + 1}"

    def fail(self, node: yaml.Node, message: str) -> AclFileError:
        return AclFileError(f"{self.at(node)}: {message}")

    def mapping(self, node: yaml.Node, what: str) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of keys to values")
        result: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.scalar_text(key_node, "a key")
            if key in result:
                raise self.fail(key_node, f"{key} appears twice")
            result[key] = value_node
        return result

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return []  # `key:` with nothing after it
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{what} must be a list (lines starting with '- ')")
        return list(node.value)

    def value(self, node: yaml.Node) -> Any:
        return self._constructor.construct_object(node, deep=True)

    def scalar_text(self, node: yaml.Node, what: str, *, optional: bool = False) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value")
        value = self.value(node)
        if value is None:
            if optional:
                return ""
            raise self.fail(node, f"{what} has no value")
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def address(self, node: yaml.Node, entry: str, what: str) -> AddressPattern:
        try:
            return compile_address(entry)
        except ValueError as exc:
            raise self.fail(node, f"{what}: {exc}") from None

    def perm(self, node: yaml.Node, text: str, what: str) -> Perm:
        try:
            return parse_perm(text)
        except ValueError as exc:
            raise self.fail(node, f"{what}: {exc}") from None

    def flag(self, node: yaml.Node, what: str) -> bool:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else node
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise self.fail(node, f"{what} must be true or false")

    def key(self, fields: dict[str, yaml.Node], name: str, node: yaml.Node) -> str:
        """accessKey or secretKey: present, long enough, the scalar's text as written (quotes
        and escapes resolved) and never typed: `012345670` stays that text, not the octal int
        2739128, nor `1_234_5678` 12345678; the client signs with the text. The value is never
        quoted in an error."""
        value_node = fields.get(name)
        if value_node is None:
            raise self.fail(node, f"account without {name}")
        if not isinstance(value_node, yaml.ScalarNode):
            raise self.fail(value_node, f"{name} must be a single value")
        if value_node.tag == _NULL_TAG:  # `key:`, `key: ~`, `key: null`
            raise self.fail(value_node, f"{name} has no value")
        value = str(value_node.value)
        if len(value) < KEY_LENGTH_MIN:
            raise self.fail(value_node, f"{name} must have at least {KEY_LENGTH_MIN} characters")
        return value

    def account(self, node: yaml.Node) -> Account:
        fields = self.mapping(node, "an account")
        for name, value_node in fields.items():
            if name not in _ACCOUNT_KEYS:
                raise self.fail(
                    value_node,
                    f"unknown account key {name} (TideMQ knows {', '.join(sorted(_ACCOUNT_KEYS))})",
                )
        access_key = self.key(fields, "accessKey", node)
        secret_key = self.key(fields, "secretKey", node)
        white_node = fields.get("whiteRemoteAddress")
        white = AddressPattern("")
        if white_node is not None:
            entry = self.scalar_text(white_node, "whiteRemoteAddress", optional=True)
            white = self.address(white_node, entry, "whiteRemoteAddress")
        admin = self.flag(fields["admin"], "admin") if "admin" in fields else False
        defaults: dict[str, int] = {}
        for name in ("defaultTopicPerm", "defaultGroupPerm"):
            perm_node = fields.get(name)
            text = self.scalar_text(perm_node, name, optional=True) if perm_node else ""
            # Absent or empty: DENY, as upstream's parsePermFromString(null).
            perm = self.perm(perm_node, text, name) if perm_node and text else Perm.DENY
            defaults[name] = int(perm)
        perms = self.resource_perms(fields, "topicPerms", lambda name: name)
        perms.update(self.resource_perms(fields, "groupPerms", group_resource))
        return Account(
            access_key=access_key,
            secret_key=secret_key,
            white=white,
            admin=admin,
            default_topic_perm=defaults["defaultTopicPerm"],
            default_group_perm=defaults["defaultGroupPerm"],
            resource_perms=MappingProxyType(perms),
            unrestricted=admin and not perms,
        )

    def resource_perms(
        self, fields: dict[str, yaml.Node], name: str, key_of: Callable[[str], str]
    ) -> dict[str, int]:
        node = fields.get(name)
        result: dict[str, int] = {}
        if node is None:
            return result
        for item in self.sequence(node, name):
            entry = self.scalar_text(item, name)
            resource, sep, perm_text = entry.partition("=")
            if not sep or not resource.strip() or "=" in perm_text:
                raise self.fail(item, f"{name} entry {entry!r} must be NAME=PERM")
            perm = self.perm(item, perm_text, f"{name} {entry!r}")
            result[key_of(resource.strip())] = int(perm)
        return result
