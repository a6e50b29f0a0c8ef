"""Allocation is the contract every consumer of a group relies on: each queue read exactly once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.client.rebalance import allocate_averagely, allocate_by_circle, diff_assignment
from tidemq.protocol.bodies import MessageQueue

queue_sets = st.lists(
    st.builds(
        MessageQueue,
        topic=st.just("T"),
        broker_name=st.sampled_from(["broker-a", "broker-b", "broker-c"]),
        queue_id=st.integers(0, 15),
    ),
    max_size=40,
    unique=True,
)
consumer_sets = st.lists(
    st.text("abcdef0123456789@#.", min_size=1, max_size=8), min_size=1, max_size=12, unique=True
)


@given(queue_sets, consumer_sets, st.randoms())
def test_every_queue_assigned_exactly_once_and_balanced(queues, consumers, rnd):
    shares = {}
    for cid in consumers:
        # Each consumer sees the lists in its own order: the result must not depend on it.
        q, c = list(queues), list(consumers)
        rnd.shuffle(q)
        rnd.shuffle(c)
        shares[cid] = allocate_averagely(cid, q, c)
    assigned = [mq for share in shares.values() for mq in share]
    assert sorted(assigned) == sorted(queues)
    sizes = [len(share) for share in shares.values()]
    assert max(sizes) - min(sizes) <= 1
    # Contiguous ranges in sorted order, earlier consumers first (the Java/C++ split).
    ordered = [mq for cid in sorted(consumers) for mq in shares[cid]]
    assert ordered == sorted(queues)


@given(queue_sets, consumer_sets)
def test_by_circle_assigns_each_queue_once(queues, consumers):
    assigned = [mq for cid in consumers for mq in allocate_by_circle(cid, queues, consumers)]
    assert sorted(assigned) == sorted(queues)


def q(i: int) -> MessageQueue:
    return MessageQueue("T", "broker-a", i)


def test_known_splits():
    queues = [q(i) for i in range(8)]
    assert allocate_averagely("c0", queues, ["c1", "c0", "c2"]) == [q(0), q(1), q(2)]
    assert allocate_averagely("c1", queues, ["c1", "c0", "c2"]) == [q(3), q(4), q(5)]
    assert allocate_averagely("c2", queues, ["c1", "c0", "c2"]) == [q(6), q(7)]
    two = [q(0), q(1)]
    assert allocate_averagely("c2", two, ["c0", "c1", "c2"]) == []
    assert allocate_averagely("c1", two, ["c0", "c1", "c2"]) == [q(1)]


def test_unknown_consumer_or_no_queue_gets_nothing():
    assert allocate_averagely("x", [q(0)], ["a", "b"]) == []
    assert allocate_averagely("a", [], ["a"]) == []


def test_diff_assignment():
    added, removed = diff_assignment([q(0), q(1)], [q(1), q(2), q(3)])
    assert added == [q(2), q(3)]
    assert removed == [q(0)]
