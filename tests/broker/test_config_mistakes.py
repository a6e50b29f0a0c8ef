"""broker.conf mistakes a newcomer makes are caught, with what to write instead (issue 16
item 2): a misspelt key, ',' between name servers, a brokerIP1 that is no address, a topic with
no queue at all."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.broker.config import ConfigError
from tidemq.broker.config_file import load_broker_config
from tidemq.cli.main import main as cli_main
from tidemq.testing import local_cluster


def _conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.conf"
    path.write_text(text)
    return path


def test_unknown_key_in_file_suggests_the_nearest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _conf(tmp_path, "brokerNmae=broker-b\nsendMessageThreadPoolNums=16\n")
    with caplog.at_level(logging.WARNING):
        load_broker_config(path, {}, {})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    suggested = (
        f"ignoring unknown broker setting brokerNmae (from {path}): did you mean brokerName?"
    )
    assert suggested in warnings
    # A RocketMQ key with no meaning here is like no known key: ignored, nothing suggested.
    assert f"ignoring unknown broker setting sendMessageThreadPoolNums (from {path})" in warnings


def test_unknown_key_given_with_set_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^unknown broker setting namesrvAddress: did you mean"):
        load_broker_config(None, {}, {"namesrvAddress": "127.0.0.1:9876"})


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "namesrvAddr",
            "a:1,b:2",
            "namesrvAddr='a:1,b:2': separate addresses with ';', not ',' (a:1;b:2)",
        ),
        (
            "brokerIP1",
            "not-an-ip",
            "brokerIP1='not-an-ip': must be an IPv4 address (clients dial it; stored messages"
            " carry it as storeHost)",
        ),
    ],
)
def test_bad_values_are_refused(tmp_path: Path, key: str, value: str, expected: str) -> None:
    path = _conf(tmp_path, f"{key}={value}\n")
    with pytest.raises(ConfigError) as caught:
        load_broker_config(path, {}, {})
    assert str(caught.value) == f"{expected} (from {path})"


def test_broker_cli_refuses_a_comma_in_one_line(tmp_path: Path) -> None:
    """The real entry point: exit status 2 and the one line, before anything starts."""
    path = _conf(tmp_path, "namesrvAddr=127.0.0.1:9876,127.0.0.1:9877\n")
    done = subprocess.run(
        [sys.executable, "-m", "tidemq.cli.main", "broker", "-c", str(path), "--print-config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == [
        "tidemq broker: namesrvAddr='127.0.0.1:9876,127.0.0.1:9877': separate addresses with"
        f" ';', not ',' (127.0.0.1:9876;127.0.0.1:9877) (from {path})"
    ]


@pytest.mark.integration
async def test_topic_with_no_queue_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with local_cluster(tmp_path) as cluster:
        argv = ["topic", "create", "-n", cluster.namesrv_addr, "-t", "NoQueues", "-q", "0"]
        assert await asyncio.to_thread(cli_main, argv) == 1
        assert cluster.brokers[0].topics.get("NoQueues") is None
    err = capsys.readouterr().err
    assert "topic NoQueues needs at least one queue" in err, err
