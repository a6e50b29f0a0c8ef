"""A blocking facade over the asyncio clients, for code without an event loop (the CLI, Spark
executors, scripts).

Each blocking object owns a private event loop running on a daemon thread and submits coroutines
to it (`asyncio.run_coroutine_threadsafe`), so the calling thread blocks while the client's
timers (heartbeat, route refresh) keep running in the background. Calls are thread-safe: several
threads may share one BlockingProducer, and their sends are pipelined on the loop.

    with BlockingProducer("PG", "127.0.0.1:9876") as producer:
        result = producer.send(Message("TopicA", b"hello"))
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Self, TypeVar

from tidemq.protocol.bodies import (
    ClusterInfo,
    ConsumeStats,
    MessageQueue,
    TopicRouteData,
    TopicStatsTable,
)

from .admin import Admin
from .consumer import PushConsumer
from .listener import Listener
from .message import Message, MessageExt, PullResult, SendResult
from .producer import Producer
from .pull_consumer import PullConsumer
from .selector import Selectable
from .transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
    state_of,
)

T = TypeVar("T")


class _LoopThread:
    """An event loop on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking client called from its own event loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C (or any exception) in the waiting thread: the call is abandoned, so it is
            # cancelled on the loop rather than left to finish unseen (a no-op once done).
            future.cancel()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class _BlockingBase:
    """Builds the async client on the loop thread; start/shutdown/context manager."""

    def __init__(self, name: str, factory: Callable[[], Any]) -> None:
        self._runner = _LoopThread(name)

        async def build() -> Any:
            return factory()

        self._client = self._runner.run(build())
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def start(self) -> None:
        self._run(self._client.start())

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._client.shutdown())
        finally:
            self._runner.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class BlockingProducer(_BlockingBase):
    """`Producer` with blocking methods; keyword arguments are Producer's."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(
            f"tidemq-producer-{group}", lambda: Producer(group, namesrv_addr, **options)
        )
        self.producer: Producer = self._client

    def send(self, message: Message, **options: Any) -> SendResult:
        return self._run(self.producer.send(message, **options))

    def send_oneway(self, message: Message) -> None:
        self._run(self.producer.send_oneway(message))

    def send_batch(self, messages: Sequence[Message]) -> SendResult:
        return self._run(self.producer.send_batch(messages))


class BlockingTransactionProducer(BlockingProducer):
    """`TransactionProducer` with blocking methods. `execute_local_transaction` runs in the
    calling thread (as in Java), between the half send and END_TRANSACTION run on the loop;
    check-backs run on the producer's worker pool."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        listener: TransactionListener,
        **options: Any,
    ) -> None:
        _BlockingBase.__init__(
            self,
            f"tidemq-tx-producer-{group}",
            lambda: TransactionProducer(group, namesrv_addr, listener=listener, **options),
        )
        self.producer: TransactionProducer = self._client

    def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        half = self._run(self.producer.send_half(message))
        if half.error is not None:
            raise half.error  # as the asyncio producer's send_message_in_transaction
        state, remark = LocalTransactionState.ROLLBACK_MESSAGE, None
        if half.run_local:
            result: Any = None
            error: BaseException | None = None
            try:
                result = self.producer.listener.execute_local_transaction(half.message, arg)
            except Exception as exc:
                error = exc
            state, remark = state_of(result, error, "local transaction", half.msg_id)
        return self._run(self.producer.end_transaction(half, state, remark))


class BlockingPullConsumer(_BlockingBase):
    """`PullConsumer` with blocking methods; keyword arguments are PullConsumer's."""

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(
            f"tidemq-pull-{group}", lambda: PullConsumer(group, namesrv_addr, **options)
        )
        self.consumer: PullConsumer = self._client

    def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self.consumer.fetch_subscribe_message_queues(topic))

    def pull(
        self, mq: MessageQueue, expression: Selectable, offset: int, max_nums: int
    ) -> PullResult:
        return self._run(self.consumer.pull(mq, expression, offset, max_nums))

    def pull_block_if_not_found(
        self, mq: MessageQueue, expression: Selectable, offset: int, max_nums: int, **options: Any
    ) -> PullResult:
        return self._run(
            self.consumer.pull_block_if_not_found(mq, expression, offset, max_nums, **options)
        )

    def update_consumer_offset(self, mq: MessageQueue, offset: int) -> bool:
        return self._run(self.consumer.update_consumer_offset(mq, offset))

    def fetch_consumer_offset(self, mq: MessageQueue) -> int:
        return self._run(self.consumer.fetch_consumer_offset(mq))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self.consumer.min_offset(mq))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self.consumer.max_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self.consumer.search_offset(mq, timestamp_ms))


def _loop_owner() -> tuple[str, int]:
    """Whose loop a blocking caller runs: its thread's (MessageStream keys loops by owner)."""
    return ("thread", threading.get_ident())


class BlockingPushConsumer(_BlockingBase):
    """`PushConsumer` with blocking methods, for scripts: with a listener (a plain function
    runs on the consumer's thread pool), or iterated without one:

        with BlockingPushConsumer("CG", addr, subscriptions={"Orders": "*"}) as consumer:
            for message in consumer:          # or consumer.iterate(idle_timeout_s=5)
                print(message.body)

    A message counts as consumed once the loop asks for the next one, a new loop starts in the
    same thread, or the `with` block ends normally; if the block raises (Ctrl-C included), the
    message the loop was on goes back for a retry. Leaving the block settles only the loop of the
    thread leaving it: another thread's message is not committed (client/iterate.py). Keyword
    arguments are PushConsumer's.
    """

    def __init__(self, group: str, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__(
            f"tidemq-push-{group}", lambda: PushConsumer(group, namesrv_addr, **options)
        )
        self.consumer: PushConsumer = self._client

    def subscribe(self, topic: str, expression: Selectable = "*") -> None:
        async def subscribe() -> None:
            self.consumer.subscribe(topic, expression)

        self._run(subscribe())

    def register_listener(self, listener: Listener) -> None:
        self.consumer.register_listener(listener)

    def __exit__(self, *exc_info: object) -> None:
        owner = _loop_owner()  # this thread's loop only: others may be mid-body (iterate.py)

        async def settle() -> None:
            if self.consumer.stream is not None:
                self.consumer.stream.settle(owner, ok=not exc_info or exc_info[0] is None)

        try:
            if not self._closed:
                self._run(settle())
        finally:
            self.shutdown()

    def __iter__(self) -> Iterator[MessageExt]:
        return self.iterate()

    def iterate(self, *, idle_timeout_s: float | None = None) -> Iterator[MessageExt]:
        """The messages, one at a time; ends at shutdown, or once none has come for
        `idle_timeout_s` seconds."""
        owner = _loop_owner()

        async def started() -> None:
            self.consumer.stream_to_read().loop_started(owner)

        async def receive() -> MessageExt | None:
            stream = self.consumer.stream_to_read()
            try:
                async with asyncio.timeout(idle_timeout_s):
                    return await stream.next(owner)
            except (TimeoutError, StopAsyncIteration):
                return None

        self._run(started())
        # Another thread may shut the consumer down while this one is in its loop body.
        while not self._closed and (message := self._run(receive())) is not None:
            yield message


class BlockingAdmin(_BlockingBase):
    """`Admin` with blocking methods; keyword arguments are Admin's."""

    def __init__(self, namesrv_addr: str | Sequence[str], **options: Any) -> None:
        super().__init__("tidemq-admin", lambda: Admin(namesrv_addr, **options))
        self.admin: Admin = self._client

    def cluster_info(self) -> ClusterInfo:
        return self._run(self.admin.cluster_info())

    def topic_list(self) -> list[str]:
        return self._run(self.admin.topic_list())

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._run(self.admin.topic_route(topic))

    def create_topic(self, topic: str, **options: Any) -> list[str]:
        return self._run(self.admin.create_topic(topic, **options))

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> None:
        self._run(self.admin.delete_topic(topic, cluster=cluster))

    def topic_stats(self, topic: str) -> TopicStatsTable:
        return self._run(self.admin.topic_stats(topic))

    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        return self._run(self.admin.consume_stats(group, topic))

    def query_message_by_key(self, topic: str, key: str, **options: Any) -> list[MessageExt]:
        return self._run(self.admin.query_message_by_key(topic, key, **options))

    def view_message(self, offset_msg_id: str) -> MessageExt:
        return self._run(self.admin.view_message(offset_msg_id))
