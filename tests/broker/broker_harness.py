"""Test harness: a real broker on port 0 over a real store in tmp_path, and a raw client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config
from tidemq.clock import SystemClock
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    PullMessageRequestHeader,
    PullSysFlag,
    SendMessageRequestHeader,
)
from tidemq.protocol.message import encode_properties
from tidemq.protocol.record import StoredMessage, decode_records
from tidemq.remoting.client import RemotingClient
from tidemq.testing import eventually as testing_eventually

# Tiny files so tests cross segment rollovers; no name server.
SMALL_STORE: Mapping[str, str] = {
    "mappedFileSizeCommitLog": str(64 * 1024),
    "mappedFileSizeConsumeQueue": str(16 * 20),
    "listenPort": "0",
    "brokerIP1": "127.0.0.1",
    "listenHost": "127.0.0.1",
}


@dataclass
class Harness:
    app: BrokerApp
    client: RemotingClient

    @property
    def addr(self) -> str:
        return self.app.address

    async def call(self, cmd: RemotingCommand, timeout_ms: float = 5000) -> RemotingCommand:
        return await self.client.invoke(self.addr, cmd, timeout_ms)

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        properties: Mapping[str, str] | None = None,
        code: int = RequestCode.SEND_MESSAGE,
        sys_flag: int = 0,
        batch: bool = False,
        default_topic_queue_nums: int = 4,
    ) -> RemotingCommand:
        header = SendMessageRequestHeader(
            producer_group="PG",
            topic=topic,
            default_topic="TBW102",
            default_topic_queue_nums=default_topic_queue_nums,
            queue_id=queue_id,
            sys_flag=sys_flag,
            born_timestamp=1,
            flag=0,
            properties=encode_properties(properties or {}),
            batch=batch,
        )
        v2 = code != RequestCode.SEND_MESSAGE
        cmd = RemotingCommand(code=code, ext_fields=header.to_fields(v2=v2), body=body)
        return await self.call(cmd)

    async def pull(
        self,
        topic: str,
        *,
        queue_id: int = 0,
        offset: int = 0,
        group: str = "CG",
        subscription: str | None = "*",
        sys_flag: int = PullSysFlag.SUBSCRIPTION,
        suspend_ms: int = 0,
        commit_offset: int = 0,
        max_msgs: int = 32,
        timeout_ms: float = 5000,
    ) -> RemotingCommand:
        header = PullMessageRequestHeader(
            consumer_group=group,
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_msg_nums=max_msgs,
            sys_flag=sys_flag,
            commit_offset=commit_offset,
            suspend_timeout_millis=suspend_ms,
            subscription=subscription,
            sub_version=0,
        )
        cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=header.to_fields())
        return await self.call(cmd, timeout_ms)


def messages(response: RemotingCommand) -> list[StoredMessage]:
    return decode_records(response.body)


BrokerFactory = Callable[..., Awaitable[Harness]]


@contextlib.asynccontextmanager
async def running_broker(root: Path, **settings: str) -> AsyncIterator[Harness]:
    overrides = {**SMALL_STORE, "storePathRootDir": str(root), **settings}
    app = BrokerApp(load_broker_config(None, {}, overrides), SystemClock())
    await app.start()
    client = RemotingClient()
    try:
        yield Harness(app, client)
    finally:
        await client.close()
        await app.stop()


async def eventually(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """The shared helper with this suite's shorter default timeout."""
    await testing_eventually(predicate, timeout_s)
