"""put_messages writes a batch in one pass per segment; each record must decode to its message
at the offsets its result names (the bytes of a record: tests/protocol/test_record.py), across
commit-log, consume-queue and index-file rollovers, and dispatch must match too."""

from __future__ import annotations

import errno

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import Opener, fail_second_segment, stored_as

from tidemq.protocol import record as rec
from tidemq.protocol.message import SysFlag, decode_properties, tag_code
from tidemq.store import MessageToStore
from tidemq.store.types import DispatchEvent, PutStatus

_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
_PROPS = st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "b"]), _TEXT)
_MESSAGE = st.tuples(
    st.binary(max_size=600),
    _PROPS,
    st.sampled_from([0, SysFlag.PREPARED, SysFlag.COMMIT, SysFlag.ROLLBACK]),
    st.booleans(),  # pass a parsed map
    st.integers(min_value=0, max_value=2**31 - 1),  # flag
)


def _messages(specs: list[tuple[bytes, dict[str, str], int, bool, int]]) -> list[MessageToStore]:
    out = []
    for n, (body, props, sys_flag, give_parsed, flag) in enumerate(specs):
        text = "".join(f"{k}\x01{v}\x02" for k, v in props.items())
        out.append(
            MessageToStore(
                topic="Batch",
                queue_id=1,
                body=body,
                flag=flag,
                properties=text,
                sys_flag=sys_flag,
                born_timestamp=1_700_000_000_000 + n,
                born_host=("127.0.0.1", 40000 + n),
                store_host=("10.0.0.7", 10911),
                reconsume_times=n % 3,
                parsed=(text, decode_properties(text)) if give_parsed else None,
            )
        )
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.lists(_MESSAGE, min_size=1, max_size=12), min_size=1, max_size=4))
def test_batch_records_decode_to_their_messages(
    opener: Opener, batches: list[list[tuple[bytes, dict[str, str], int, bool, int]]]
) -> None:
    store = opener.open(opener.base / f"s{len(opener.opened)}")
    events: list[DispatchEvent] = []
    store.add_dispatch_listener(events.append)
    queue_offset = 0
    for specs in batches:
        messages = _messages(specs)
        results = store.put_messages(messages)
        assert all(r.ok for r in results)
        for msg, result in zip(messages, results, strict=True):
            in_queue = msg.sys_flag & SysFlag.TRANSACTION_MASK not in (
                SysFlag.PREPARED,
                SysFlag.ROLLBACK,
            )
            record = store.read_record(result.physical_offset)
            expected = stored_as(record, msg, result, queue_offset if in_queue else 0)
            assert result.queue_offset == (queue_offset if in_queue else 0)
            if in_queue:
                got = store.get_messages("Batch", 1, queue_offset, 1)
                assert got.records == [expected]
                event = events.pop(0)
                assert (event.queue_offset, event.physical_offset, event.size) == (
                    queue_offset,
                    result.physical_offset,
                    result.size,
                )
                assert event.tags_code == tag_code(decode_properties(msg.properties).get("TAGS"))
                queue_offset += 1
            uniq = decode_properties(msg.properties).get("UNIQ_KEY")
            if uniq and msg.sys_flag & SysFlag.TRANSACTION_MASK != SysFlag.ROLLBACK:
                found = store.query_by_key("Batch", uniq, 64, 0, 2**62)
                assert expected in found
    assert not events
    assert store.max_offset("Batch", 1) == queue_offset


def test_stale_parsed_map_is_not_trusted(opener: Opener) -> None:
    store = opener.open()
    events: list[DispatchEvent] = []
    store.add_dispatch_listener(events.append)
    text = "TAGS\x01real\x02"
    msg = MessageToStore(
        topic="T",
        queue_id=0,
        body=b"x",
        flag=0,
        properties=text,
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
        # Decoded from another string: the store must decode `properties` itself.
        parsed=("TAGS\x01stale\x02", {"TAGS": "stale"}),
    )
    assert store.put_message(msg).ok
    assert events[0].properties == {"TAGS": "real"}
    assert events[0].tags_code == tag_code("real")


def test_io_error_in_a_later_segment_keeps_earlier_runs_dispatched(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener.open()
    fail_second_segment(store, monkeypatch, errno.EIO)
    batch = _messages([(b"x" * 600, {"UNIQ_KEY": f"u{n}"}, 0, False, 0) for n in range(12)])
    results = store.put_messages(batch)
    written = [r for r in results if r.ok]
    assert 0 < len(written) < len(batch)
    assert results[: len(written)] == written
    assert {r.status for r in results[len(written) :]} == {PutStatus.UNKNOWN_ERROR}
    assert store.max_offset("Batch", 1) == len(written)
    got = store.get_messages("Batch", 1, 0, 32)
    assert [rec.decode_record(r).physical_offset for r in got.records] == [
        r.physical_offset for r in written
    ]
