"""Controller mode's broker.conf keys: what it needs, and the settings it refuses at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.config_file import load_broker_config

CONTROLLED = """\
brokerClusterName=c1
brokerName=broker-a
brokerId=2
enableControllerMode=true
controllerEtcdEndpoints=10.0.0.1:2379;10.0.0.2:2379
controllerLeaseTtlSeconds=3
haMaxTimeSlaveNotCatchup=2500
haSecret=0123456789abcdef0123
"""


def test_a_controlled_broker_conf_loads(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(CONTROLLED)
    config = load_broker_config(path, env={})
    assert config.enable_controller_mode
    assert config.controller_etcd_endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")
    assert config.controller_lease_ttl_seconds == 3
    assert config.ha_max_time_slave_not_catchup_ms == 2500
    assert config.broker_id == 2
    assert config.controller_etcd_prefix == "/tidemq"


def _controlled(**changes: object) -> BrokerConfig:
    settings: dict[str, object] = {
        "enable_controller_mode": True,
        "broker_id": 1,
        "ha_secret": "0123456789abcdef",
        "controller_etcd_endpoints": ("127.0.0.1:2379",),
    }
    settings.update(changes)
    return BrokerConfig(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"broker_id": 0}, "brokerId"),
        ({"broker_role": "SLAVE"}, "brokerRole"),
        ({"broker_role": "SYNC_MASTER"}, "brokerRole"),
        ({"controller_etcd_endpoints": ()}, "controllerEtcdEndpoints"),
        ({"controller_etcd_endpoints": ("nohost",)}, "controllerEtcdEndpoints"),
        ({"controller_etcd_prefix": "tidemq"}, "controllerEtcdPrefix"),
        ({"controller_lease_ttl_seconds": 0}, "controllerLeaseTtlSeconds"),
        ({"controller_lease_ttl_seconds": 61}, "controllerLeaseTtlSeconds"),
        ({"ha_max_time_slave_not_catchup_ms": 5_000}, "haMaxTimeSlaveNotCatchup"),
        ({"ha_max_time_slave_not_catchup_ms": 0}, "haMaxTimeSlaveNotCatchup"),
        ({"all_ack_in_sync_state_set": False}, "allAckInSyncStateSet"),
        ({"slave_read_enable": True}, "slaveReadEnable"),
        ({"ha_secret": ""}, "haSecret"),
    ],
)
def test_refused_at_start(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}="):
        _controlled(**changes)


def test_off_by_default_and_4x_rules_unchanged() -> None:
    assert not BrokerConfig().enable_controller_mode
    with pytest.raises(ConfigError, match=r"^brokerId="):
        BrokerConfig(broker_id=1)  # an ASYNC_MASTER outside controller mode is brokerId 0
