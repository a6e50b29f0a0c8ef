"""A malformed request to the name server costs one log line at most, rate-limited per
connection, and never a traceback; the client gets a clear error (issue 11, item 8).

Before the fix a GET_ROUTEINFO_BY_TOPIC without `topic` logged a 20-line traceback: 1 KiB of log
per 120-byte frame. A real name server over loopback; its log captured with caplog.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tidemq.clock import FakeClock
from tidemq.namesrv import NamesrvApp, NamesrvConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting import RemotingClient
from tidemq.remoting.log_limit import LOG_LINES_PER_WINDOW_MAX, LOG_WINDOW_MS

TIMEOUT_MS = 5_000
BAD_REQUESTS = 50


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def app(clock: FakeClock) -> AsyncIterator[NamesrvApp]:
    app = NamesrvApp(NamesrvConfig(listen_port=0), clock, host="127.0.0.1")
    await app.start()
    yield app
    await app.stop()


def bad_request_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "bad request" in r.getMessage()]


async def send_bad_routes(client: RemotingClient, address: str, count: int) -> None:
    """`count` GET_ROUTEINFO_BY_TOPIC without a topic, each answered with a clear error."""
    for _ in range(count):
        request = RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC)
        answer = await client.invoke(address, request, TIMEOUT_MS)
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark is not None
        assert "topic" in answer.remark


async def test_malformed_requests_log_one_line_each_at_most(
    app: NamesrvApp, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tidemq")
    address = f"127.0.0.1:{app.port}"
    first, second = RemotingClient(), RemotingClient()
    try:
        await send_bad_routes(first, address, BAD_REQUESTS)
        lines = bad_request_lines(caplog)
        assert len(lines) == LOG_LINES_PER_WINDOW_MAX
        for record in lines:
            message = record.getMessage()
            assert "\n" not in message
            assert f"code {int(RequestCode.GET_ROUTEINFO_BY_TOPIC)}" in message
            assert "topic" in message
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]

        # The limit is per connection: another client's first mistakes are seen too.
        await send_bad_routes(second, address, 1)
        assert len(bad_request_lines(caplog)) == LOG_LINES_PER_WINDOW_MAX + 1

        # A window later, the first connection's next line counts what was left out.
        clock.advance(LOG_WINDOW_MS)
        await send_bad_routes(first, address, 1)
        left_out = BAD_REQUESTS - LOG_LINES_PER_WINDOW_MAX
        assert f"({left_out} similar lines left out" in bad_request_lines(caplog)[-1].getMessage()

        # The connection stays usable for good requests.
        good = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "absent"}
        )
        answer = await first.invoke(address, good, TIMEOUT_MS)
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        assert not [r for r in caplog.records if r.exc_info]
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize(
    ("code", "fields", "body"),
    [
        (RequestCode.REGISTER_BROKER, {}, b""),
        (
            RequestCode.QUERY_DATA_VERSION,
            {"brokerAddr": "a:1", "brokerName": "b", "clusterName": "c", "brokerId": "0"},
            b"{not json",
        ),
        (RequestCode.PUT_KV_CONFIG, {"namespace": "n"}, b""),
        (RequestCode.UNREGISTER_BROKER, {"brokerId": "x"}, b""),
    ],
)
async def test_every_malformed_header_or_body_is_one_line(
    app: NamesrvApp,
    caplog: pytest.LogCaptureFixture,
    code: int,
    fields: dict[str, str],
    body: bytes,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tidemq")
    client = RemotingClient()
    try:
        request = RemotingCommand(code=code, ext_fields=dict(fields), body=body)
        answer = await client.invoke(f"127.0.0.1:{app.port}", request, TIMEOUT_MS)
    finally:
        await client.close()
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert answer.remark
    assert len(bad_request_lines(caplog)) == 1
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_huge_field_makes_a_short_line(
    app: NamesrvApp, caplog: pytest.LogCaptureFixture
) -> None:
    """The error text may quote what the peer sent: the log keeps its head, not 150 KB of it."""
    caplog.set_level(logging.DEBUG, logger="tidemq")
    fields = {
        "brokerAddr": "a:1",
        "brokerName": "b",
        "clusterName": "c",
        "haServerAddr": "a:2",
        "brokerId": "x\n" * 50_000,
    }
    client = RemotingClient()
    try:
        request = RemotingCommand(code=RequestCode.REGISTER_BROKER, ext_fields=fields)
        answer = await client.invoke(f"127.0.0.1:{app.port}", request, TIMEOUT_MS)
    finally:
        await client.close()
    assert answer.code == ResponseCode.SYSTEM_ERROR
    (line,) = bad_request_lines(caplog)
    assert "brokerId" in line.getMessage()
    assert len(line.getMessage()) < 1024
