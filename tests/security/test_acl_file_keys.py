"""accessKey and secretKey are the text written in plain_acl.yml, never a YAML-typed value:
`012345670` is not the octal int 2739128 and `1_234_5678` not 12345678, so a client signing
with the text it was given is accepted."""

from __future__ import annotations

import pytest
from acl_samples import send_command

from tidemq.security.acl import Authorizer
from tidemq.security.acl_file import AclFileError, parse_acl
from tidemq.security.signing import Credentials, sign

ACL = """\
accounts:
  - accessKey: 1_234_5678
    secretKey: 012345670
    admin: true
  - accessKey: "0x1234567"
    secretKey: 1e10000000
    admin: true
"""


@pytest.mark.parametrize(
    ("access_key", "secret_key"),
    [("1_234_5678", "012345670"), ("0x1234567", "1e10000000")],
)
def test_keys_keep_the_text_the_client_signs_with(access_key: str, secret_key: str) -> None:
    table = parse_acl(ACL)
    assert table.accounts[access_key].secret_key == secret_key
    cmd = send_command("AnyTopic")
    sign(cmd, Credentials(access_key, secret_key))
    assert Authorizer(table).check(cmd, "127.0.0.1") is None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", "secretKey has no value"),
        ("~", "secretKey has no value"),
        ("[abcdefgh]", "secretKey must be a single value"),
        ('"short"', "secretKey must have at least 7 characters"),
    ],
)
def test_a_key_that_is_not_a_text_is_refused(value: str, error: str) -> None:
    text = f"accounts:\n  - accessKey: someAccessKey\n    secretKey: {value}\n"
    with pytest.raises(AclFileError, match=error):
        parse_acl(text)
