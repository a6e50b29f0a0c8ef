"""The command line of ACL: `tidemq dev --acl-file`'s broker settings, `tidemq namesrv
--acl-file` and `tidemq broker` refusing a bad file, `--print-config` hiding the credentials,
and the example file in conf/ being a valid one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acl_samples import ACL_YAML, ADMIN

from tidemq.cli.main import build_parser
from tidemq.cli.servers import dev_overrides
from tidemq.security.acl_file import load_acl_file

EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "plain_acl.example.yml"


def _dev(tmp_path: Path, *argv: str) -> list[dict[str, str]]:
    args = build_parser().parse_args(["dev", "--data-dir", str(tmp_path / "data"), *argv])
    return dev_overrides(args, {})


def test_dev_acl_file_turns_acl_on_with_the_first_admin_account(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    master, slave = _dev(tmp_path, "--acl-file", str(path), "--slave")
    for broker in (master, slave):
        assert broker["aclEnable"] == "true"
        assert broker["aclFilePath"] == str(path.resolve())
        assert json.loads(broker["innerClientAuthenticationCredentials"]) == {
            "accessKey": ADMIN.access_key,
            "secretKey": ADMIN.secret_key,
        }


def test_dev_acl_file_keeps_given_inner_credentials(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    given = '{"accessKey":"someAdminKey","secretKey":"someAdminSecret"}'
    [broker] = _dev(
        tmp_path, "--acl-file", str(path), "--set", f"innerClientAuthenticationCredentials={given}"
    )
    assert broker["innerClientAuthenticationCredentials"] == given


def test_dev_refuses_a_file_without_an_admin(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - accessKey: plainUser\n    secretKey: plainSecret\n")
    with pytest.raises(ValueError, match="no admin account"):
        _dev(tmp_path, "--acl-file", str(path))


def test_namesrv_refuses_to_start_on_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - accessKey: short\n    secretKey: secretSecret\n")
    args = build_parser().parse_args(["namesrv", "--port", "0", "--acl-file", str(path)])
    assert args.run(args) == 2
    assert "line 2: accessKey must have at least 7 characters" in capsys.readouterr().err


def test_broker_refuses_a_bad_file_and_print_config_hides_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "broker.conf"
    secret = "innerSecret-example"
    conf.write_text(
        "aclEnable=true\n"
        f'innerClientAuthenticationCredentials={{"accessKey":"innerKey","secretKey":"{secret}"}}\n'
    )
    (tmp_path / "plain_acl.yml").write_text("accounts: [\n")
    args = build_parser().parse_args(["broker", "-c", str(conf), "--print-config"])
    assert args.run(args) == 2
    assert "plain_acl.yml line" in capsys.readouterr().err
    (tmp_path / "plain_acl.yml").write_text(ACL_YAML)
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "innerClientAuthenticationCredentials=<redacted>" in out
    assert f"aclFilePath={tmp_path / 'plain_acl.yml'}" in out
    assert secret not in out


def test_the_example_file_is_valid_and_marks_its_keys_as_examples() -> None:
    table = load_acl_file(EXAMPLE)
    assert table.accounts
    assert all(key.startswith("EXAMPLE-") for key in table.accounts)
    assert any(account.admin for account in table.accounts.values())
