"""`async for message in consumer`: a push consumer read as a stream (issue 16).

A PushConsumer started without a listener installs `MessageStream.deliver` as its listener. Each
listener call (a batch of ≤ consume_batch_max messages, ≤ consume_concurrency calls at once, so
that many batches wait here ready) parks its batch here and waits until the loop has been through
it. Offsets, retries and flow control stay the consumer's: the stream only decides what a batch's
listener call returns.

    listener call ──▶ ready queue ──▶ the loop's current batch ──▶ settled:
                                                                   finished ─▶ CONSUME_SUCCESS
                                                                   failed   ─▶ RECONSUME_LATER
                                                                   abandoned ─▶ not committed

The rule: a message is finished once the loop body that received it has completed, and failed
when an exception raised in that body escapes the `async with consumer` block or the task. Python
does not tell an iterator why a loop stopped (`break`, `return` or an exception), so the stream
settles a message at the next event it sees, for the loop that received it:

    the loop asks for the next message                    finished (its offset may be committed)
    a new `async for` starts in the same task             finished: the earlier loop ended with
                                                          `break`/`return`, or its exception was
                                                          caught (handled) before the new loop
    `async with consumer` ends normally (break, return)   finished
    `async with consumer` ends with an exception          failed: sent back and retried later,
                                                          as when a listener raises (orderly:
                                                          retried in place)
    the task running the loop ends (no `async with`)      finished if the task returned, failed
                                                          (and logged) if it raised or was
                                                          cancelled
    shutdown(), or another task's `async with` ends       abandoned: neither committed nor sent
                                                          back; read again after a restart

Each task (or, for BlockingPushConsumer, each thread) iterating has its own current batch, so
several workers may iterate one consumer; leaving `async with` settles only the batch of the task
that leaves it (a worker still in its loop body is mid-message: committing that message would lose
it on a crash). Whatever the stream holds that no loop has received yet is abandoned at shutdown.

A consumer started without a listener that nothing iterates pulls until flow control stops it and
consumes nothing: once a batch has waited NOTHING_ITERATES_WARN_S with no loop on the consumer, a
warning says so (once per consumer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from dataclasses import dataclass

from .message import ConsumeConcurrentlyStatus, MessageExt

logger = logging.getLogger("tidemq.client.consumer")

# A batch nobody took for this long, with no loop on the consumer, means nothing reads it (most
# likely a forgotten listener): long enough that a loop busy between two `async for`s (setup, a
# slow first message) does not trigger it, short enough to be seen in a first try.
NOTHING_ITERATES_WARN_S = 10.0


@dataclass(eq=False, slots=True)
class _Batch:
    messages: list[MessageExt]
    settled: asyncio.Future[bool]
    position: int = 0  # how many of `messages` the loop has received

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.messages)


class MessageStream:
    """The bridge between a push consumer's listener calls and the loops reading it."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._ready: asyncio.Queue[_Batch | None] = asyncio.Queue()
        # The batch each loop is on, by owner: the task iterating, or a blocking caller's thread.
        self._current: dict[Hashable, _Batch] = {}
        self._watched: set[asyncio.Task[object]] = set()
        self._closed = False
        self._asking = 0  # loops waiting for a batch
        self._warned = False

    async def deliver(self, messages: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        """The consumer's listener: wait until a loop has been through `messages`.

        Raises:
            asyncio.CancelledError: abandoned at shutdown (the consumer commits nothing for it).
        """
        batch = _Batch(list(messages), asyncio.get_running_loop().create_future())
        if self._closed:
            batch.settled.cancel()
        else:
            self._ready.put_nowait(batch)
            check = asyncio.get_running_loop().call_later(
                NOTHING_ITERATES_WARN_S, self._warn_if_unread, batch
            )
            batch.settled.add_done_callback(lambda _: check.cancel())
        if await batch.settled:
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    def _warn_if_unread(self, batch: _Batch) -> None:
        if self._warned or batch.settled.done() or batch.position or self._current:
            return
        if self._asking:
            return  # a loop is about to take it
        self._warned = True
        logger.warning(
            "%s: messages have waited %.0f s: no listener registered and nothing iterates this "
            "consumer: register_listener() (or listener=) before start(), or "
            "`async for message in consumer` (`for` with BlockingPushConsumer)",
            self.group,
            NOTHING_ITERATES_WARN_S,
        )

    def loop_started(self, owner: Hashable) -> None:
        """A new loop of `owner`: what its earlier loop stopped on is finished (module
        docstring: the earlier loop's body completed, or its exception was caught)."""
        self.settle(owner, ok=True)

    async def next(self, owner: Hashable) -> MessageExt:
        """The next message for `owner`'s loop; settles the one before as finished.

        Raises:
            StopAsyncIteration: the consumer is shut down.
        """
        batch = self._current.get(owner)
        if batch is None or batch.exhausted:
            self.settle(owner, ok=True)
            batch = await self._take()
            self._current[owner] = batch
        message = batch.messages[batch.position]
        batch.position += 1
        return message

    async def _take(self) -> _Batch:
        while True:
            self._asking += 1
            try:
                batch = await self._ready.get()
            finally:
                self._asking -= 1
            if batch is None:
                self._ready.put_nowait(None)  # wakes the next waiting loop too
                raise StopAsyncIteration
            if not batch.settled.done():
                return batch

    def settle(self, owner: Hashable, *, ok: bool, error: BaseException | None = None) -> None:
        """`owner`'s current batch: finished (ok) or sent back for a retry; `error` is why."""
        batch = self._current.pop(owner, None)
        if batch is not None and not batch.settled.done():
            if not ok:
                logger.warning(
                    "%s: the loop stopped on a message%s; %d message(s) go back for a retry",
                    self.group,
                    f" ({type(error).__name__})" if error is not None else "",
                    len(batch.messages),
                    exc_info=error,
                )
            batch.settled.set_result(ok)

    def watch(self, task: asyncio.Task[object]) -> None:
        """Settle `task`'s batch when it ends: finished if it returned, else failed."""
        if task not in self._watched:
            self._watched.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._watched.discard(task)
        if task not in self._current:
            return  # nothing to settle: leave the task's exception to its owner (or asyncio)
        if task.cancelled():
            self.settle(task, ok=False)
            return
        # Reading the exception marks it retrieved, so asyncio no longer reports it as "never
        # retrieved": the warning carries it instead.
        error = task.exception()
        self.settle(task, ok=error is None, error=error)

    def close(self) -> None:
        """Shutdown: abandon what no loop settled, and end every loop."""
        self._closed = True
        for batch in self._current.values():
            batch.settled.cancel()
        self._current.clear()
        while not self._ready.empty():
            waiting = self._ready.get_nowait()
            if waiting is not None:
                waiting.settled.cancel()
        self._ready.put_nowait(None)


class MessageIterator:
    """What `async for message in consumer` iterates (one per loop)."""

    def __init__(self, stream: MessageStream) -> None:
        task = asyncio.current_task()
        assert task is not None  # `async for` runs in a task
        self._stream = stream
        self._task = task
        stream.loop_started(task)
        stream.watch(task)

    def __aiter__(self) -> MessageIterator:
        return self

    async def __anext__(self) -> MessageExt:
        return await self._stream.next(self._task)
