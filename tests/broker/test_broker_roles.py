"""Roles and ids (issue 13): brokerRole ASYNC_MASTER | SYNC_MASTER | SLAVE are accepted with the
id and secret each needs; other pairs are refused at start in one line naming the source.

    ASYNC_MASTER  brokerId 0; haSecret optional (without it: no HA listener, no slaves)
    SYNC_MASTER   brokerId 0; haSecret required (an ack must come from an authenticated slave)
    SLAVE         brokerId >= 1; haSecret required

Before issue 13 the loader refused SYNC_MASTER and SLAVE outright (issue 11, item 3).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.broker.config_keys import SECRET_REDACTED

SECRET = "a-secret-of-sixteen-or-more"
CLI_TIMEOUT_S = 30.0  # the CLI exits at once when the config is refused


@pytest.mark.parametrize("role", ["SLAVE", "slave"])
def test_a_slave_needs_an_id_above_zero(tmp_path: Path, role: str) -> None:
    overrides = {"brokerRole": role, "haSecret": SECRET, "storePathRootDir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"brokerId=0: a SLAVE needs brokerId >= 1") as caught:
        load_broker_config(None, {}, overrides)
    assert "(from defaults)" in str(caught.value)
    assert "\n" not in str(caught.value)
    config = load_broker_config(None, {}, {**overrides, "brokerId": "2"})
    assert (config.broker_role, config.broker_id) == ("SLAVE", 2)
    assert config.is_slave
    assert not config.is_master


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER", "sync_master"])
def test_a_master_needs_id_zero_naming_the_source(role: str) -> None:
    overrides = {"brokerRole": role, "haSecret": SECRET, "brokerId": "1"}
    with pytest.raises(ConfigError, match=r"^brokerId=1: .* \(from override\)$") as caught:
        load_broker_config(None, {}, overrides)
    assert f"brokerRole={role.upper()} needs brokerId=0" in str(caught.value)
    assert load_broker_config(None, {}, {**overrides, "brokerId": "0"}).is_master


@pytest.mark.parametrize(("role", "broker_id"), [("SLAVE", "1"), ("SYNC_MASTER", "0")])
def test_slave_and_sync_master_need_the_secret(tmp_path: Path, role: str, broker_id: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerRole={role}\nbrokerId={broker_id}\n")
    with pytest.raises(ConfigError, match=f"haSecret='': required for brokerRole={role}"):
        load_broker_config(conf, {})
    config = load_broker_config(conf, {"TIDEMQ_HA_SECRET": SECRET})
    assert config.ha_secret == SECRET
    assert config.is_sync_master == (role == "SYNC_MASTER")


def test_async_master_runs_without_a_secret(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerRole=async_master\n")
    assert load_broker_config(conf, {}).broker_role == "ASYNC_MASTER"
    assert load_broker_config(None, {}).broker_role == "ASYNC_MASTER"
    # A later source may set the role back: only the effective value counts.
    conf.write_text("brokerRole=SLAVE\nbrokerId=1\n")
    cfg = load_broker_config(conf, {}, {"brokerRole": "ASYNC_MASTER", "brokerId": "0"})
    assert (cfg.broker_role, cfg.ha_secret) == ("ASYNC_MASTER", "")


def test_ha_port_defaults_to_listen_port_plus_one() -> None:
    assert BrokerConfig().ha_port == 10912
    assert BrokerConfig(listen_port=20911).ha_port == 20912
    assert BrokerConfig(listen_port=0).ha_port == 0  # a free port, as the listen port
    assert BrokerConfig(ha_listen_port=30000).ha_port == 30000
    config = load_broker_config(None, {}, {"haListenPort": "30001"})
    assert config.ha_listen_port == 30001
    assert load_broker_config(None, {}, {"haListenPort": ""}).ha_listen_port is None


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"haTransferBatchSize": "10"}, "haTransferBatchSize=10:"),
        ({"haTransferBatchSize": str(64 << 20)}, "haTransferBatchSize="),
        ({"haHousekeepingInterval": "5000"}, "must exceed haSendHeartbeatInterval"),
        ({"haSendHeartbeatInterval": "0"}, "haSendHeartbeatInterval=0"),
        ({"haMaxGapNotInSync": "0"}, "haMaxGapNotInSync=0:"),
        ({"haListenPort": "10911"}, "haListenPort=10911: must differ"),
        ({"haListenPort": "70000"}, "must be a TCP port"),
        ({"slaveSyncIntervalMs": "0"}, "slaveSyncIntervalMs=0"),
        ({"listenPort": "65535"}, "leaves no room for the HA port"),
        ({"accessMessageInMemoryMaxRatio": "0"}, "accessMessageInMemoryMaxRatio=0:"),
    ],
)
def test_bad_replication_values_name_the_key(overrides: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_broker_config(None, {}, overrides)
    assert needle in str(caught.value)


def test_replication_defaults_are_rocketmq_defaults() -> None:
    config = BrokerConfig()
    assert config.ha_send_heartbeat_interval_ms == 5_000
    assert config.ha_housekeeping_interval_ms == 20_000
    assert config.ha_transfer_batch_size == 32 * 1024
    assert config.ha_max_gap_not_in_sync == 256 * 1024 * 1024
    assert not config.slave_read_enable
    assert config.access_message_in_memory_max_ratio_percent == 40
    assert config.slave_sync_interval_ms == 1_000


def test_the_secret_is_never_rendered(caplog: pytest.LogCaptureFixture) -> None:
    config = load_broker_config(None, {}, {"haSecret": "s3cr3t"})
    assert "haSecret has fewer than 16 bytes" in caplog.text
    text = render_config(config)
    assert "s3cr3t" not in text
    assert f"haSecret={SECRET_REDACTED}" in text
    assert "s3cr3t" not in repr(config)
    assert "haSecret=\n" in render_config(BrokerConfig())


@pytest.mark.parametrize("args", [["brokerRole=SLAVE"], ["brokerRole=SYNC_MASTER"]])
def test_cli_exits_non_zero_with_one_line(tmp_path: Path, args: list[str]) -> None:
    command = [sys.executable, "-m", "tidemq.cli.main", "broker"]
    for arg in [*args, f"storePathRootDir={tmp_path / 'store'}", "listenPort=0"]:
        command += ["--set", arg]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"tidemq broker with {args} did not exit: it started")
    assert process.returncode != 0
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tidemq broker: ")
    assert "brokerId=" in lines[0] or "haSecret=" in lines[0]
    assert not (tmp_path / "store").exists()
