"""The console's pages over HTTP, against a real local cluster (no TestClient: uvicorn on a
loopback port, the app's own Admin talking to the real name server and broker)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

from console_harness import Answer, Served, _fetch, committed, consume_all, serve_console
from starlette.requests import Request
from starlette.responses import Response

from tidemq import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    TransactionProducer,
)
from tidemq.client import api
from tidemq.console.actions import PLAN_QUEUES_MAX
from tidemq.console.app import create_app
from tidemq.console.guard import allowed_hosts, exposure_warning
from tidemq.console.reads import CALL_TIMEOUT_S, ROWS_PER_PAGE, Body, paginate
from tidemq.protocol import frame
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.bodies_client import ConsumerData, HeartbeatData, SubscriptionData
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.message_id import offset_msg_id
from tidemq.testing import eventually_async, local_cluster
from tidemq.testing.processes import free_port


async def test_cluster_topics_and_404s(served: Served) -> None:
    async with Producer("PG-console", served.cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("Orders", "héllo".encode(), keys="order-1"))
    page = await served.get("/")
    assert page.status == 200
    assert served.cluster.broker_addr in page.text
    assert "TideMQ" in page.text
    assert "MASTER" in page.text
    broker = await served.get(f"/broker/{served.cluster.broker_addr}")
    assert broker.status == 200
    assert "commitLogMaxOffset" in broker.text
    topics = await served.get("/topics")
    assert "/topics/Orders" in topics.text
    topic = await served.get("/topics/Orders")
    assert topic.status == 200
    assert "1 messages stored" in topic.text

    for path, what in (
        ("/topics/Nope", "No topic named &#39;Nope&#39;"),
        ("/broker/10.9.9.9:1", "No broker named &#39;10.9.9.9:1&#39;"),
        ("/groups/NoSuchGroup", "No group named &#39;NoSuchGroup&#39;"),
        ("/dlq/NoSuchGroup", "No topic named &#39;%DLQ%NoSuchGroup&#39;"),
        ("/no/page", "No page at /no/page"),
    ):
        answer = await served.get(path)
        assert (answer.status, what in answer.text) == (404, True), (path, answer.text[-400:])

    by_key = await served.get("/messages", by="key", topic="Orders", key="order-1")
    assert "1 message(s)" in by_key.text
    assert sent.msg_id in by_key.text
    by_time = await served.get("/messages", by="time", topic="Orders")
    assert "1 message(s)" in by_time.text
    by_id = await served.get("/messages", by="id", id=sent.offset_msg_id)
    assert sent.msg_id in by_id.text
    host, port = served.cluster.broker_addr.rsplit(":", 1)
    nowhere = await served.get("/message", id=offset_msg_id(host, int(port), 1 << 40))
    assert (nowhere.status, "No message named" in nowhere.text) == (404, True)
    shown = await served.get("/message", id=sent.offset_msg_id)
    assert "héllo" in shown.text
    assert "order-1" in shown.text


async def test_counters_feed_the_charts(served: Served) -> None:
    async with Producer("PG-console", served.cluster.namesrv_addr) as producer:
        for n in range(3):
            await producer.send(Message("Rates", b"%d" % n))
    answer = await served.get("/api/counters", kind="topic", name="Rates")
    assert answer.status == 200
    assert json.loads(answer.text)["series"] == {"in msgs": 3}
    cluster = json.loads((await served.get("/api/counters", kind="cluster")).text)
    assert next(iter(cluster["series"].values())) > 0
    assert (await served.get("/api/counters", kind="topic", name="Nope")).status == 404


async def test_reset_offset_needs_an_explicit_confirm(served: Served) -> None:
    async with Producer("PG-console", served.cluster.namesrv_addr) as producer:
        for n in range(4):
            await producer.send(Message("Ledger", b"%d" % n))
    await consume_all(served, "CG-reset", "Ledger", 4)
    await eventually_async(lambda: _is(served, "CG-reset", "Ledger", 4))
    group = await served.get("/groups/CG-reset")
    assert group.status == 200
    assert "Ledger" in group.text

    path = "/groups/CG-reset/reset"
    query = {"topic": "Ledger", "time": "1000"}
    plan = await served.get(path, **query)
    assert plan.status == 200
    assert "Confirm: reset these offsets" in plan.text
    # The resolved instant, in UTC and as epoch ms, on the plan page.
    assert "1970-01-01 00:00:01Z UTC (1000 ms since the epoch)" in plan.text
    unconfirmed = await served.confirm(path, query, **query)
    assert "Confirm: reset these offsets" in unconfirmed.text
    assert await committed(served, "CG-reset", "Ledger") == 4  # neither wrote

    done = await served.confirm(path, query, **query, confirm="yes")
    assert done.status == 200
    assert "reset to the messages stored at" in done.text
    assert "1970-01-01 00:00:01Z UTC (1000 ms since the epoch)" in done.text
    assert served.cluster.broker_addr in done.text
    assert await committed(served, "CG-reset", "Ledger") == 0

    # A naive date-time without the browser's script is read as UTC, and says so.
    naive = await served.get(path, topic="Ledger", time_local="2026-11-25T10:00:00")
    assert "2026-11-25 10:00:00Z UTC (1795600800000 ms since the epoch)" in naive.text
    bad = await served.get(path, topic="Ledger", time="yesterday-ish")
    assert (bad.status, "Not a time" in bad.text) == (400, True)


async def _is(served: Served, group: str, topic: str, offset: int) -> bool:
    return await committed(served, group, topic) == offset


async def test_a_topic_of_10000_queues_renders_one_page_and_says_how_many_more(
    tmp_path: Path,
) -> None:
    # A broker serves at most 1024 queues per topic: ten brokers of 1000 make 10,000.
    settings = {"mappedFileSizeCommitLog": str(1 << 20), "mappedFileSizeConsumeQueue": "6000"}
    async with (
        local_cluster(tmp_path, brokers=10, broker_settings=settings) as cluster,
        serve_console(cluster) as url,
    ):
        served = Served(cluster, url)
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic("Wide", read_queue_nums=1000, write_queue_nums=1000)
        page = await served.get("/topics/Wide")
        assert page.status == 200, page.text[-500:]
        assert "10000 queues" in page.text
        assert page.text.count('<tr class="q">') == ROWS_PER_PAGE
        assert f"({10_000 - ROWS_PER_PAGE} more)" in page.text
        last = await served.get("/topics/Wide", page="50")
        assert last.text.count('<tr class="q">') == ROWS_PER_PAGE
        assert "<td>999</td>" in last.text

        # A group with an offset on each of the 10,000 queues (written with no consumer online).
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.topic_route("Wide")  # the client's route cache: commits find masters
            for broker in cluster.brokers:  # one committed offset each: the group exists there
                queue = MessageQueue("Wide", broker.config.broker_name, 0)
                await api.update_consumer_offset(admin.instance, "CG-wide", queue, 0)
            await admin.reset_offset_by_timestamp("CG-wide", "Wide", 0)  # all 10,000 queues
        group = await served.get("/groups/CG-wide")
        assert group.status == 200, group.text[-500:]
        assert group.text.count('<td class="consumer-offset">') == ROWS_PER_PAGE
        assert f"({10_000 - ROWS_PER_PAGE} more)" in group.text
        plan = await served.get("/groups/CG-wide/reset", topic="Wide", time="1000")
        assert plan.status == 200, plan.text[-500:]
        assert plan.text.count("<tr><td>broker-") == PLAN_QUEUES_MAX
        assert f"{10_000 - PLAN_QUEUES_MAX} more queue(s) of 10000 not previewed" in plan.text
        for kind, name in (("topic", "Wide"), ("group", "CG-wide"), ("cluster", "")):
            chart = await served.get("/api/counters", kind=kind, name=name)
            assert chart.status == 200, (kind, chart.text)
            assert json.loads(chart.text)["series"], kind


def _heartbeat_command(client_id: str, group: str) -> RemotingCommand:
    """A HEART_BEAT of consumer `client_id` of `group` (subscribed to Crowd)."""
    data = ConsumerData(group, subscription_data_set=[SubscriptionData(topic="Crowd")])
    beat = HeartbeatData(client_id=client_id, consumer_data_set=[data])
    return RemotingCommand(code=RequestCode.HEART_BEAT, body=beat.to_json())


async def test_a_group_with_100_clients_renders_a_page_of_them(served: Served) -> None:
    """100 consumers: raw heartbeats over 100 plain connections (the broker keeps one client
    per connection), no client library instances."""
    host, port = served.cluster.broker_addr.rsplit(":", 1)
    writers: list[asyncio.StreamWriter] = []
    try:
        for n in range(100):
            reader, writer = await asyncio.open_connection(host, int(port))
            writers.append(writer)
            writer.write(frame.encode(_heartbeat_command(f"10.0.0.{n}@crowd-{n}", "CG-crowd")))
            size = int.from_bytes(await reader.readexactly(4), "big")
            answer = frame.decode_frame(await reader.readexactly(size))
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        page = await served.get("/groups/CG-crowd")
    finally:
        for writer in writers:
            writer.close()
    assert page.status == 200, page.text[-500:]
    assert "<h2>Clients (100)</h2>" in page.text
    assert page.text.count("@crowd-") == 100


def test_paginate_and_bodies() -> None:
    page = paginate(list(range(450)), 2, 200)
    assert (page.rows[0], len(page.rows), page.more, page.pages) == (200, 200, 50, 3)
    assert paginate([], 5).rows == []
    assert Body.of("é".encode()).encoding == "utf-8"
    cut = Body.of("aé".encode() * 10, limit=4)  # the cut falls inside an é: it is left out
    assert (cut.text, cut.encoding, cut.cut) == ("aéa", "utf-8", 26)
    binary = Body.of(b"\xff\x00" * 10_000, limit=8)
    assert (binary.encoding, binary.cut, binary.size) == ("hex", 19_992, 20_000)


async def test_delete_group_needs_an_explicit_confirm(served: Served) -> None:
    async with Producer("PG-console", served.cluster.namesrv_addr) as producer:
        await producer.send(Message("Bills", b"1"))
    await consume_all(served, "CG-gone", "Bills", 1)

    async def groups() -> list[str]:
        async with Admin(served.cluster.namesrv_addr) as admin:
            return await admin.groups()

    asked = await served.get("/groups/CG-gone/delete")
    assert "Confirm: delete CG-gone" in asked.text
    unconfirmed = await served.confirm("/groups/CG-gone/delete", {})
    assert "Confirm: delete CG-gone" in unconfirmed.text
    assert "CG-gone" in await groups()

    done = await served.confirm("/groups/CG-gone/delete", {}, confirm="yes")
    assert "Group CG-gone deleted on" in done.text
    assert "CG-gone" not in await groups()
    assert (await served.get("/groups/CG-gone/delete")).status == 404
    assert (await served.get("/groups/CG-gone")).status == 404  # its offsets went too


async def test_the_cli_verb_serves_the_console(served: Served) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidemq.cli.main",
        "console",
        "--namesrv",
        served.cluster.namesrv_addr,
        "--port",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    other = Served(served.cluster, f"http://127.0.0.1:{port}")
    try:

        async def answers() -> bool:
            try:
                return (await other.get("/")).status == 200
            except OSError:
                return False

        await eventually_async(answers, timeout_s=30)
        page = await other.get("/")
        assert served.cluster.broker_addr in page.text
    finally:
        process.terminate()
        # uvicorn shuts down on SIGTERM, then re-raises it to the default handler (as a process
        # killed by it ends); anything else (a traceback's 1) is a failure.
        assert await process.wait() in (0, -signal.SIGTERM)


class _Undecided:
    """A transaction listener that leaves every transaction open (UNKNOW)."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


async def test_transactions_page_lists_half_messages_in_flight(served: Served) -> None:
    async with TransactionProducer(
        "PG-tx", served.cluster.namesrv_addr, listener=_Undecided()
    ) as producer:
        await producer.send_message_in_transaction(Message("Payments", b"v", keys="order-42"))
        page = await served.get("/transactions")
    assert page.status == 200
    assert "In flight: 1" in page.text
    assert "<td>Payments</td><td>PG-tx</td>" in page.text
    assert "order-42" in page.text


async def test_a_write_not_from_the_consoles_own_form_is_refused(served: Served) -> None:
    async with Producer("PG-console", served.cluster.namesrv_addr) as producer:
        await producer.send(Message("Ledger", b"1"))
    await consume_all(served, "CG-csrf", "Ledger", 1)
    path = "/groups/CG-csrf/reset"
    fields = {"topic": "Ledger", "time": "0", "confirm": "yes"}
    token = await served.token(path, topic="Ledger", time="0")
    refusals = {
        "another site": await served.post(
            path, {"Origin": "http://evil.example"}, csrf=token, **fields
        ),
        "no Origin": await served.post(path, {"Origin": ""}, csrf=token, **fields),
        "no token": await served.post(path, None, **fields),
        "a wrong token": await served.post(path, None, csrf="0" * 64, **fields),
        "another form's token": await served.post(
            path, None, csrf=await served.token("/groups/CG-csrf/delete"), **fields
        ),
    }
    for why, answer in refusals.items():
        assert (why, answer.status) == (why, 403)
        assert "Refused a write" in answer.text
    # DNS rebinding: evil.example resolving to 127.0.0.1 sends its own name as Host.
    rebound = await served.post(
        path,
        {"Host": "evil.example", "Origin": "http://evil.example"},
        csrf=token,
        **fields,
    )
    assert rebound.status == 400
    assert (await served.get("/")).status == 200
    assert await committed(served, "CG-csrf", "Ledger") == 1  # none of them wrote
    done = await served.post(path, None, csrf=token, **fields)
    assert (done.status, "reset to" in done.text) == (200, True)


async def test_every_answer_forbids_framing(served: Served) -> None:
    host_refused = await asyncio.to_thread(_fetch_with_host, served.base_url, "evil.example")
    for answer in (
        await served.get("/"),
        await served.get("/groups/NoSuchGroup/delete"),
        await served.get("/api/counters", kind="cluster"),
        await served.get("/static/console.css"),
        host_refused,
    ):
        assert answer.headers["x-frame-options"] == "DENY"
        csp = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp
        assert "default-src 'self'" in csp
    assert host_refused.status == 400


def _fetch_with_host(base_url: str, host: str) -> Answer:
    return _fetch(urllib.request.Request(base_url + "/", headers={"Host": host}))


async def test_a_message_id_naming_another_address_is_not_followed(served: Served) -> None:
    """An offset msg id carries host:port; the console connects only to the cluster's brokers."""
    accepted: list[int] = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    bystander = await asyncio.start_server(count, "127.0.0.1", 0)
    port = bystander.sockets[0].getsockname()[1]
    crafted = offset_msg_id("127.0.0.1", port, 0)
    try:
        for answer in (
            await served.get("/message", id=crafted),
            await served.get("/messages", by="id", id=crafted),
            await served.get("/message/resend", id=crafted, group="CG-any"),
        ):
            assert answer.status == 400
            assert f"127.0.0.1:{port}, which is not a broker of this cluster" in answer.text
    finally:
        bystander.close()
        await bystander.wait_closed()
    assert accepted == []


async def test_bad_input_is_400_and_a_too_large_form_413(served: Served) -> None:
    bad_time = await served.get("/messages", by="time", topic="Orders", begin="soon")
    assert (bad_time.status, "Not a time" in bad_time.text) == (400, True)
    too_large = await served.post("/groups/G/delete", filler="x" * 100_000)
    assert too_large.status == 413
    assert "is refused" in too_large.text
    no_group = await served.get("/message/resend", id="0" * 32)
    assert no_group.status == 400


async def test_silent_brokers_show_their_error_in_their_row(served: Served) -> None:
    """Two registered brokers that accept and never answer: the cluster and transactions pages
    still render (asked side by side, each call bounded), with the error in their rows."""
    held: list[asyncio.StreamWriter] = []

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    holes = [await asyncio.start_server(black_hole, "127.0.0.1", 0) for _ in range(2)]
    addrs = [f"127.0.0.1:{h.sockets[0].getsockname()[1]}" for h in holes]
    now_ms = int(time.time() * 1000)
    for n, addr in enumerate(addrs):
        served.cluster.namesrv.routes.register_broker(
            "DefaultCluster", f"broker-hole-{n}", addr, 0, "", None, now_ms
        )
    try:
        started = time.monotonic()
        cluster_page = await served.get("/")
        tx_page = await served.get("/transactions")
        elapsed = time.monotonic() - started
    finally:
        for writer in held:
            writer.close()
        for hole in holes:
            hole.close()
    assert (cluster_page.status, tx_page.status) == (200, 200)
    assert served.cluster.broker_addr in cluster_page.text
    assert "MASTER" in cluster_page.text  # the live broker's row has its runtime figures
    for addr in addrs:
        assert addr in cluster_page.text
    assert cluster_page.text.count('class="error"') == 2
    assert tx_page.text.count('<p class="error">') == 2
    # Side by side: two pages each cost one call's budget, not one per silent broker.
    assert elapsed < 3 * CALL_TIMEOUT_S


async def test_an_unexpected_failure_is_the_500_page(tmp_path: Path) -> None:
    """A page that raises something no handler expects: error.html with status 500, the
    security headers too (the 500 handler answers outside the middleware)."""

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    async with local_cluster(tmp_path) as cluster:
        app = create_app(cluster.namesrv_addr)
        app.add_route("/broken", broken)
        async with serve_console(cluster, app) as url:
            answer = await Served(cluster, url).get("/broken")
    assert answer.status == 500
    assert "Error (500)" in answer.text
    assert "RuntimeError" in answer.text
    assert "a bug" not in answer.text  # details go to the log, not to the page
    assert answer.headers["x-frame-options"] == "DENY"


def test_hosts_allowed_and_the_exposure_warning() -> None:
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "::1", "localhost"]
    assert "mq.example" in allowed_hosts("0.0.0.0", ["MQ.example"])
    assert "0.0.0.0" not in allowed_hosts("0.0.0.0")
    assert "10.1.2.3" in allowed_hosts("10.1.2.3")
    assert exposure_warning("127.0.0.1") is None
    assert exposure_warning("localhost") is None
    warning = exposure_warning("0.0.0.0")
    assert warning is not None
    assert "NO login" in warning
