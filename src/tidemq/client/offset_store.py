"""Consumer offsets: where each queue's consumption stands, and where it is kept.

The stored value is always the NEXT offset to consume (RocketMQ's convention). Two homes:

- clustering: the broker that owns the queue (QUERY_CONSUMER_OFFSET 14 / UPDATE_CONSUMER_OFFSET
  15), shared by the whole group;
- broadcasting: a local JSON file, since every consumer reads every queue on its own:

      {"offsetTable": [{"topic": "T", "brokerName": "broker-a", "queueId": 0, "offset": 42}, ...]}

  written atomically (temporary file + rename) so a crash leaves the old or the new table.

`OffsetTable` is the in-memory part both share: monotonic updates (a late acknowledgement of an
old message must not move the offset back) and a dirty set so a commit round sends only what
changed since the last one, plus every queue at shutdown.

How a queue's first offset is chosen when nothing is stored (`initial_offset_rule`, §4.3):

    consume_from_where        normal topic         retry topic (%RETRY%group)
    LAST_OFFSET (and the      max offset           0
      deprecated 1, 2, 3)
    FIRST_OFFSET              0                    0
    TIMESTAMP                 offset at the time   max offset
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue

logger = logging.getLogger(__name__)


class InitialOffset(enum.Enum):
    ZERO = "ZERO"
    MAX = "MAX"
    BY_TIMESTAMP = "BY_TIMESTAMP"


def initial_offset_rule(where: pm.ConsumeFromWhere, topic: str) -> InitialOffset:
    """Where a queue with no stored offset starts (see the table in the module docstring)."""
    retry = pm.is_retry_topic(topic)
    if where is pm.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
        return InitialOffset.ZERO
    if where is pm.ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
        return InitialOffset.MAX if retry else InitialOffset.BY_TIMESTAMP
    return InitialOffset.ZERO if retry else InitialOffset.MAX


class OffsetTable:
    """Next offset to consume per queue, with the set changed since the last `take_dirty`."""

    def __init__(self) -> None:
        self._offsets: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    def get(self, mq: MessageQueue) -> int | None:
        return self._offsets.get(mq)

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record `offset`; with `increase_only`, a lower value than the current one is ignored."""
        if offset < 0:
            return
        current = self._offsets.get(mq)
        if current is not None and (current == offset or (increase_only and offset < current)):
            return
        self._offsets[mq] = offset
        self._dirty.add(mq)

    def remove(self, mq: MessageQueue) -> None:
        self._offsets.pop(mq, None)
        self._dirty.discard(mq)

    def take_dirty(self) -> dict[MessageQueue, int]:
        """The entries changed since the last call (and forget that they changed)."""
        dirty = {mq: self._offsets[mq] for mq in self._dirty if mq in self._offsets}
        self._dirty.clear()
        return dirty

    def mark_dirty(self, mqs: Iterable[MessageQueue]) -> None:
        self._dirty.update(mq for mq in mqs if mq in self._offsets)

    def items(self) -> dict[MessageQueue, int]:
        return dict(self._offsets)


def encode_offset_file(offsets: dict[MessageQueue, int]) -> bytes:
    entries = [
        {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": offset}
        for mq, offset in sorted(offsets.items())
    ]
    return json.dumps({"offsetTable": entries}, indent=1).encode()


def decode_offset_file(data: bytes) -> dict[MessageQueue, int]:
    """Parse the file; raises ValueError on a malformed one."""
    try:
        document = json.loads(data)
        return {
            MessageQueue(
                topic=str(e["topic"]), broker_name=str(e["brokerName"]), queue_id=int(e["queueId"])
            ): int(e["offset"])
            for e in document["offsetTable"]
        }
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed offset file: {exc}") from None


class LocalOffsetFile:
    """The broadcasting consumer's offsets in `<dir>/<instance name>/<group>/offsets.json`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_group(cls, base_dir: Path, instance_name: str, group: str) -> LocalOffsetFile:
        return cls(base_dir / _safe(instance_name) / _safe(group) / "offsets.json")

    def load(self) -> dict[MessageQueue, int]:
        """The stored table (empty if there is no file; a corrupt file is logged and ignored)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            return decode_offset_file(data)
        except ValueError:
            logger.exception("ignoring unreadable offset file %s", self.path)
            return {}

    def save(self, offsets: dict[MessageQueue, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        with temporary.open("wb") as out:
            out.write(encode_offset_file(offsets))
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.path)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.%" else "_" for c in name)
