"""Roles that need replication are refused at start (issue 11, item 3).

TideMQ has no replication yet: a SYNC_MASTER would answer SEND_OK where RocketMQ answers
SLAVE_NOT_AVAILABLE, and a SLAVE would never receive data. Before the fix both were accepted and
ignored; now the loader refuses them in one line naming where the value came from, and
`tidemq broker` exits non-zero with that line. ASYNC_MASTER stays accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.broker.config import ConfigError
from tidemq.broker.config_file import load_broker_config

REFUSED = "refused until TideMQ has replication"
CLI_TIMEOUT_S = 30.0  # the CLI exits at once; before the fix it started a broker and stayed up


@pytest.mark.parametrize("role", ["SLAVE", "SYNC_MASTER", "slave", "sync_master"])
def test_override_refused(tmp_path: Path, role: str) -> None:
    overrides = {"brokerRole": role, "storePathRootDir": str(tmp_path)}
    with pytest.raises(ConfigError, match=REFUSED) as caught:
        load_broker_config(None, {}, overrides)
    message = str(caught.value)
    assert f"brokerRole={role.upper()}" in message
    assert "(from override)" in message
    assert "\n" not in message


def test_conf_file_and_environment_are_named(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\nbrokerRole=SYNC_MASTER\n")
    with pytest.raises(ConfigError, match=REFUSED) as from_file:
        load_broker_config(conf, {})
    assert str(conf) in str(from_file.value)
    env = {"TIDEMQ_BROKER_ROLE": "SLAVE"}
    with pytest.raises(ConfigError, match=REFUSED) as from_env:
        load_broker_config(None, env)
    assert "env TIDEMQ_BROKER_ROLE" in str(from_env.value)


def test_async_master_is_accepted(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerRole=async_master\n")
    assert load_broker_config(conf, {}).broker_role == "ASYNC_MASTER"
    assert load_broker_config(None, {}).broker_role == "ASYNC_MASTER"
    # A later source may set the role back to ASYNC_MASTER: only the effective value counts.
    conf.write_text("brokerRole=SLAVE\n")
    cfg = load_broker_config(conf, {}, {"brokerRole": "ASYNC_MASTER"})
    assert cfg.broker_role == "ASYNC_MASTER"


@pytest.mark.parametrize("role", ["SLAVE", "SYNC_MASTER"])
def test_cli_exits_non_zero_with_one_line(tmp_path: Path, role: str) -> None:
    command = [
        sys.executable,
        "-m",
        "tidemq.cli.main",
        "broker",
        "--set",
        f"brokerRole={role}",
        "--set",
        f"storePathRootDir={tmp_path / 'store'}",
        "--set",
        "listenPort=0",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"tidemq broker with brokerRole={role} did not exit: it started")
    assert process.returncode != 0
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"tidemq broker: brokerRole={role}")
    assert REFUSED in lines[0]
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(("value", "where"), [("1", "override"), ("2", "override")])
def test_a_slave_broker_id_is_refused_naming_its_source(value: str, where: str) -> None:
    """brokerId > 0 makes clients and name servers treat the broker as a slave (no writes, no
    END_TRANSACTION), which an unreplicated broker cannot be."""
    with pytest.raises(ConfigError, match=rf"brokerId={value} \(from {where}\)"):
        load_broker_config(None, {}, {"brokerId": value})
    assert load_broker_config(None, {}, {"brokerId": "0"}).broker_id == 0
