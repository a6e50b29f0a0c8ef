"""The broker.conf loader: RocketMQ keys, layering, errors naming the key, render round trip."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.config_file import example_config, load_broker_config, render_config
from tidemq.broker.properties import parse_properties

ROCKETMQ_CONF = """\
# A broker.conf as RocketMQ ships it
brokerClusterName = DefaultCluster
brokerName=broker-b
brokerId=0
deleteWhen=04
fileReservedTime=48
brokerRole=ASYNC_MASTER
flushDiskType=SYNC_FLUSH
namesrvAddr=10.0.0.1:9876;10.0.0.2:9876
listenPort : 20911
mapedFileSizeCommitLog=1048576
mapedFileSizeConsumeQueue=6000
storePathRootDir=/data/rmq
storePathCommitLog=/data/rmq/commitlog
transactionTimeOut=3000
transactionCheckMax=5
transactionCheckInterval=30000
brokerIP1=10.0.0.9
sendMessageThreadPoolNums=16
! another comment style
"""


def test_rocketmq_broker_conf(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(ROCKETMQ_CONF)
    with caplog.at_level(logging.WARNING):
        cfg = load_broker_config(path, {}, {})
    assert cfg.broker_name == "broker-b"
    assert cfg.namesrv_addrs == ("10.0.0.1:9876", "10.0.0.2:9876")
    assert cfg.listen_port == 20911
    assert cfg.vip_port == 20909
    assert cfg.flush_disk_type == "SYNC_FLUSH"
    assert cfg.commit_log_file_size == 1 << 20
    assert cfg.consume_queue_file_entries == 300
    assert cfg.file_reserved_time_hours == 48
    assert cfg.store_path_root_dir == Path("/data/rmq")
    assert (cfg.transaction_timeout_ms, cfg.transaction_check_max) == (3000, 5)
    assert cfg.transaction_check_interval_ms == 30_000
    assert cfg.broker_ip == "10.0.0.9"
    assert "sendMessageThreadPoolNums" in caplog.text


def test_defaults_are_rocketmq_defaults() -> None:
    cfg = BrokerConfig()
    assert (cfg.broker_cluster_name, cfg.broker_name, cfg.listen_port) == (
        "DefaultCluster",
        "broker-a",
        10911,
    )
    assert cfg.auto_create_topic_enable
    assert cfg.default_topic_queue_nums == 8
    assert cfg.max_message_size == 4 * 1024 * 1024
    assert cfg.transaction_check_interval_ms == 60_000


def test_layering_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("brokerName=from-file\nlistenPort=1111\nbrokerId=3\n")
    env = {
        "TIDEMQ_LISTEN_PORT": "2222",
        "TIDEMQ_BROKER_ID": "1",
        "NAMESRV_ADDR": "1.1.1.1:9876",
        "PATH": "/bin",
    }
    # brokerId: 3 in the file, 1 in the environment, 0 (the only id allowed) from the flags.
    cfg = load_broker_config(path, env, {"brokerId": "0", "broker_ip": "10.1.1.1"})
    assert cfg.broker_name == "from-file"
    assert cfg.listen_port == 2222
    assert cfg.broker_id == 0
    assert cfg.broker_ip == "10.1.1.1"
    assert cfg.namesrv_addrs == ("1.1.1.1:9876",)
    env["TIDEMQ_NAMESRV_ADDR"] = "2.2.2.2:9876"
    env["TIDEMQ_BROKER_ID"] = "0"
    assert load_broker_config(None, env, {}).namesrv_addrs == ("2.2.2.2:9876",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("listenPort=abc", "listenPort='abc'"),
        ("autoCreateTopicEnable=maybe", "autoCreateTopicEnable='maybe'"),
        ("flushDiskType=SOMETIMES", "flushDiskType='SOMETIMES'"),
        ("deleteWhen=25", "deleteWhen='25'"),
        ("namesrvAddr=nohostport", "namesrvAddr='nohostport'"),
        ("mappedFileSizeConsumeQueue=33", "mappedFileSizeConsumeQueue='33'"),
        ("storePathRootDir=/a\nstorePathCommitLog=/b", "storePathCommitLog='/b'"),
    ],
)
def test_bad_values_name_key_and_value(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_broker_config(path, {}, {})
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)  # the CLI reports ValueErrors


def test_render_round_trip(tmp_path: Path) -> None:
    cfg = load_broker_config(
        None,
        {},
        {
            "brokerName": "b",
            "namesrvAddr": "1.2.3.4:9876;5.6.7.8:9876",
            "fileReservedTime": "1.5",
            "storePathRootDir": str(tmp_path),
            "mappedFileSizeConsumeQueue": "200",
        },
    )
    path = tmp_path / "rendered.conf"
    text = render_config(cfg)
    path.write_text(text)
    assert load_broker_config(path, {}, {}) == cfg
    assert "# Cluster this broker belongs to." in text


def test_properties_syntax() -> None:
    text = "a=1\n  b : two words \nc three\nd=line\\\n   continued\n# x=y\ne=\\u0041\\tB\n"
    assert parse_properties(text) == [
        ("a", "1"),
        ("b", "two words"),
        ("c", "three"),
        ("d", "linecontinued"),
        ("e", "A\tB"),
    ]


def test_example_conf_is_current() -> None:
    example = Path(__file__).parents[2] / "conf" / "broker.example.conf"
    assert example.read_text() == example_config(), "regenerate with example_config()"


def test_corrupt_policy_maps_to_the_store(tmp_path: Path) -> None:
    from tidemq.broker.app import BrokerApp
    from tidemq.clock import FakeClock
    from tidemq.store import CorruptPolicy

    with pytest.raises(ConfigError, match="corruptPolicy"):
        load_broker_config(None, {}, {"corruptPolicy": "truncate"})
    config = load_broker_config(
        None, {}, {"corruptPolicy": "quarantine", "storePathRootDir": str(tmp_path)}
    )
    app = BrokerApp(config, FakeClock())
    assert app.store.config.corrupt_policy is CorruptPolicy.QUARANTINE


def test_commit_log_resident_bytes_maps_to_the_store(tmp_path: Path) -> None:
    from tidemq.broker.app import BrokerApp
    from tidemq.clock import FakeClock

    assert BrokerConfig().commit_log_resident_bytes == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match="commitLogResidentBytes"):
        load_broker_config(None, {}, {"commitLogResidentBytes": "-1"})
    config = load_broker_config(
        None, {}, {"commitLogResidentBytes": "0", "storePathRootDir": str(tmp_path)}
    )
    assert BrokerApp(config, FakeClock()).store.config.commit_log_resident_bytes == 0
