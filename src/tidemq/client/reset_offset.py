"""Moving a push consumer's queues to new offsets (RESET_CONSUMER_CLIENT_OFFSET, an admin reset).

As upstream's resetOffset: every named queue this consumer holds is stopped (its process queue
dropped, its pull loop cancelled, cached messages discarded, and, orderly, marked released so a
listener call still running records no offset), its offset set to the new one, then started
again from there. Queues it does not hold are left alone, as upstream's resetOffset (only its
processQueueTable): the broker has written their offsets already, and recording them here would
make this consumer's next commit round send them — later, after their owner has consumed on,
moving the group back. Runs under the rebalance lock, so no rebalance round interleaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from tidemq.protocol.bodies import MessageQueue

from .assignment import OwnedQueue

logger = logging.getLogger(__name__)


async def reset_queues(
    lock: asyncio.Lock,
    queues: dict[MessageQueue, OwnedQueue],
    start_queue: Callable[[MessageQueue, int], None],  # also records the queue's new offset
    table: Mapping[MessageQueue, int],
) -> None:
    async with lock:
        owned = [queues.pop(mq) for mq in table if mq in queues]
        for state in owned:
            state.pq.drop()
            state.released = True
            for task in state.tasks:
                task.cancel()
        await asyncio.gather(*(t for s in owned for t in s.tasks), return_exceptions=True)
        for state in owned:
            start_queue(state.mq, table[state.mq])  # records the offset (dirty: committed)
        if owned:
            moved = {str(s.mq): table[s.mq] for s in sorted(owned, key=lambda s: s.mq)}
            logger.info("offsets reset: %s", moved)
