"""Helpers of the reliability tests: send-back requests and waiting for a queue to fill."""

from __future__ import annotations

import asyncio
import time

from broker_harness import Harness, messages

from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader
from tidemq.protocol.message import encode_properties
from tidemq.protocol.record import StoredMessage

# Small delay tables so nothing sleeps long.
FAST_LEVELS = "100ms 200ms 300ms 400ms"


async def send_back(
    broker: Harness,
    offset: int,
    *,
    group: str = "CG",
    delay_level: int = 0,
    max_reconsume_times: int | None = None,
    version: int = 407,
) -> RemotingCommand:
    header = ConsumerSendMsgBackRequestHeader(
        offset=offset,
        group=group,
        delay_level=delay_level,
        max_reconsume_times=max_reconsume_times,
    )
    return await broker.call(
        RemotingCommand(
            code=RequestCode.CONSUMER_SEND_MSG_BACK,
            ext_fields=header.to_fields(),
            version=version,
        )
    )


async def send_with(
    broker: Harness,
    topic: str,
    body: bytes,
    properties: dict[str, str],
    *,
    reconsume_times: int = 0,
    max_reconsume_times: int | None = None,
    version: int = 407,
) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        queue_id=0,
        born_timestamp=1,
        properties=encode_properties(properties),
        reconsume_times=reconsume_times,
        max_reconsume_times=max_reconsume_times,
    )
    cmd = RemotingCommand(
        code=RequestCode.SEND_MESSAGE, ext_fields=header.to_fields(), body=body, version=version
    )
    return await broker.call(cmd)


async def wait_for_messages(
    broker: Harness, topic: str, count: int = 1, *, queue_id: int = 0, timeout_s: float = 5.0
) -> tuple[list[StoredMessage], float]:
    """Long-poll `topic` until `count` messages are there; (them, monotonic time seen)."""
    found: list[StoredMessage] = []
    async with asyncio.timeout(timeout_s):
        while len(found) < count:
            response = await broker.pull(
                topic,
                queue_id=queue_id,
                offset=len(found),
                suspend_ms=1000,
                sys_flag=0x2 | 0x4,
            )
            found.extend(messages(response) if response.code == 0 else [])
    return found, time.monotonic()


async def first_stored(broker: Harness, topic: str) -> StoredMessage:
    response = await broker.pull(topic)
    assert response.code == 0, response.remark
    return messages(response)[0]
