"""`tidemq dev [--slave]`: the broker settings it builds (the processes themselves run in
tests/integration/test_replication_processes.py)."""

from __future__ import annotations

from pathlib import Path

from tidemq.cli.main import build_parser
from tidemq.cli.servers import HA_SECRET_ENV, dev_overrides


def _overrides(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None
) -> list[dict[str, str]]:
    args = build_parser().parse_args(["dev", "--data-dir", str(tmp_path), *argv])
    return dev_overrides(args, env or {})


def test_dev_without_slave_is_one_broker_as_before(tmp_path: Path) -> None:
    [broker] = _overrides(tmp_path, "--set", "flushDiskType=SYNC_FLUSH")
    assert broker["storePathRootDir"] == str(tmp_path / "broker")
    assert broker["listenPort"] == "10911"
    assert broker["flushDiskType"] == "SYNC_FLUSH"
    assert "haSecret" not in broker
    assert "brokerRole" not in broker


def test_dev_slave_is_a_slave_of_the_same_group(tmp_path: Path) -> None:
    master, slave = _overrides(
        tmp_path, "--slave", "--slave-port", "20921", "--set", "brokerRole=SYNC_MASTER"
    )
    assert master["brokerRole"] == "SYNC_MASTER"
    assert (slave["brokerRole"], slave["brokerId"]) == ("SLAVE", "1")
    assert master.get("brokerId", "0") == "0"
    assert master["storePathRootDir"] == str(tmp_path / "master")
    assert slave["storePathRootDir"] == str(tmp_path / "slave")
    assert (master["listenPort"], slave["listenPort"]) == ("10911", "20921")
    assert master["namesrvAddr"] == slave["namesrvAddr"] == "127.0.0.1:9876"
    assert len(master["haSecret"]) == 32
    assert slave["haSecret"] == master["haSecret"]


def test_dev_slave_secret_is_random_per_start_unless_given(tmp_path: Path) -> None:
    first, second = _overrides(tmp_path, "--slave"), _overrides(tmp_path, "--slave")
    assert first[0]["haSecret"] != second[0]["haSecret"]
    given = _overrides(tmp_path, "--slave", "--set", "haSecret=0123456789abcdef-given")
    assert {o["haSecret"] for o in given} == {"0123456789abcdef-given"}
    from_env = _overrides(tmp_path, "--slave", env={HA_SECRET_ENV: "0123456789abcdef-env"})
    # The loader reads the environment itself; dev adds no secret that would override it.
    assert all("haSecret" not in o for o in from_env)
