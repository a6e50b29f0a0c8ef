"""What a topic holds, as a consumer reads it: for tests that check nothing acknowledged is lost."""

from __future__ import annotations

from tidemq.client.message import PullStatus
from tidemq.client.pull_consumer import PullConsumer

PULL_BATCH = 32  # messages asked per pull


async def pull_bodies(namesrv_addr: str, topic: str, group: str) -> set[bytes]:
    """Every body of `topic` a pull consumer of `group` reads from offset 0 of each queue, from
    whichever broker of each group serves the read."""
    bodies: set[bytes] = set()
    async with PullConsumer(group, namesrv_addr) as consumer:
        for mq in await consumer.fetch_subscribe_message_queues(topic):
            offset = 0
            while True:
                result = await consumer.pull(mq, "*", offset, PULL_BATCH)
                if result.status is not PullStatus.FOUND:
                    break
                bodies.update(message.body for message in result.messages)
                offset = result.next_begin_offset
    return bodies
