"""put_each (the single sends of one loop turn, any topics and queues, each checked alone) must
leave the store byte for byte as the same messages put one at a time with put_message: commit
log, consume queues, index files and dispatch events, across segment rollovers; and each record
must decode to its message, with the queue offsets a plain model of the queues gives (the bytes
of a record: tests/protocol/test_record.py)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import Opener, fail_second_segment, message, stored_as

from tidemq.protocol.message import SysFlag
from tidemq.store import FileMessageStore, MessageToStore
from tidemq.store.types import DispatchEvent, PutStatus

_PROPS = st.dictionaries(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a"]),
    st.text(alphabet="abcXYZ 19", min_size=1, max_size=8),
)
_MESSAGE = st.tuples(
    st.sampled_from(["TopicA", "TopicB", "%RETRY%g"]),
    st.integers(min_value=0, max_value=2),  # queue id
    st.binary(max_size=700),
    _PROPS,
    st.sampled_from([0, 0, 0, SysFlag.PREPARED, SysFlag.ROLLBACK]),
    st.sampled_from([None, None, 42]),  # explicit tags code
    st.booleans(),  # a split point: a new put_each call starts after this message
)


def _message(n: int, spec: tuple[Any, ...]) -> MessageToStore:
    topic, queue_id, body, props, sys_flag, tags_code, _ = spec
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=body,
        flag=n % 5,
        properties="".join(f"{k}\x01{v}\x02" for k, v in props.items()),
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + n,
        born_host=("127.0.0.1", 40000 + n),
        store_host=("10.0.0.7", 10911),
        reconsume_times=n % 3,
        tags_code=tags_code,
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every data file of a store (not the checkpoint, written with the wall clock's time)."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in ("checkpoint", "abort")
    }


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=st.lists(_MESSAGE, min_size=1, max_size=30))
def test_put_each_leaves_what_single_puts_leave(
    opener: Opener, specs: list[tuple[Any, ...]]
) -> None:
    number = len(opener.opened)
    single = opener.open(opener.base / f"single{number}")
    grouped = opener.open(opener.base / f"grouped{number}")
    single_events: list[DispatchEvent] = []
    grouped_events: list[DispatchEvent] = []
    single.add_dispatch_listener(single_events.append)
    grouped.add_dispatch_listener(grouped_events.append)
    msgs = [_message(n, spec) for n, spec in enumerate(specs)]
    expected = [single.put_message(m) for m in msgs]
    got = []
    group: list[MessageToStore] = []
    for msg, spec in zip(msgs, specs, strict=True):
        group.append(msg)
        if spec[-1]:
            got += grouped.put_each(group)
            group = []
    got += grouped.put_each(group)
    assert got == expected
    assert all(r.ok for r in got)
    assert grouped_events == single_events
    next_offsets: dict[tuple[str, int], int] = {}
    for msg, result in zip(msgs, got, strict=True):
        in_queue = msg.sys_flag not in (SysFlag.PREPARED, SysFlag.ROLLBACK)
        queue_offset = 0
        if in_queue:
            queue_offset = next_offsets.get((msg.topic, msg.queue_id), 0)
            next_offsets[(msg.topic, msg.queue_id)] = queue_offset + 1
        properties = msg.properties
        if msg.tags_code is not None:
            properties += f"__TAGSCODE#\x01{msg.tags_code}\x02"
        record = stored_as(
            grouped.read_record(result.physical_offset), msg, result, queue_offset, properties
        )
        assert result.queue_offset == queue_offset
        if in_queue:
            pulled = grouped.get_messages(msg.topic, msg.queue_id, queue_offset, 1)
            assert pulled.records == [record]
    for (topic, queue_id), count in next_offsets.items():
        assert grouped.max_offset(topic, queue_id) == count
    single.flush()
    grouped.flush()
    assert _files(grouped.config.root_dir) == _files(single.config.root_dir)


def test_a_refusal_answers_only_its_message(opener: Opener) -> None:
    store = opener.open(message_size_max=1000)
    msgs = [
        message(0),
        message(1, body=b"x" * 1001),  # too big
        message(2, topic="T" * 300),  # topic too long
        message(3, properties="p\x01" + "v" * 40_000 + "\x02"),  # properties too big
        message(4, born_host=("not-an-ip", 1)),
        message(5, topic="Other", queue_id=3),
        message(6),
    ]
    results = store.put_each(msgs)
    assert [r.status for r in results] == [
        PutStatus.PUT_OK,
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.PUT_OK,
        PutStatus.PUT_OK,
    ]
    assert [results[n].queue_offset for n in (0, 5, 6)] == [0, 0, 1]
    assert store.max_offset("T", 0) == 2
    assert store.max_offset("Other", 3) == 1


def test_a_store_that_is_not_writable_refuses_all(opener: Opener) -> None:
    store = opener.open()
    store.shutdown()
    results = store.put_each([message(0), message(1)])
    assert {r.status for r in results} == {PutStatus.SERVICE_NOT_AVAILABLE}
    assert store.put_each([]) == []


def test_io_error_fails_the_rest_only(opener: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store: FileMessageStore = opener.open()
    fail_second_segment(store, monkeypatch, errno.ENOSPC)
    msgs = [message(n, body=b"y" * 600, queue_id=n % 2) for n in range(12)]
    results = store.put_each(msgs)
    written = [r for r in results if r.ok]
    assert 0 < len(written) < len(msgs)
    assert results[: len(written)] == written
    assert {r.status for r in results[len(written) :]} == {PutStatus.SERVICE_NOT_AVAILABLE}
    assert store.max_offset("T", 0) + store.max_offset("T", 1) == len(written)
