"""Queue allocation for clustering consumers: pure functions, no I/O.

Every consumer of a group runs the same function over the same inputs (the topic's readable queues
and the group's consumer ids, both fetched independently and sorted here), so they agree on who
owns which queue without talking to each other. A queue owned by nobody is never read; a queue
owned twice is read twice; the property tests in tests/client/test_rebalance.py check neither
happens.

Averagely (RocketMQ's AllocateMessageQueueAveragely, the default of every client):

    8 queues, 3 consumers:  c0 → q0 q1 q2 | c1 → q3 q4 q5 | c2 → q6 q7
    2 queues, 3 consumers:  c0 → q0       | c1 → q1       | c2 → (none)

Contiguous ranges, the first `len(queues) % len(consumers)` consumers taking one extra queue. The
same split as the Java and C++ clients, so a TideMQ consumer can share a group with them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol, TypeVar


class _Sortable(Hashable, Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


Q = TypeVar("Q", bound=_Sortable)

AllocateStrategy = Callable[[str, Sequence[Q], Sequence[str]], list[Q]]


def allocate_averagely(
    current_id: str, queues: Iterable[Q], consumer_ids: Iterable[str]
) -> list[Q]:
    """The contiguous share of `queues` that `current_id` owns (empty if it is not in the list)."""
    ordered_queues = sorted(set(queues))
    ordered_ids = sorted(set(consumer_ids))
    if not ordered_queues or current_id not in ordered_ids:
        return []
    index = ordered_ids.index(current_id)
    base, extra = divmod(len(ordered_queues), len(ordered_ids))
    start = index * base + min(index, extra)
    count = base + (1 if index < extra else 0)
    return ordered_queues[start : start + count]


def allocate_by_circle(
    current_id: str, queues: Iterable[Q], consumer_ids: Iterable[str]
) -> list[Q]:
    """Round-robin share: queue i goes to consumer i mod n (RocketMQ's AveragelyByCircle)."""
    ordered_queues = sorted(set(queues))
    ordered_ids = sorted(set(consumer_ids))
    if not ordered_queues or current_id not in ordered_ids:
        return []
    index = ordered_ids.index(current_id)
    return ordered_queues[index :: len(ordered_ids)]


def diff_assignment(old: Iterable[Q], new: Iterable[Q]) -> tuple[list[Q], list[Q]]:
    """(added, removed), each sorted: what a rebalance must start pulling and must drop."""
    old_set, new_set = set(old), set(new)
    return sorted(new_set - old_set), sorted(old_set - new_set)
