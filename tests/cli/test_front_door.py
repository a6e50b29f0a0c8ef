"""Issue 16, items 3-6 (CLI): errors that say what to do, message ids as printed, SQL92 and
delivery options on the command line, NAMESRV_ADDR, date-times for reset-offset.

The verbs run through the real `tidemq` entry point (cli.main) against a local cluster.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import struct
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tidemq.cli.hints import time_ms
from tidemq.cli.main import main as cli_main
from tidemq.cli.main import namesrv_default
from tidemq.protocol import message as pm
from tidemq.remoting.address import parse_address
from tidemq.testing import LocalCluster, local_cluster

SETTINGS = {"autoCreateTopicEnable": "false", "enablePropertyFilter": "true"}
SENT = re.compile(r"msgId=(\w+) offsetMsgId=(\w+)")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings=SETTINGS) as c:
        yield c


async def cli(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], *argv: str, namesrv: str = ""
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tidemq ARGV -n <namesrv or the cluster's>`."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, [*argv, "-n", namesrv or cluster.namesrv_addr])
    out, err = capsys.readouterr()
    return code, out, err


async def test_send_to_a_missing_topic_names_it_and_says_how_to_create_it(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await cli(cluster, capsys, "send", "-t", "NoSuchTopic", "-b", "x")
    assert code == 1
    assert "topic NoSuchTopic does not exist" in err
    assert "autoCreateTopicEnable=false" in err
    assert f"tidemq topic create -t NoSuchTopic -n {cluster.namesrv_addr}" in err
    assert "TBW102" not in err
    code, _, err = await cli(cluster, capsys, "consume", "-t", "NoSuchTopic")
    assert code == 1
    assert "topic NoSuchTopic does not exist; create it with" in err


async def test_group_progress_of_an_unknown_group_says_so(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ([], ["-t", "TBW102"]):
        code, out, err = await cli(
            cluster, capsys, "group", "progress", "-g", "NoSuchGroup", *extra
        )
        assert code == 1
        assert "group NoSuchGroup is unknown" in err
        assert "total lag" not in out
    # A group that only ever pulled (no retry topic) is known, and its lag shows.
    await cli(cluster, capsys, "topic", "create", "-t", "Known", "-q", "1")
    await cli(cluster, capsys, "send", "-t", "Known", "-b", "a", "-c", "2")
    await cli(
        cluster, capsys, "consume", "-t", "Known", "-g", "CG", "-c", "1", "--wait-seconds", "5"
    )
    code, out, _ = await cli(cluster, capsys, "group", "progress", "-g", "CG")
    assert code == 0
    assert "total lag: 1" in out


async def test_namesrv_flag_pointed_at_a_broker_says_it_is_not_a_name_server(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = cluster.brokers[0].address
    for argv in (["topic", "list"], ["send", "-t", "T", "-b", "x"], ["cluster", "list"]):
        code, _, err = await cli(cluster, capsys, *argv, namesrv=broker)
        assert code == 1, argv
        assert f"{broker} is not a name server" in err, argv
        assert "9876" in err


async def test_message_query_accepts_both_ids_that_send_prints(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Ids")
    _, out, _ = await cli(cluster, capsys, "send", "-t", "Ids", "-b", "find-me")
    found = SENT.search(out)
    assert found is not None
    msg_id, offset_msg_id = found.groups()
    for argv in (["-i", msg_id], ["-i", msg_id.lower(), "-t", "Ids"], ["-i", offset_msg_id]):
        code, out, err = await cli(cluster, capsys, "message", "query", *argv)
        assert code == 0, (argv, err)
        assert f"msgId={msg_id}" in out, argv
        assert out.rstrip().endswith("find-me"), argv
    code, _, err = await cli(cluster, capsys, "message", "query", "-i", "C0" * 16)
    assert (code, err.strip()) == (1, "no message found on any topic")
    code, _, err = await cli(cluster, capsys, "message", "query", "-i", "xyz")
    assert code == 2
    assert "is not a message id" in err


async def test_message_query_does_not_take_a_unique_key_for_an_offset_id(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A UNIQ_KEY's pid and instance fields read as an offsetMsgId's port whenever the pid is a
    multiple of 65536; Java's UNIQ_KEY from an IPv6 producer is 56 characters, as long as an
    IPv6 offsetMsgId. Both are found through the index. (-p UNIQ_KEY=... stands in for such
    producers: a producer keeps the UNIQ_KEY a message already has, as Java's does.)"""
    await cli(cluster, capsys, "topic", "create", "-t", "Odd")
    now_ms = int(time.time() * 1000)
    pid_65536 = pm.UniqueKeyGenerator("127.0.0.1", 3 * 65_536, 0x2A2A_0001).next(now_ms)
    assert pm.decode_offset_msg_id(pid_65536)[:2] == ("127.0.0.1", 0x2A2A)  # a port, not a broker
    java_v6 = ipaddress.ip_address("2001:db8::5").packed + struct.pack(">HIIH", 7, 9, 1234, 1)
    for key in (pid_65536, java_v6.hex().upper()):
        code, out, err = await cli(
            cluster, capsys, "send", "-t", "Odd", "-b", key[-8:], "-p", f"UNIQ_KEY={key}"
        )
        assert code == 0, err
        assert f"msgId={key} " in out
        for argv in (["-i", key], ["-i", key.lower(), "-t", "Odd"]):
            code, out, err = await cli(cluster, capsys, "message", "query", *argv)
            assert code == 0, (argv, err)
            assert out.rstrip().endswith(f"msgId={key} tags= keys= {key[-8:]}"), argv
    # An id that names a broker but no message there: looked up as a UNIQ_KEY, then not found.
    host, port = parse_address(cluster.brokers[0].address)
    nowhere = pm.offset_msg_id(host, port, 1 << 40)
    code, _, err = await cli(cluster, capsys, "message", "query", "-i", nowhere)
    assert (code, err.strip()) == (1, "no message found on any topic")


async def test_send_properties_and_consume_with_sql(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Props")
    for body, a in (("big", "7"), ("small", "1")):
        code, _, err = await cli(
            cluster, capsys, "send", "-t", "Props", "-b", body, "-p", f"a={a}", "-p", "r=eu"
        )
        assert code == 0, err
    argv = ["consume", "-t", "Props", "-g", "SQL", "-c", "2", "--wait-seconds", "1"]
    code, out, _ = await cli(cluster, capsys, *argv, "--sql", "a > 5 AND r = 'eu'")
    assert code == 0
    assert [line.split()[-1] for line in out.splitlines()] == ["big"]
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses it before any connection
        cli_main(["send", "-t", "Props", "-b", "x", "-p", "novalue"])
    assert exit_info.value.code == 2
    assert "a property is written key=value, not 'novalue'" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--delay-level", "--deliver-at"])
async def test_send_delays_delivery(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Later", "-q", "1")
    sent_ms = int(time.time() * 1000)
    due_ms = sent_ms + 1_000
    when = datetime.fromtimestamp(due_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    value = "1" if option == "--delay-level" else when.replace("+00:00", "Z")  # level 1: 1 s
    code, _, err = await cli(cluster, capsys, "send", "-t", "Later", "-b", "late", option, value)
    assert code == 0, err
    argv = ["consume", "-t", "Later", "-g", "L", "-c", "1", "--wait-seconds", "10"]
    code, out, _ = await cli(cluster, capsys, *argv)
    arrived_ms = int(time.time() * 1000)
    assert code == 0
    assert out.rstrip().endswith("late")
    assert arrived_ms >= due_ms - 100  # not before it was due (timers tick at 100 ms at most)


async def test_reset_offset_takes_a_date_time(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Rewind", "-q", "1")
    await cli(cluster, capsys, "send", "-t", "Rewind", "-b", "m", "-c", "3")
    await cli(
        cluster, capsys, "consume", "-t", "Rewind", "-g", "R", "-c", "3", "--wait-seconds", "5"
    )
    argv = ["group", "reset-offset", "-g", "R", "-t", "Rewind", "--to-time", "2020-01-01 00:00"]
    code, out, err = await cli(cluster, capsys, *argv)
    assert code == 0, err
    assert out.splitlines()[1].split()[-2:] == ["3", "0"]  # OLD 3, NEW 0


def test_time_arguments() -> None:
    assert time_ms("1764064800000") == 1_764_064_800_000
    assert time_ms("2025-11-25T10:00:00Z") == 1_764_064_800_000
    assert time_ms("2025-11-25T11:00+01:00") == 1_764_064_800_000
    naive = datetime(2025, 11, 25, 10, 0)  # local time, as the tables print it
    assert time_ms("2025-11-25 10:00") == int(naive.timestamp() * 1000)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["group", "reset-offset", "-g", "G", "-t", "T", "--to-time", "yesterday"])
    assert exit_info.value.code == 2


def test_namesrv_addr_comes_from_tidemq_then_rocketmq_variables() -> None:
    assert namesrv_default({}) == "127.0.0.1:9876"
    assert namesrv_default({"NAMESRV_ADDR": "h:1;h:2"}) == "h:1;h:2"
    both = {"NAMESRV_ADDR": "h:1", "TIDEMQ_NAMESRV_ADDR": "t:1"}
    assert namesrv_default(both) == "t:1"
    assert namesrv_default({"TIDEMQ_NAMESRV_ADDR": " ", "NAMESRV_ADDR": "h:1"}) == "h:1"


async def test_cli_reads_rocketmq_namesrv_addr(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDEMQ_NAMESRV_ADDR", raising=False)
    monkeypatch.setenv("NAMESRV_ADDR", cluster.namesrv_addr)
    await cli(cluster, capsys, "topic", "create", "-t", "FromEnv")
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["topic", "list"]) == 0
    assert "FromEnv" in capsys.readouterr().out.split()
