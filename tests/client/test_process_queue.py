from __future__ import annotations

import asyncio

from tidemq.client.message import MessageExt
from tidemq.client.process_queue import ProcessQueue


def msg(offset: int, size: int = 10) -> MessageExt:
    return MessageExt(
        topic="T",
        body=b"x" * size,
        msg_id=f"id{offset}",
        offset_msg_id="",
        queue_id=0,
        queue_offset=offset,
        commit_log_offset=offset * 100,
        broker_name="broker-a",
    )


def test_commit_offset_is_lowest_unfinished():
    pq = ProcessQueue()
    assert pq.commit_offset() == -1
    batch = [msg(i) for i in range(10, 15)]
    assert pq.put(batch) == batch
    assert pq.put([msg(12)]) == []  # repeated: not added twice
    assert pq.remove([msg(10), msg(12), msg(13)]) == 11
    assert pq.cached_count == 2
    assert pq.cached_bytes == 20
    assert pq.remove([msg(11)]) == 14
    assert pq.remove([msg(14)]) == 15  # nothing pending: one past the highest seen
    assert pq.cached_bytes == 0


def test_orderly_take_commit_and_return():
    pq = ProcessQueue()
    pq.put([msg(i) for i in range(5)])
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [0, 1]
    assert pq.commit_offset() == 0
    pq.return_taken([msg(1, size=10)])
    again = pq.take(3)
    assert [m.queue_offset for m in again] == [0, 1, 2]  # order kept after a return
    assert pq.commit_taken() == 3
    assert [m.queue_offset for m in pq.take(5)] == [3, 4]
    assert pq.commit_taken() == 5


async def test_flow_control_waits_until_space():
    pq = ProcessQueue()
    pq.put([msg(i) for i in range(3)])
    waiter = asyncio.create_task(pq.wait_below(3, 1_000))
    await asyncio.sleep(0)
    assert not waiter.done()
    pq.remove([msg(0)])
    await asyncio.wait_for(waiter, 1)
    blocked = asyncio.create_task(pq.wait_below(1, 1_000))
    await asyncio.sleep(0)
    pq.drop()
    await asyncio.wait_for(blocked, 1)  # a dropped queue releases its pull loop
