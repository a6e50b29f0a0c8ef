"""plain_acl.yml parsing (security/acl_file.py): every key, and bad files named by line."""

from __future__ import annotations

from pathlib import Path

import pytest
from acl_samples import ACL_YAML, ADMIN, CONSUMER, PRODUCER

from tidemq.security.acl_file import AclFileError, load_acl_file, parse_acl
from tidemq.security.permissions import PUB_SUB, Perm, peer_address


def test_every_key_of_the_sample_file() -> None:
    table = parse_acl(ACL_YAML)
    assert table.global_white_remote_addresses == ("10.10.103.*",)
    assert set(table.accounts) == {PRODUCER.access_key, CONSUMER.access_key, ADMIN.access_key}
    producer = table.accounts[PRODUCER.access_key]
    assert producer.secret_key == PRODUCER.secret_key
    assert not producer.admin
    assert producer.default_topic_perm == Perm.DENY
    assert producer.default_group_perm == Perm.SUB
    assert producer.perm_of("TopicA") == Perm.PUB
    assert producer.perm_of("TopicB") == PUB_SUB
    assert producer.perm_of("TopicD") == Perm.DENY
    assert producer.perm_of("Unlisted") == Perm.DENY  # defaultTopicPerm
    # Groups live under their retry topic, as upstream keeps them.
    assert producer.perm_of("%RETRY%GroupA") == PUB_SUB
    assert producer.perm_of("%RETRY%GroupD") == Perm.DENY
    assert producer.perm_of("%RETRY%Other") == Perm.SUB  # defaultGroupPerm
    assert not producer.white.matches(peer_address("127.0.0.1"))  # blank: nothing
    assert not producer.unrestricted
    admin = table.accounts[ADMIN.access_key]
    assert admin.admin
    assert admin.unrestricted  # admin listing no topic or group permission
    assert admin.white.matches(peer_address("192.168.1.9"))
    consumer = table.accounts[CONSUMER.access_key]
    assert not consumer.admin
    assert consumer.default_topic_perm == Perm.SUB


def test_absent_defaults_are_deny_and_an_admin_with_perms_is_restricted() -> None:
    table = parse_acl(
        "accounts:\n"
        "  - accessKey: someAdmin\n"
        "    secretKey: someSecret\n"
        "    admin: 'true'\n"
        "    topicPerms: [T=PUB]\n"
    )
    account = table.accounts["someAdmin"]
    assert account.admin
    assert not account.unrestricted
    assert account.default_topic_perm == Perm.DENY
    assert account.default_group_perm == Perm.DENY


def test_no_accounts_and_empty_lists_are_fine() -> None:
    table = parse_acl("globalWhiteRemoteAddresses:\naccounts:\n")
    assert table.accounts == {}
    assert table.global_white == ()


def test_secrets_are_not_in_repr() -> None:
    table = parse_acl(ACL_YAML)
    assert PRODUCER.secret_key not in repr(table)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("accounts: [\n", "line"),
        ("- a\n- b\n", "line 1: the file must be a mapping"),
        ("accounts:\n  - secretKey: longEnough\n", "line 2: account without accessKey"),
        (
            "accounts:\n  - accessKey: short\n    secretKey: longEnough\n",
            "line 2: accessKey must have at least 7",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: tiny\n",
            "line 3: secretKey must have at least 7",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n"
            "    defaultTopicPerm: READ\n",
            "line 4: defaultTopicPerm: unknown permission 'READ'",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n"
            "    topicPerms:\n      - TopicA\n",
            "line 5: topicPerms entry 'TopicA' must be NAME=PERM",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n"
            "    groupPerms:\n      - g=SUBB\n",
            "line 5: groupPerms 'g=SUBB': unknown permission",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n"
            "    whiteRemoteAddress: 10.0.300.*\n",
            "line 4: whiteRemoteAddress",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n    admin: maybe\n",
            "line 4: admin must be true or false",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: longEnough\n"
            "    namespacePerms: [x]\n",
            "line 4: unknown account key namespacePerms",
        ),
        (
            "accounts:\n  - accessKey: longEnough\n    secretKey: secretOne\n"
            "  - accessKey: longEnough\n    secretKey: secretTwo\n",
            "line 4: accessKey 'longEnough' appears twice",
        ),
        ("globalWhiteRemoteAddresses: 10.0.0.1\n", "line 1: globalWhiteRemoteAddresses must be"),
        ("accounts:\n  - just-a-string\n", "line 2: an account must be a mapping"),
    ],
)
def test_bad_files_are_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(AclFileError) as caught:
        parse_acl(text, "acl.yml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("acl.yml")


def test_errors_never_quote_a_secret() -> None:
    secret = "TheSecretValue99"
    text = f"accounts:\n  - accessKey: x\n    secretKey: {secret}\n"
    with pytest.raises(AclFileError) as caught:
        parse_acl(text)
    assert secret not in str(caught.value)


def test_unknown_top_level_keys_are_ignored() -> None:
    table = parse_acl("dataVersion:\n  - counter: 1\naccounts:\n")
    assert table.accounts == {}


def test_load_names_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(AclFileError, match="cannot read"):
        load_acl_file(tmp_path / "missing.yml")
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    assert set(load_acl_file(path).accounts) == {
        PRODUCER.access_key,
        CONSUMER.access_key,
        ADMIN.access_key,
    }
