"""Dispatch listeners with a topic filter: they see exactly the events an unfiltered listener
sees for the topics they want, the filter is asked once per topic per put, and a record no
listener wants costs no event at all."""

from __future__ import annotations

import pytest
from store_helpers import Opener, message

from tidemq.store import FileMessageStore, append
from tidemq.store.types import DispatchEvent

_TOPICS = ["A", "B", "%RETRY%g", "A", "A", "B"]


def _puts(store: FileMessageStore) -> None:
    """put_each over mixed topics and queues, a batch, and single puts (across rollovers)."""
    msgs = [message(i, topic=t, queue_id=i % 2) for i, t in enumerate(_TOPICS * 20)]
    assert all(r.ok for r in store.put_each(msgs[:60]))
    assert all(r.ok for r in store.put_messages([message(i, topic="A") for i in range(30)]))
    for msg in msgs[60:]:
        assert store.put_message(msg).ok


def test_a_filtered_listener_sees_what_an_unfiltered_one_sees_of_its_topics(
    opener: Opener,
) -> None:
    store = opener.open()
    everything: list[DispatchEvent] = []
    only_a: list[DispatchEvent] = []
    asked: list[str] = []

    def wants(topic: str) -> bool:
        asked.append(topic)
        return topic == "A"

    store.add_dispatch_listener(everything.append)
    store.add_dispatch_listener(only_a.append, wants)
    _puts(store)
    assert {e.topic for e in everything} == {"A", "B", "%RETRY%g"}
    assert only_a == [e for e in everything if e.topic == "A"]
    assert set(asked) == {"A", "B", "%RETRY%g"}
    # Once per topic per put call (and per segment run at most), not per record.
    asked.clear()
    small = [message(i, topic=t, body=b"x") for i, t in enumerate(_TOPICS * 2)]
    assert all(r.ok for r in store.put_each(small))
    # 12 records over at most two segment runs: at most 3 topics x 2 runs questions.
    assert set(asked) == {"A", "B", "%RETRY%g"}
    assert len(asked) <= 6 < len(small)


def test_a_filter_that_raises_lets_the_listener_see_everything(opener: Opener) -> None:
    store = opener.open()
    everything: list[DispatchEvent] = []
    seen: list[DispatchEvent] = []

    def broken(topic: str) -> bool:
        raise RuntimeError("filter bug")

    store.add_dispatch_listener(everything.append)
    store.add_dispatch_listener(seen.append, broken)
    _puts(store)
    assert seen == everything


def test_no_event_is_built_when_no_listener_wants_the_topic(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener.open()
    seen: list[DispatchEvent] = []
    store.add_dispatch_listener(seen.append, lambda topic: topic == "Nobody")

    def no_event(*args: object) -> DispatchEvent:
        raise AssertionError("an event was built for a topic nobody wants")

    monkeypatch.setattr(append, "DispatchEvent", no_event)
    _puts(store)
    assert seen == []
    assert store.get_messages("A", 0, 0, 10).records  # the records are stored and dispatched
