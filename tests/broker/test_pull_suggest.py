"""suggestWhichBrokerId in pull answers (RocketMQ 4.x's rule, handlers/pull.py): a master with
slaveReadEnable steers a pull reading far behind the log's end to its slave; otherwise, and on a
slave, the answer names the master (0)."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_harness import running_broker

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers import pull
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import PullMessageResponseHeader

# With this much "physical memory" and the default 40 %, a pull is far behind past 400 bytes.
MEMORY_BYTES = 1_000
BODY = b"x" * 200  # each record is over 300 bytes


def suggested(answer_fields: dict[str, str]) -> int:
    return PullMessageResponseHeader.from_fields(answer_fields).suggest_which_broker_id


@pytest.mark.parametrize("slave_read", [True, False])
async def test_a_far_behind_pull_is_steered_to_the_slave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slave_read: bool
) -> None:
    monkeypatch.setattr(pull, "physical_memory_bytes", lambda: MEMORY_BYTES)
    settings = {"slaveReadEnable": "true" if slave_read else "false"}
    async with running_broker(tmp_path, **settings) as broker:
        for _ in range(10):
            assert (await broker.send("TopicLag", BODY)).code == ResponseCode.SUCCESS
        behind = await broker.pull("TopicLag", offset=0, max_msgs=1)
        near = await broker.pull("TopicLag", offset=9, max_msgs=1)
        empty = await broker.pull("TopicLag", offset=10, max_msgs=1)
        assert behind.code == near.code == ResponseCode.SUCCESS
        assert empty.code == ResponseCode.PULL_NOT_FOUND
        # The group's whichBrokerWhenConsumeSlowly (1) when far behind, else its brokerId (0).
        assert suggested(behind.ext_fields) == (1 if slave_read else 0)
        assert suggested(near.ext_fields) == 0
        assert suggested(empty.ext_fields) == 0


def test_the_lag_limit_follows_the_role_and_the_ratio() -> None:
    master = BrokerConfig(slave_read_enable=True)
    assert pull.slave_read_lag_bytes(master, 1_000) == 400
    ratio = BrokerConfig(slave_read_enable=True, access_message_in_memory_max_ratio_percent=10)
    assert pull.slave_read_lag_bytes(ratio, 1_000) == 100
    assert pull.slave_read_lag_bytes(BrokerConfig(), 1_000) is None
    assert pull.slave_read_lag_bytes(master, 0) is None  # memory unknown: never steer
    slave = BrokerConfig(
        broker_role="SLAVE", broker_id=1, ha_secret="s" * 16, slave_read_enable=True
    )
    assert pull.slave_read_lag_bytes(slave, 1_000) is None
    assert pull.physical_memory_bytes() > 0
