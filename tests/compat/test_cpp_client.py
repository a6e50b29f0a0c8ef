"""The official RocketMQ C++ client (PyPI rocketmq==0.4.4, librocketmq 1.2.3) against TideMQ.

Each scenario drives unmodified client code in driver processes (see cpp_driver.py) and checks
what came out the other end: every body that was acknowledged is stored once, consumers see
exactly what their subscription selects, order per queue holds, and a restarted consumer group
resumes where it committed.

Two facts about the 0.4.4 binding shape these tests:
- A push consumer always starts a new group with CONSUME_FROM_LAST_OFFSET. In CLUSTERING mode
  the broker answers QUERY_CONSUMER_OFFSET for a new group with 0 while the queue still starts at
  offset 0 (remoting.md §12.11), so messages produced before the consumer started are delivered;
  the tests rely on that rather than on timing.
- In BROADCASTING mode offsets are local and a new consumer starts at the queue's max offset, so
  the test first probes every queue until every consumer has seen a probe from it.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

# Multi-phase scenarios chain several bounded waits; a failure should come from those waits,
# with their diagnostics, rather than from the suite-wide 120 s timeout.
pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

QUEUES = 4  # Queues per topic: what C++ auto-create asks for and what the tests create.
DELIVERY_TIMEOUT_S = 60.0  # Consumer start, rebalance, first pulls, then the messages.
PROBE_ROUND_S = 2.0  # How long one round of readiness probes waits before sending again.
PROBE_TIMEOUT_S = 60.0  # All consumers have seen a probe from every queue by then.
PROBE_POLL_S = 0.05  # Between looks at the consumers' events within one probe round.

Event = dict[str, Any]


def bodies(events: list[Event]) -> list[str]:
    return [event["body"] for event in events]


def assert_queue_offsets_contiguous(events: list[Event]) -> None:
    """Every queue that was read from holds offsets 0..n-1, each exactly once."""
    offsets: dict[int, list[int]] = defaultdict(list)
    for event in events:
        offsets[event["queue_id"]].append(event["queue_offset"])
    for queue_id, seen in offsets.items():
        assert sorted(seen) == list(range(len(seen))), f"queue {queue_id} offsets {sorted(seen)}"


def received_all(wanted: set[str]) -> Callable[[list[Event]], bool]:
    def check(events: list[Event]) -> bool:
        return wanted <= {event.get("body") for event in events if event["event"] == "received"}

    return check


def produce(producer: Any, topic: str, names: list[str], **extra: Any) -> list[Event]:
    return [producer.send(topic, name, **extra) for name in names]


# --- producers --------------------------------------------------------------------------------


@pytest.mark.parametrize("tidemq", ["dev", "split"], indirect=True)
def test_send_sync_auto_creates_topic_and_pull_reads_it_back(
    tidemq: Any, cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppSync")  # Never created: the C++ client falls back to TBW102.
    names = [f"sync-{i}" for i in range(10)]
    producer = cpp.producer()
    results = produce(producer, topic, names, tags="TagA", keys="k1 k2")
    producer.stop()

    assert [result["status"] for result in results] == [0] * len(names)  # SendStatus.OK
    msg_ids = [result["msg_id"] for result in results]
    assert all(msg_ids)
    assert len(set(msg_ids)) == len(names)
    assert tidemq.queue_count(topic) >= 1

    pulled = cpp.pull(topic, expect=len(names))
    assert sorted(bodies(pulled)) == sorted(names)
    assert {event["tags"] for event in pulled} == {"TagA"}
    assert {event["keys"] for event in pulled} == {"k1 k2"}
    assert {event["topic"] for event in pulled} == {topic}
    assert_queue_offsets_contiguous(pulled)
    # The C++ client spreads sends round-robin over the route's queues.
    assert len({event["queue_id"] for event in pulled}) > 1


@pytest.mark.parametrize("mode", ["async", "oneway"])
def test_send_async_and_oneway_are_stored(
    cpp: Any, unique_name: Callable[[str], str], mode: str
) -> None:
    topic = unique_name(f"Cpp{mode.title()}")
    names = [f"{mode}-{i}" for i in range(12)]
    producer = cpp.producer()
    producer.send(topic, "seed")  # Creates the topic, so every later send has a real route.
    ids = [producer.request({"op": "send", "mode": mode, "topic": topic, "body": name})
           for name in names]  # fmt: skip
    results = [producer.result(command_id) for command_id in ids]
    producer.stop()
    assert [result["event"] for result in results] == ["sent"] * len(names), results
    if mode == "async":
        assert [result["status"] for result in results] == [0] * len(names)

    pulled = cpp.pull(topic, expect=len(names) + 1)
    assert Counter(bodies(pulled)) == Counter([*names, "seed"])
    assert_queue_offsets_contiguous(pulled)


def test_send_orderly_puts_each_key_on_one_queue(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppOrderly")
    producer = cpp.producer()
    sent = [(key, seq) for seq in range(5) for key in range(QUEUES)]
    for key, seq in sent:
        producer.send(topic, f"order-{key}-{seq}", mode="orderly", arg=key)
    producer.stop()

    pulled = cpp.pull(topic, expect=len(sent))
    assert sorted(bodies(pulled)) == sorted(f"order-{key}-{seq}" for key, seq in sent)
    queue_of_key: dict[int, set[int]] = defaultdict(set)
    for event in pulled:
        queue_of_key[int(event["body"].split("-")[1])].add(event["queue_id"])
    assert all(len(queues) == 1 for queues in queue_of_key.values()), queue_of_key
    assert len({next(iter(queues)) for queues in queue_of_key.values()}) == QUEUES
    # Within a queue, the stored order is the send order.
    by_queue: dict[int, list[Event]] = defaultdict(list)
    for event in pulled:
        by_queue[event["queue_id"]].append(event)
    for events in by_queue.values():
        in_offset_order = sorted(events, key=lambda event: event["queue_offset"])
        assert [int(event["body"].split("-")[2]) for event in in_offset_order] == list(range(5))


def test_send_batch_is_split_into_messages(cpp: Any, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("CppBatch")
    producer = cpp.producer()
    producer.send(topic, "seed")
    small = [{"body": f"batch-{i}", "tags": "TagB", "keys": f"bk{i}"} for i in range(5)]
    # Over the client's 4 KiB threshold: the C++ client zlib-compresses the batch as a whole.
    large = [{"body": f"big-{i}-" + "x" * 3000, "tags": "TagC"} for i in range(3)]
    for messages in (small, large):
        result = producer.result(producer.request({"op": "batch", "topic": topic,
                                                   "messages": messages}))  # fmt: skip
        assert result["event"] == "sent", result
        assert result["status"] == 0
    producer.stop()

    pulled = cpp.pull(topic, expect=1 + len(small) + len(large))
    expected = ["seed", *(spec["body"] for spec in small), *(spec["body"] for spec in large)]
    assert Counter(bodies(pulled)) == Counter(expected)
    by_body = {event["body"]: event for event in pulled}
    assert [by_body[spec["body"]]["tags"] for spec in small] == ["TagB"] * len(small)
    assert [by_body[spec["body"]]["keys"] for spec in small] == [spec["keys"] for spec in small]
    assert [by_body[spec["body"]]["tags"] for spec in large] == ["TagC"] * len(large)
    assert_queue_offsets_contiguous(pulled)


def test_large_body_is_compressed_and_read_back(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppLarge")
    body = "".join(f"{i:06d}" for i in range(5000))  # 30 000 bytes, over the 4 KiB threshold.
    producer = cpp.producer()
    producer.send(topic, body)
    producer.stop()
    pulled = cpp.pull(topic, expect=1)
    assert bodies(pulled) == [body]


# --- push consumers ---------------------------------------------------------------------------


def test_push_clustering_receives_messages_produced_before_it_started(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppPush")
    names = [f"push-{i}" for i in range(12)]
    producer = cpp.producer()
    produce(producer, topic, names)
    producer.stop()

    consumer = cpp.push(unique_name("CG"), topic)
    events = consumer.wait_for(received_all(set(names)), DELIVERY_TIMEOUT_S, "all messages")
    consumer.stop()
    received = [event for event in events if event["event"] == "received"]
    assert Counter(bodies(received)) == Counter(names)
    assert {event["reconsume_times"] for event in received} == {0}


def test_push_tag_expression_selects_only_those_tags(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppTags")
    tags = ["TagA", "TagB", "TagC"]
    sent = [(f"tagged-{i}", tags[i % 3]) for i in range(15)]
    producer = cpp.producer()
    for name, tag in sent:
        producer.send(topic, name, tags=tag)
    producer.stop()
    wanted = {name for name, tag in sent if tag in ("TagA", "TagB")}
    unwanted = {name for name, tag in sent if tag == "TagC"}

    consumer = cpp.push(unique_name("CG"), topic, "TagA || TagB")
    consumer.wait_for(received_all(wanted), DELIVERY_TIMEOUT_S, "TagA and TagB messages")
    consumer.stop()
    # A TagC message delivered at all would sit before the last TagA/TagB one of its queue.
    received = consumer.received()
    assert Counter(bodies(received)) == Counter(wanted)
    assert {event["tags"] for event in received} == {"TagA", "TagB"}

    pulled = cpp.pull(topic, expect=len(unwanted), expr="TagC")
    assert sorted(bodies(pulled)) == sorted(unwanted)


def test_push_broadcasting_delivers_every_message_to_every_consumer(
    tidemq: Any, cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppBroadcast")
    group = unique_name("BG")
    producer = cpp.producer()
    producer.send(topic, "seed")
    queues = tidemq.queue_count(topic)
    consumers = [cpp.push(group, topic, model="broadcasting") for _ in range(2)]
    probe_until_settled(producer, consumers, topic, queues, every_consumer_got_every_probe)

    names = [f"broadcast-{i}" for i in range(10)]
    produce(producer, topic, names)
    for consumer in consumers:
        consumer.wait_for(received_all(set(names)), DELIVERY_TIMEOUT_S, "all broadcast messages")
    producer.stop()
    for consumer in consumers:
        consumer.stop()
        assert Counter(real_bodies(consumer)) == Counter(names)


Settled = Callable[[list[list[str]], list[str]], bool]


def every_consumer_got_every_probe(received: list[list[str]], probes: list[str]) -> bool:
    """Broadcasting is settled when each consumer sees each queue's probe."""
    return all(set(probes) <= set(bodies_of_one) for bodies_of_one in received)


def each_probe_went_to_one_consumer(received: list[list[str]], probes: list[str]) -> bool:
    """Clustering is settled when the queues are split: every consumer owns some, none shared."""
    owners = [sum(probe in bodies_of_one for bodies_of_one in received) for probe in probes]
    busy = [any(probe in bodies_of_one for probe in probes) for bodies_of_one in received]
    return owners == [1] * len(probes) and all(busy)


def probe_until_settled(
    producer: Any, consumers: list[Any], topic: str, queues: int, settled: Settled
) -> None:
    """Sends one probe to every queue per round until a round's probes arrived as `settled` says.

    Orderly sends pick queue `arg % queue count`, so probe-<q>-<round> lands on queue q.
    """
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    for round_number in range(10**6):
        probes = [f"probe-{queue}-{round_number}" for queue in range(queues)]
        for queue, probe in enumerate(probes):
            producer.send(topic, probe, mode="orderly", arg=queue)
        round_deadline = time.monotonic() + PROBE_ROUND_S
        while time.monotonic() < round_deadline:
            if settled([bodies(consumer.received()) for consumer in consumers], probes):
                return
            time.sleep(PROBE_POLL_S)
        if time.monotonic() > deadline:
            pytest.fail(f"consumers never settled on {topic}\n"
                        + "\n".join(consumer.diagnostics() for consumer in consumers))  # fmt: skip


def real_bodies(consumer: Any) -> list[str]:
    """What a consumer received apart from the seed that created the topic and the probes."""
    return [
        body
        for body in bodies(consumer.received())
        if body != "seed" and not body.startswith("probe-")
    ]


def test_push_clustering_splits_queues_between_consumers_of_a_group(
    tidemq: Any, cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppShare")
    group = unique_name("SG")
    producer = cpp.producer()
    producer.send(topic, "seed")
    queues = tidemq.queue_count(topic)
    consumers = [cpp.push(group, topic) for _ in range(2)]
    # The second consumer's heartbeat makes the broker notify the first, which gives up half of
    # its queues; probes show when that hand-over has finished.
    probe_until_settled(producer, consumers, topic, queues, each_probe_went_to_one_consumer)

    names = [f"share-{i}" for i in range(16)]
    produce(producer, topic, names)
    producer.stop()

    def union_complete(_: list[Event]) -> bool:
        return set(names) <= {body for consumer in consumers for body in real_bodies(consumer)}

    consumers[0].wait_for(union_complete, DELIVERY_TIMEOUT_S, "every message by some consumer")
    for consumer in consumers:
        consumer.stop()
    got = [real_bodies(consumer) for consumer in consumers]
    assert Counter(got[0] + got[1]) == Counter(names)  # Each message exactly once overall.
    assert got[0]
    assert got[1]
    queues_of = [
        {event["queue_id"] for event in consumer.received() if event["body"] in names}
        for consumer in consumers
    ]
    assert not queues_of[0] & queues_of[1], queues_of


def test_orderly_push_consumer_preserves_order_per_queue(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppOrderlyPush")
    sequence_length = 6
    sent = [(key, seq) for seq in range(sequence_length) for key in range(QUEUES)]
    producer = cpp.producer()
    for key, seq in sent:
        producer.send(topic, f"order-{key}-{seq}", mode="orderly", arg=key)
    producer.stop()

    consumer = cpp.push(unique_name("OG"), topic, orderly=True)
    wanted = {f"order-{key}-{seq}" for key, seq in sent}
    consumer.wait_for(received_all(wanted), DELIVERY_TIMEOUT_S, "all ordered messages")
    consumer.stop()
    received = consumer.received()
    assert Counter(bodies(received)) == Counter(wanted)
    arrival: dict[int, list[int]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    for event in received:
        arrival[int(event["body"].split("-")[1])].append(int(event["body"].split("-")[2]))
        offsets[event["queue_id"]].append(event["queue_offset"])
    assert all(seqs == list(range(sequence_length)) for seqs in arrival.values()), arrival
    assert all(seen == sorted(seen) for seen in offsets.values()), offsets


def test_consumer_group_restart_resumes_from_committed_offsets(
    cpp: Any, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("CppResume")
    group = unique_name("RG")
    first = [f"first-{i}" for i in range(8)]
    second = [f"second-{i}" for i in range(8)]
    producer = cpp.producer()
    produce(producer, topic, first)

    consumer = cpp.push(group, topic)
    consumer.wait_for(received_all(set(first)), DELIVERY_TIMEOUT_S, "first batch")
    consumer.stop()  # shutdown() commits the offsets of everything consumed.
    assert Counter(bodies(consumer.received())) == Counter(first)

    produce(producer, topic, second)
    producer.stop()
    restarted = cpp.push(group, topic)
    restarted.wait_for(received_all(set(second)), DELIVERY_TIMEOUT_S, "second batch")
    restarted.stop()
    # Round-robin sends put second-batch messages on every queue, and a queue is consumed in
    # offset order, so any re-delivered first-batch message would have arrived before these.
    assert Counter(bodies(restarted.received())) == Counter(second)
