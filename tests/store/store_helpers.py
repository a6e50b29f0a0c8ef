"""Shared helpers for store tests: tiny segments so every test crosses rollovers."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.clock import FakeClock
from tidemq.protocol import record as rec
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig
from tidemq.store.types import PutResult

SEGMENT_BYTES = 4096
CQ_ENTRIES = 16


def make_config(root: Path, **overrides: object) -> StoreConfig:
    values: dict[str, object] = {
        "root_dir": root,
        "commit_log_file_size": SEGMENT_BYTES,
        "consume_queue_file_entries": CQ_ENTRIES,
        "index_slot_count": 32,
        "index_entry_count": 64,
    }
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


def message(
    i: int,
    *,
    topic: str = "T",
    queue_id: int = 0,
    tags: str | None = None,
    keys: str | None = None,
    body: bytes | None = None,
    **extra: object,
) -> MessageToStore:
    props = ""
    if tags is not None:
        props += f"TAGS\x01{tags}\x02"
    if keys is not None:
        props += f"KEYS\x01{keys}\x02"
    props += f"UNIQ_KEY\x01U{i:08d}\x02"
    msg = MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=body if body is not None else f"body-{i}-".encode() * (1 + i % 7),
        flag=0,
        properties=props,
        sys_flag=0,
        born_timestamp=1_700_000_000_000 + i,
        born_host=("127.0.0.1", 40000),
        store_host=("10.0.0.7", 10911),
    )
    for name, value in extra.items():
        setattr(msg, name, value)
    return msg


def stored_as(
    record: bytes,
    msg: MessageToStore,
    result: PutResult,
    queue_offset: int,
    properties: str | None = None,
) -> bytes:
    """Assert that `record` is `msg` stored as `result` says, at `queue_offset`: it decodes
    (whole-record CRC required) to the message's fields, and its properties are the message's
    (or `properties`, a stored extra), separator-terminated, then the CRC pair. Returns `record`.
    The exact bytes of a record are pinned in tests/protocol/test_record.py."""
    m = rec.decode_record(record, require_crc=True)
    assert (m.topic, m.queue_id, m.body, m.flag, m.sys_flag, m.reconsume_times) == (
        msg.topic,
        msg.queue_id,
        msg.body,
        msg.flag,
        msg.sys_flag,
        msg.reconsume_times,
    )
    assert (m.born_timestamp, m.born_host, m.store_host, m.prepared_transaction_offset) == (
        msg.born_timestamp,
        msg.born_host,
        msg.store_host,
        msg.prepared_transaction_offset,
    )
    assert (m.total_size, m.physical_offset, m.queue_offset, m.store_timestamp) == (
        result.size,
        result.physical_offset,
        queue_offset,
        result.store_timestamp,
    )
    text = msg.properties if properties is None else properties
    if text and not text.endswith("\x02"):
        text += "\x02"
    assert m.properties[: -rec.CRC_DIGITS_LEN] == text + "__CRC32#\x01"
    assert len(record) == result.size
    return record


class Opener:
    """Opens stores on directories and closes whatever is still open at the end."""

    def __init__(self, base: Path):
        self.base = base
        self.clock = FakeClock()
        self.opened: list[FileMessageStore] = []

    def open(self, root: Path | None = None, **overrides: object) -> FileMessageStore:
        store = FileMessageStore(make_config(root or self.base / "store", **overrides), self.clock)
        store.start()
        self.opened.append(store)
        return store

    def crash_copy(self, store: FileMessageStore, name: str) -> Path:
        """The directory as a kill -9 would leave it: page cache content, abort file present."""
        target = self.base / name
        shutil.copytree(store.config.root_dir, target)
        return target

    def close_all(self) -> None:
        for store in self.opened:
            store.shutdown()


@pytest.fixture
def opener(tmp_path: Path) -> Iterator[Opener]:
    o = Opener(tmp_path)
    yield o
    o.close_all()


def fill(store: FileMessageStore, count: int, **kwargs: object) -> list[int]:
    offsets = []
    for i in range(count):
        result = store.put_message(message(i, **kwargs))  # type: ignore[arg-type]
        assert result.ok, result
        offsets.append(result.physical_offset)
    return offsets


def bodies(store: FileMessageStore, topic: str = "T", queue_id: int = 0) -> list[bytes]:
    from tidemq.protocol.record import decode_records

    out: list[bytes] = []
    offset = store.min_offset(topic, queue_id)
    while True:
        got = store.get_messages(topic, queue_id, offset, 32)
        if not got.records:
            return out
        out.extend(m.body for m in decode_records(b"".join(got.records)))
        offset = got.next_begin_offset


Fill = Callable[..., list[int]]


def fail_second_segment(store: FileMessageStore, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Make the store's second `segment_for` call raise OSError(`err`): the rollover to the
    second segment fails, after the first run is written."""
    log = store._log
    real = log.segment_for
    calls = 0

    def failing_segment_for(size: int) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(err, "injected")
        return real(size)

    monkeypatch.setattr(log, "segment_for", failing_segment_for)
