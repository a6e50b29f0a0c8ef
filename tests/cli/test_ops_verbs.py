"""Issue 17 item 5 against a real local cluster: --json on the read verbs, mqadmin's verbs
(broker status/config, topic/group delete, group list, consumer/producer connection, message
resend, reset-offset --timestamp), and progress bars on a real terminal (a pty)."""

from __future__ import annotations

import asyncio
import base64
import os
import pty
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.cli.main import main as cli_main
from tidemq.testing import LocalCluster, eventually, local_cluster

SENT = re.compile(r"msgId=(\w+) offsetMsgId=(\w+)")
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings={"autoCreateTopicEnable": "false"}) as c:
        yield c


async def cli(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tidemq ARGV -n <the cluster's name server>`."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, [*argv, "-n", cluster.namesrv_addr])
    out, err = capsys.readouterr()
    return code, out, err


async def cli_json(cluster: LocalCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """The one JSON document `tidemq ARGV --json` prints (and nothing else on stdout)."""
    code, out, err = await cli(cluster, capsys, *argv, "--json")
    assert code == 0, err
    return orjson.loads(out)


async def test_read_verbs_print_one_json_document(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Json", "-q", "2")
    _, out, _ = await cli(
        cluster, capsys, "send", "-t", "Json", "-b", "hello", "-k", "K1", "-c", "3"
    )
    msg_id = SENT.findall(out)[0][0]
    await cli(
        cluster, capsys, "consume", "-t", "Json", "-g", "CG", "-c", "1", "--wait-seconds", "5"
    )

    assert "Json" in (await cli_json(cluster, capsys, "topic", "list"))["topics"]
    route = await cli_json(cluster, capsys, "topic", "route", "-t", "Json")
    assert route["queue_datas"][0]["broker_name"] == "broker-a"
    stats = await cli_json(cluster, capsys, "topic", "stats", "-t", "Json")
    assert sum(q["max_offset"] for q in stats["queues"]) == 3
    brokers = (await cli_json(cluster, capsys, "cluster", "list"))["brokers"]
    assert [(b["broker_name"], b["reachable"]) for b in brokers] == [("broker-a", True)]
    assert brokers[0]["runtime_info"]["brokerRole"]
    progress = await cli_json(cluster, capsys, "group", "progress", "-g", "CG", "-t", "Json")
    assert progress["total_lag"] == 2
    found = await cli_json(cluster, capsys, "message", "query", "--id", msg_id, "-t", "Json")
    assert [(m["msg_id"], m["body"], m["keys"]) for m in found["messages"]] == [
        (msg_id, "hello", ["K1"])
    ]
    assert found["messages"][0]["body_encoding"] == "utf-8"
    by_key = await cli_json(cluster, capsys, "message", "query", "-k", "K1", "-t", "Json")
    assert len(by_key["messages"]) == 3
    assert (await cli_json(cluster, capsys, "dlq", "list", "-g", "CG")) == {
        "group": "CG",
        "dead_letters": [],
    }
    tx = await cli_json(cluster, capsys, "tx", "stats")
    assert [b["addr"] for b in tx["brokers"]] == [cluster.broker_addr]
    assert (await cli_json(cluster, capsys, "tx", "list"))["brokers"][0]["transactions"] == []
    status = await cli_json(cluster, capsys, "broker", "status", "-b", cluster.broker_addr)
    assert status["broker"] == cluster.broker_addr
    assert status["values"]["brokerRole"] == "ASYNC_MASTER"


async def test_broker_status_prints_a_key_value_table(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await cli(cluster, capsys, "broker", "status", "--broker", cluster.broker_addr)
    assert code == 0
    assert out.splitlines()[0].split() == ["KEY", "VALUE"]
    assert re.search(r"^brokerRole +ASYNC_MASTER$", out, re.MULTILINE)
    code, _, err = await cli(cluster, capsys, "broker", "status", "-b", "127.0.0.1:1")
    assert code == 1
    assert err.startswith("tidemq: ")


async def test_topic_delete_removes_the_topic(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Doomed")
    assert "Doomed" in (await cli_json(cluster, capsys, "topic", "list"))["topics"]
    code, out, err = await cli(cluster, capsys, "topic", "delete", "-t", "Doomed")
    assert (code, out) == (1, "")  # no terminal to confirm on
    assert err == "tidemq: not deleting topic Doomed: no terminal to confirm on; pass --yes\n"
    assert "Doomed" in (await cli_json(cluster, capsys, "topic", "list"))["topics"]
    code, out, _ = await cli(cluster, capsys, "topic", "delete", "-t", "Doomed", "--yes")
    assert (code, out) == (0, "topic Doomed deleted\n")
    assert "Doomed" not in (await cli_json(cluster, capsys, "topic", "list"))["topics"]
    code, _, err = await cli(cluster, capsys, "topic", "route", "-t", "Doomed")
    assert code == 1
    assert "topic Doomed does not exist" in err


async def test_reset_offset_to_earliest_reports_json(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Again", "-q", "1")
    await cli(cluster, capsys, "send", "-t", "Again", "-b", "x", "-c", "4")
    await cli(
        cluster, capsys, "consume", "-t", "Again", "-g", "RG", "-c", "4", "--wait-seconds", "5"
    )
    moved = await cli_json(
        cluster, capsys, "group", "reset-offset", "-g", "RG", "-t", "Again", "--to-earliest"
    )
    assert [(q["old"], q["offset"]) for q in moved["queues"]] == [(4, 0)]


# -- progress on a terminal -------------------------------------------------------------------


async def _run_with_tty_stderr(cluster: LocalCluster, *argv: str) -> tuple[int, str, str]:
    """Run `tidemq ARGV` in a child whose stderr is a pty (stdout a pipe): (status, stdout,
    what the terminal received)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "TIDEMQ_NAMESRV_ADDR": ""}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidemq.cli.main",
        *argv,
        "-n",
        cluster.namesrv_addr,
        stdout=asyncio.subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    terminal = asyncio.create_task(asyncio.to_thread(_read_until_closed, master))
    out, _ = await child.communicate()
    return child.returncode or 0, out.decode(), await terminal


def _read_until_closed(fd: int) -> str:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the child closed its end
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


async def test_send_and_consume_draw_a_progress_bar_on_a_terminal_only(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Bars", "-q", "2")
    code, out, terminal = await _run_with_tty_stderr(
        cluster, "send", "-t", "Bars", "-b", "x", "-c", "60"
    )
    assert code == 0
    assert out.count("SEND_OK") == 60  # stdout keeps one line per message
    assert "sending" in terminal
    assert "60/60" in terminal
    assert re.search(r"\d/s", terminal)
    code, out, terminal = await _run_with_tty_stderr(
        cluster, "consume", "-t", "Bars", "-g", "BarG", "-c", "60", "--wait-seconds", "5"
    )
    assert code == 0, terminal
    assert out.count("msgId=") == 60
    assert "consuming" in terminal
    assert "60/60" in terminal
    # Not a terminal (the tests' captured stderr): no bar, just the summary line as before.
    code, _, err = await cli(cluster, capsys, "send", "-t", "Bars", "-b", "x", "-c", "3")
    assert (code, err) == (0, "")


async def test_message_lines_and_the_bar_do_not_garble_each_other_on_one_terminal(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "OneTty", "-q", "1")
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200", "TIDEMQ_NAMESRV_ADDR": ""}
    argv = ["send", "-t", "OneTty", "-b", "x", "-c", "40", "-n", cluster.namesrv_addr]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidemq.cli.main", *argv, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    terminal = await asyncio.to_thread(_read_until_closed, master)
    assert await child.wait() == 0
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    lines = [part.strip() for part in re.split(r"[\r\n]+", plain)]
    whole = r"SEND_OK msgId=[0-9A-F]+ offsetMsgId=[0-9A-F]+ queue=broker-a:0 offset=\d+"
    assert sum(1 for line in lines if re.fullmatch(whole, line)) == 40, terminal
    assert "40/40" in plain


# -- verbs over client/admin.py's mqadmin methods --------------------------------------------


async def test_broker_config_get_and_set(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    addr = cluster.broker_addr
    got = await cli_json(cluster, capsys, "broker", "config", "get", "-b", addr)
    assert got["values"]["brokerName"] == "broker-a"
    # No key is changeable at run time yet: the broker refuses, and says so, rather than
    # accepting a value it would ignore; the CLI passes its words on and exits 1.
    code, out, err = await cli(
        cluster, capsys, "broker", "config", "set", "-b", addr, "maxMessageSize=65536"
    )
    assert (code, out) == (1, "")
    assert "not changeable at run time: maxMessageSize" in err
    code, out, _ = await cli(
        cluster, capsys, "broker", "config", "get", "-b", addr, "-k", "maxMessageSize"
    )
    assert code == 0
    assert out.splitlines()[1].split() == ["maxMessageSize", got["values"]["maxMessageSize"]]
    code, _, err = await cli(cluster, capsys, "broker", "config", "get", "-b", addr, "-k", "nope")
    assert code == 1
    assert "has no setting nope" in err


async def test_group_list_connections_delete_and_resend(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Live", "-q", "1")
    received: list[MessageExt] = []

    async def listener(messages: list[MessageExt]) -> None:
        received.extend(messages)

    consumer = PushConsumer("LiveG", cluster.namesrv_addr, consume_from_where=FIRST)
    consumer.subscribe("Live", "*")
    consumer.register_listener(listener)
    async with consumer, Producer("LivePG", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("Live", b"once"))
        await eventually(lambda: len(received) == 1)
        assert "LiveG" in (await cli_json(cluster, capsys, "group", "list"))["groups"]
        connection = await cli_json(cluster, capsys, "consumer", "connection", "-g", "LiveG")
        assert orjson.dumps(connection).count(b"Live") >= 2  # the group and its subscription
        code, out, _ = await cli(cluster, capsys, "consumer", "connection", "-g", "LiveG")
        assert code == 0
        assert "connection set:" in out
        assert "subscription table:" in out
        producers = await cli_json(
            cluster, capsys, "producer", "connection", "-g", "LivePG", "-t", "Live"
        )
        assert producers["group"] == "LivePG"
        assert len(producers["connection_set"]) == 1
        code, out, err = await cli(
            cluster, capsys, "message", "resend", "--id", sent.msg_id, "-t", "Live", "-g", "LiveG"
        )
        assert code == 0, err
        await eventually(lambda: len(received) == 2)
        assert received[1].body == b"once"
        code, out, err = await cli(
            cluster, capsys, "message", "resend", "--id", sent.offset_msg_id, "-g", "LiveG"
        )
        assert code == 0, err
        assert out.startswith(f"message {sent.msg_id} of Live resent to group LiveG")
        await eventually(lambda: len(received) == 3)
    code, out, err = await cli(cluster, capsys, "consumer", "connection", "-g", "NoOne")
    assert (code, out) == (1, "")
    assert err.startswith("tidemq: no consumer of group NoOne is online")
    offsets = cluster.brokers[0].offsets
    queue_id = sent.message_queue.queue_id
    assert offsets.query("LiveG", "Live", queue_id) == 1
    code, out, _ = await cli(cluster, capsys, "group", "delete", "-g", "LiveG")
    assert code == 1  # no --yes
    code, out, _ = await cli(cluster, capsys, "group", "delete", "-g", "LiveG", "-y")
    assert (code, out) == (0, "group LiveG deleted\n")
    assert offsets.query("LiveG", "Live", queue_id) == 1  # kept, as upstream by default
    code, out, _ = await cli(
        cluster, capsys, "group", "delete", "-g", "LiveG", "--clean-offset", "--yes"
    )
    assert (code, out) == (0, "group LiveG deleted with its offsets\n")
    assert offsets.query("LiveG", "Live", queue_id) is None


async def test_reset_offset_by_timestamp_with_no_consumer_online(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli(cluster, capsys, "topic", "create", "-t", "Rewind", "-q", "1")
    await cli(cluster, capsys, "send", "-t", "Rewind", "-b", "x", "-c", "3")
    await cli(
        cluster, capsys, "consume", "-t", "Rewind", "-g", "WG", "-c", "3", "--wait-seconds", "5"
    )
    long_ago = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() - 3600))
    moved = await cli_json(
        cluster,
        capsys,
        "group",
        "reset-offset",
        "-g",
        "WG",
        "-t",
        "Rewind",
        "--timestamp",
        long_ago,
    )
    assert [q["offset"] for q in moved["queues"]] == [0]
    progress = await cli_json(cluster, capsys, "group", "progress", "-g", "WG", "-t", "Rewind")
    assert progress["total_lag"] == 3
    in_an_hour = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() + 3600))
    forward = ["group", "reset-offset", "-g", "WG", "-t", "Rewind", "--timestamp", in_an_hour]
    await cli_json(cluster, capsys, *forward)  # isForce false: never moved forward
    progress = await cli_json(cluster, capsys, "group", "progress", "-g", "WG", "-t", "Rewind")
    assert progress["total_lag"] == 3
    await cli_json(cluster, capsys, *forward, "--force")
    progress = await cli_json(cluster, capsys, "group", "progress", "-g", "WG", "-t", "Rewind")
    assert progress["total_lag"] <= 1  # moved forward (to the message stored nearest the time)


async def test_json_shows_a_binary_body_as_base64(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = bytes([0xFF, 0x00, 0xC3, 0x28, 0x80])
    await cli(cluster, capsys, "topic", "create", "-t", "Binary", "-q", "1")
    async with Producer("BinPG", cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("Binary", raw, keys="bin-1"))
    found = await cli_json(cluster, capsys, "message", "query", "-k", "bin-1", "-t", "Binary")
    (message,) = found["messages"]
    assert message["msg_id"] == sent.msg_id
    assert message["body_encoding"] == "base64"
    assert base64.b64decode(message["body"]) == raw
