"""One driver per broker, each through its usual Python client, with the same five operations.

    send(body)                             one message; returns once the durable ack is in
    send_pipelined(n, body, deadline, w)   up to n messages, w in flight; returns the count acked
    send_batched(n, body, deadline)        the broker's batch send (or its nearest equivalent,
                                           named by `batch_note`); returns the count acked
    consume(n, deadline, on_body)          receive and acknowledge/commit up to n messages

A driver is rebuilt in another process (the latency case's consumer) from `(name, address,
state())`, so everything that names the stream, topic or group lives in `state()`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from typing import Any

from sidebyside.common import Options

CONSUME_BATCH = 256  # messages per fetch for every broker (TideMQ's pull maximum)
NATS_CLUSTER_READY_S = 30.0  # a fresh NATS cluster elects its JetStream leaders within seconds
OnBody = Callable[[bytes], None] | None


class Driver:
    name = "base"
    durability = ""
    client = ""
    batch_note = ""

    def __init__(self, address: str, options: Options, state: dict[str, Any] | None = None):
        self.address = address
        self.options = options
        self.generation = 0
        self._state = dict(state or {})
        self.attached = state is not None  # rebuilt in another process: never deletes the stream

    def state(self) -> dict[str, Any]:
        return dict(self._state)

    async def connect(self) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        """A fresh stream/topic and consumer group for the next measurement."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def send(self, body: bytes) -> None:
        raise NotImplementedError

    async def send_pipelined(self, count: int, body: bytes, deadline: float, window: int) -> int:
        """Default: `window` concurrent senders, each awaiting its ack."""
        sent = 0

        async def sender() -> None:
            nonlocal sent
            while sent < count and time.monotonic() < deadline:
                sent += 1
                await self.send(body)

        await asyncio.gather(*(sender() for _ in range(window)))
        return sent

    async def send_batched(self, count: int, body: bytes, deadline: float) -> int:
        return await self.send_pipelined(count, body, deadline, self.options.window)

    async def consume(self, count: int, deadline: float, on_body: OnBody = None) -> int:
        raise NotImplementedError


# -- Redis Streams ------------------------------------------------------------------------------


class RedisDriver(Driver):
    name = "redis"
    fsync = "everysec"
    batch_note = "pipeline of 64 XADD per round trip, 4 in flight"

    @property
    def durability(self) -> str:  # type: ignore[override]
        return f"AOF appendfsync {self.fsync}"

    async def connect(self) -> None:
        from importlib.metadata import version

        import redis.asyncio as redis_client

        host, port = self.address.split(":")
        self.client = f"redis-py {version('redis')}"
        # A blocking pool: 256 concurrent sends wait for one of 64 connections instead of failing.
        pool = redis_client.BlockingConnectionPool(
            host=host, port=int(port), max_connections=64, timeout=None
        )
        self.redis = redis_client.Redis(connection_pool=pool)
        await self.redis.config_set("appendfsync", self.fsync)
        self._state.setdefault("key", "bench")

    async def reset(self) -> None:
        self.generation += 1
        key = f"bench{self.generation}"
        await self.redis.delete(self._state["key"])
        self._state["key"] = key
        await self.redis.xgroup_create(key, "g", id="0", mkstream=True)

    async def close(self) -> None:
        if not self.attached:
            with contextlib.suppress(Exception):
                await self.redis.delete(self._state["key"])
        await self.redis.aclose()

    async def send(self, body: bytes) -> None:
        await self.redis.xadd(self._state["key"], {"d": body})

    async def _pipeline(self, count: int, body: bytes) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for _ in range(count):
            pipe.xadd(self._state["key"], {"d": body})
        await pipe.execute()

    async def send_pipelined(self, count: int, body: bytes, deadline: float, window: int) -> int:
        # One connection with `window` commands per round trip: redis-py's pipelined shape.
        sent = 0
        while sent < count and time.monotonic() < deadline:
            step = min(window, count - sent)
            await self._pipeline(step, body)
            sent += step
        return sent

    async def send_batched(self, count: int, body: bytes, deadline: float) -> int:
        sent = 0
        batch = self.options.batch

        async def worker() -> None:
            nonlocal sent
            while sent < count and time.monotonic() < deadline:
                sent += batch
                await self._pipeline(batch, body)

        await asyncio.gather(*(worker() for _ in range(self.options.batch_window)))
        return sent

    async def consume(self, count: int, deadline: float, on_body: OnBody = None) -> int:
        key, got = self._state["key"], 0
        while got < count and time.monotonic() < deadline:
            reply: Any = await self.redis.xreadgroup(
                "g", "c1", {key: ">"}, count=min(CONSUME_BATCH, count - got), block=100
            )
            if not reply:
                continue
            entries = reply[0][1]
            if on_body is not None:
                for _, fields in entries:
                    on_body(fields[b"d"])
            await self.redis.xack(key, "g", *[entry[0] for entry in entries])
            got += len(entries)
        return got


class RedisAlwaysDriver(RedisDriver):
    name = "redis-always"
    fsync = "always"


# -- NATS JetStream -----------------------------------------------------------------------------


class NatsDriver(Driver):
    name = "nats"
    durability = "JetStream file, R1 (2.9: fsync every 2 min, ack before fsync)"
    batch_note = "no batch API: publish_async, 256 in flight"
    replicas = 1

    async def connect(self) -> None:
        from importlib.metadata import version

        import nats as nats_client

        self.client = f"nats-py {version('nats-py')}"
        self.nc = await nats_client.connect(
            servers=[f"nats://{address}" for address in self.address.split(",")],
            pending_size=256 * 1024 * 1024,
        )
        self.js = self.nc.jetstream(publish_async_max_pending=self.options.window)
        self._state.setdefault("stream", "BENCH0")

    async def reset(self) -> None:
        from nats.js import api

        with contextlib.suppress(Exception):
            await self.js.delete_stream(self._state["stream"])
        self.generation += 1
        stream = f"BENCH{self.generation}"
        self._state["stream"] = stream
        self._state["subject"] = f"bench{self.generation}.x"
        config = api.StreamConfig(
            name=stream,
            subjects=[self._state["subject"]],
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
        )
        await self._add_stream(config)
        await self.js.add_consumer(
            stream,
            api.ConsumerConfig(
                durable_name="c",
                ack_policy=api.AckPolicy.EXPLICIT,
                max_ack_pending=100_000,
                deliver_policy=api.DeliverPolicy.ALL,
            ),
        )

    async def _add_stream(self, config: Any) -> None:
        """A cluster elects its JetStream meta leader a moment after its routes connect: until
        then stream creation fails with "JetStream system temporarily unavailable"."""
        import nats.errors
        import nats.js.errors

        deadline = time.monotonic() + NATS_CLUSTER_READY_S
        while True:
            try:
                await self.js.add_stream(config)
                return
            except (nats.js.errors.Error, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        if not self.attached:
            with contextlib.suppress(Exception):
                await self.js.delete_stream(self._state["stream"])
        await self.nc.close()

    async def send(self, body: bytes) -> None:
        await self.js.publish(self._state["subject"], body)

    async def send_pipelined(self, count: int, body: bytes, deadline: float, window: int) -> int:
        js = self.nc.jetstream(publish_async_max_pending=window)
        sent = 0
        while sent < count and time.monotonic() < deadline:
            await js.publish_async(self._state["subject"], body)
            sent += 1
        await asyncio.wait_for(js.publish_async_completed(), timeout=60)
        return sent

    async def consume(self, count: int, deadline: float, on_body: OnBody = None) -> int:
        import nats.errors

        subscription = await self.js.pull_subscribe(
            self._state["subject"], durable="c", stream=self._state["stream"]
        )
        got = 0
        while got < count and time.monotonic() < deadline:
            try:
                messages = await subscription.fetch(
                    batch=min(CONSUME_BATCH, count - got), timeout=0.2
                )
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            for message in messages:
                if on_body is not None:
                    on_body(message.data)
                await message.ack()
            got += len(messages)
        await self.nc.flush()
        return got


class NatsR3Driver(NatsDriver):
    """The replicated peer: a stream with three replicas on a three-node cluster (servers.
    nats_cluster); the client connects to every node. An ack means two of three nodes stored the
    message (a Raft quorum); 2.9's file store fsyncs every 2 min, so neither node has synced it."""

    name = "nats-r3"
    durability = "JetStream file, R3: ack after 2 of 3 stored (no fsync before ack)"
    replicas = 3


# -- RabbitMQ -----------------------------------------------------------------------------------


class RabbitDriver(Driver):
    name = "rabbitmq"
    durability = "durable classic queue, persistent, publisher confirms"
    batch_note = "no batch API: confirmed publishes, 256 in flight"

    async def connect(self) -> None:
        from importlib.metadata import version

        import aio_pika

        self.aio_pika = aio_pika
        self.client = f"aio-pika {version('aio-pika')}"
        self.connection = await aio_pika.connect(f"amqp://guest:guest@{self.address}/")
        self.channel = await self.connection.channel(publisher_confirms=True)
        self._state.setdefault("queue", "bench0")

    async def reset(self) -> None:
        with contextlib.suppress(Exception):
            await self.channel.queue_delete(self._state["queue"])
        self.generation += 1
        self._state["queue"] = f"bench{self.generation}"
        await self.channel.declare_queue(self._state["queue"], durable=True)

    async def close(self) -> None:
        if not self.attached:
            with contextlib.suppress(Exception):
                await self.channel.queue_delete(self._state["queue"])
        await self.connection.close()

    async def send(self, body: bytes) -> None:
        message = self.aio_pika.Message(body, delivery_mode=self.aio_pika.DeliveryMode.PERSISTENT)
        await self.channel.default_exchange.publish(message, routing_key=self._state["queue"])

    async def consume(self, count: int, deadline: float, on_body: OnBody = None) -> int:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=CONSUME_BATCH)
        queue = await channel.declare_queue(self._state["queue"], durable=True)
        got = 0
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            nonlocal got
            if on_body is not None:
                on_body(message.body)
            await message.ack()
            got += 1
            if got >= count:
                done.set()

        tag = await queue.consume(on_message, no_ack=False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(Exception):
            await queue.cancel(tag)
            await channel.close()
        return got


# -- TideMQ -------------------------------------------------------------------------------------

TIDEMQ_QUEUES = 4  # queues per benchmark topic


class TideDriver(Driver):
    name = "tidemq"
    batch_note = "SEND_BATCH_MESSAGE, 64 per request, 4 in flight"

    def __init__(self, address: str, options: Options, state: dict[str, Any] | None = None):
        super().__init__(address, options, state)
        self.durability = self._state.get("durability", "")

    async def connect(self) -> None:
        from tidemq import Producer, __version__

        self.client = f"tidemq {__version__} (Python)"
        self.producer = Producer("bench_producer", self.address)
        await self.producer.start()
        self._state.setdefault("topic", "Bench0")

    async def reset(self) -> None:
        from tidemq import Admin, Message, QueueError

        self.generation += 1
        topic = f"Bench{self.generation}_{id(self) % 10_000}"
        self._state["topic"] = topic
        self._state["group"] = f"bench_{topic}"
        async with Admin(self.address) as admin:
            for _ in range(100):  # until the broker has registered with the name server
                with contextlib.suppress(QueueError):
                    await admin.create_topic(
                        topic, read_queue_nums=TIDEMQ_QUEUES, write_queue_nums=TIDEMQ_QUEUES
                    )
                    break
                await asyncio.sleep(0.1)
        await self.producer.send(Message(topic, b"warm-up"))  # route lookup
        self._state["skip"] = 1  # the warm-up message is not counted by consumers

    async def close(self) -> None:
        await self.producer.shutdown()

    async def send(self, body: bytes) -> None:
        from tidemq import Message

        await self.producer.send(Message(self._state["topic"], body))

    async def send_pipelined(self, count: int, body: bytes, deadline: float, window: int) -> int:
        # RocketMQ's async send with a window: `window` send_nowait futures in flight, the
        # oldest awaited when the window is full (usually done by then). No task per message.
        from tidemq import Message

        topic, send_nowait = self._state["topic"], self.producer.send_nowait
        in_flight: collections.deque[asyncio.Future[Any]] = collections.deque()
        sent = 0
        while sent < count and time.monotonic() < deadline:
            if len(in_flight) >= window:
                await in_flight.popleft()
            in_flight.append(send_nowait(Message(topic, body)))
            sent += 1
        for future in in_flight:
            await future
        return sent

    async def send_batched(self, count: int, body: bytes, deadline: float) -> int:
        from tidemq import Message

        sent, batch, topic = 0, self.options.batch, self._state["topic"]

        async def worker() -> None:
            nonlocal sent
            while sent < count and time.monotonic() < deadline:
                sent += batch
                await self.producer.send_batch([Message(topic, body) for _ in range(batch)])

        await asyncio.gather(*(worker() for _ in range(self.options.batch_window)))
        return sent

    async def consume(self, count: int, deadline: float, on_body: OnBody = None) -> int:
        """Long-polling pulls on every queue; each pull's next offset is committed to the broker."""
        from tidemq import PullConsumer

        consumer = PullConsumer(self._state["group"], self.address)
        await consumer.start()
        got = 0
        skip = self._state.get("skip", 0)
        all_in = asyncio.Event()

        async def drain(queue: Any) -> None:
            nonlocal got, skip
            offset = 0
            while time.monotonic() < deadline:
                result = await consumer.pull_block_if_not_found(
                    queue, "*", offset, CONSUME_BATCH, suspend_ms=500
                )
                messages = result.messages
                if messages:
                    for message in messages:
                        if skip and message.body == b"warm-up":
                            skip -= 1
                            continue
                        got += 1
                        if on_body is not None:
                            on_body(message.body)
                    offset = result.next_begin_offset
                    await consumer.update_consumer_offset(queue, offset)
                    if got >= count:
                        all_in.set()
                        return

        try:
            queues = await consumer.fetch_subscribe_message_queues(self._state["topic"])
            tasks = [asyncio.create_task(drain(queue)) for queue in queues]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_in.wait(), max(0.1, deadline - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await consumer.shutdown()
        return got


DRIVERS: dict[str, type[Driver]] = {
    "redis": RedisDriver,
    "redis-always": RedisAlwaysDriver,
    "nats": NatsDriver,
    "nats-r3": NatsR3Driver,
    "rabbitmq": RabbitDriver,
    "tidemq": TideDriver,
}
