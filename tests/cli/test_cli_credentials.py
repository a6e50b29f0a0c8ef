"""--access-key / --secret-key and TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY reach the clients the
verbs make: a real RemotingServer, playing name server and broker at once, records what signed
the requests it received. The secret is never printed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tidemq.cli.credentials import resolve
from tidemq.cli.main import build_parser
from tidemq.cli.main import main as cli_main
from tidemq.protocol.bodies import BrokerData, QueueData, TopicList, TopicRouteData
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.handlers import HandlerTable
from tidemq.remoting.server import RemotingServer
from tidemq.security.signing import ACCESS_KEY, Credentials, signature_matches

SECRET = "cli-secret-value"


class Recorder:
    """One server answering the few codes `topic list` and `send` need; records every request."""

    def __init__(self) -> None:
        self.requests: list[RemotingCommand] = []
        self.server: RemotingServer | None = None

    @property
    def addr(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    async def handle(self, connection: Any, request: RemotingCommand) -> RemotingCommand:
        self.requests.append(request)
        if request.code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            return request.response(ResponseCode.SUCCESS, body=TopicList(["TopicA"]).to_json())
        if request.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            route = TopicRouteData(
                queue_datas=[QueueData("broker-a", 1, 1, 6)],
                broker_datas=[BrokerData("C", "broker-a", {0: self.addr})],
            )
            return request.response(ResponseCode.SUCCESS, body=route.to_json())
        if request.code == RequestCode.SEND_MESSAGE_V2:
            fields = {"msgId": "ID", "queueId": "0", "queueOffset": str(len(self.requests))}
            return request.response(ResponseCode.SUCCESS, fields)
        return request.response(ResponseCode.SUCCESS)

    def signers(self) -> set[str | None]:
        """The access key of each request (None: unsigned); asserts every signature verifies."""
        keys = set()
        for request in self.requests:
            key = request.ext_fields.get(ACCESS_KEY)
            if key is not None:
                assert signature_matches(SECRET, request.ext_fields, request.body)
            keys.add(key)
        return keys


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    table = HandlerTable()
    for code in (
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.HEART_BEAT,
        RequestCode.UNREGISTER_CLIENT,
    ):
        table.register(code, recorder.handle)
    recorder.server = RemotingServer(table, "127.0.0.1", 0, name="recorder")
    await recorder.server.start()
    yield recorder
    await recorder.server.stop()


@pytest.fixture(autouse=True)
def no_keys_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TIDEMQ_SECRET_KEY", raising=False)


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(cli_main, list(argv))


async def test_global_flags_sign_an_admin_verb(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--access-key", "AK-cli", "--secret-key", SECRET, "topic", "list", "-n", recorder.addr]
    assert await cli(*argv) == 0
    assert capsys.readouterr().out.split() == ["TopicA"]
    assert recorder.signers() == {"AK-cli"}


async def test_flags_after_the_verb_and_the_secret_from_the_environment_sign_a_send(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", SECRET)
    argv = ["send", "-n", recorder.addr, "-t", "TopicA", "-b", "hello", "--access-key", "AK-send"]
    assert await cli(*argv) == 0
    assert "SEND_OK" in capsys.readouterr().out
    assert recorder.signers() == {"AK-send"}
    assert {r.code for r in recorder.requests} >= {RequestCode.SEND_MESSAGE_V2}


async def test_the_environment_alone_signs_and_a_flag_wins_over_it(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMQ_ACCESS_KEY", "AK-env")
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", SECRET)
    assert await cli("topic", "list", "-n", recorder.addr) == 0
    assert recorder.signers() == {"AK-env"}
    recorder.requests.clear()
    assert await cli("--access-key", "AK-flag", "topic", "list", "-n", recorder.addr) == 0
    assert recorder.signers() == {"AK-flag"}


async def test_without_keys_nothing_is_signed(recorder: Recorder) -> None:
    assert await cli("topic", "list", "-n", recorder.addr) == 0
    assert recorder.signers() == {None}


async def test_one_key_alone_is_a_usage_error_that_never_prints_the_secret(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        await cli("topic", "list", "-n", recorder.addr, "--secret-key", SECRET)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "without an access key" in err
    assert SECRET not in err
    assert not recorder.requests


def test_help_shows_no_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIDEMQ_ACCESS_KEY", "AK-env")
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", SECRET)
    parser = build_parser()
    texts = [parser.format_help()]
    for argv in (["send", "--help"], ["topic", "list", "--help"], ["tx", "stats", "--help"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        texts.append(capsys.readouterr().out)
    for text in texts:
        assert "--secret-key" in text
        assert "TIDEMQ_SECRET_KEY" in text
        assert SECRET not in text


def test_resolve() -> None:
    env = {"TIDEMQ_ACCESS_KEY": "AK-env", "TIDEMQ_SECRET_KEY": "SK-env"}
    assert resolve(None, None, {}) is None
    assert resolve(None, None, env) == Credentials("AK-env", "SK-env")
    assert resolve("AK", None, env) == Credentials("AK", "SK-env")
    assert resolve("AK", "SK", env) == Credentials("AK", "SK")
    with pytest.raises(ValueError, match="has no secret key"):
        resolve("AK", None, {})
    with pytest.raises(ValueError, match="without an access key") as refused:
        resolve(None, "SK-secret", {})
    assert "SK-secret" not in str(refused.value)
