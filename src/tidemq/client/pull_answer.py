"""A PULL_MESSAGE answer turned into a PullResult, delivering every record that can be decoded.

One stored record the client cannot turn into a MessageExt (a COMPRESSED body that is not zlib
data, a CRC mismatch, a broken header...) must not stop the messages behind it: otherwise every
pull covering its offset fails, the push consumer retries that offset forever and the queue stands
still for every group. So the decoder walks the body record by record:

    body:  | record 7 ok | record 8 bad CRC | record 9 ok |       framing intact
           → messages [7, 9], undecodable [8], next_begin_offset from the header (10)

    body:  | record 7 ok | garbage (bad magic or size) ...         framing broken at 8
           → messages [7], next_begin_offset 8 (re-pulled; nothing after 7 is given up)

    body:  | garbage ...                                            framing broken at once
           → with max_nums 1: that one record is undecodable, next_begin_offset from the header
           → with max_nums > 1: None, and api.pull asks again for one message at that offset

Our choice for an undecodable record is to skip it, not to hand it to the listener flagged:
listeners are written for MessageExt with a body, and a record whose header may be corrupt has no
trustworthy topic or id to hand over. The skip is visible: it is in `PullResult.undecodable`,
counted by the consumer (`undecodable_count`) and logged by `UndecodableLog` (rate-limited). Past
the skip the offset moves on as for a filtered message, so the group commits past it.
(The Java client stops decoding at such a record and silently drops the rest of the batch.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError, error_for_code
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import PullMessageResponseHeader
from tidemq.protocol.record import decode_record, queue_offset_at, record_size_at

from .message import MessageExt, PullResult, PullStatus, UndecodableMessage

logger = logging.getLogger(__name__)

_PULL_STATUS: Final[dict[int, PullStatus]] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}

# One warning line per consumer per this interval at most, naming the last skipped record and how
# many were skipped since the previous line: a queue full of bad records must not flood the log.
UNDECODABLE_LOG_INTERVAL_MS: Final = 10_000


@dataclass(slots=True)
class _Walk:
    messages: list[MessageExt] = field(default_factory=list)
    undecodable: list[UndecodableMessage] = field(default_factory=list)
    # Queue offset of the last record decoded (matched by the tag filter or not); -1: none.
    last_decoded_offset: int = -1
    decoded_count: int = 0
    # Why the records stopped being framed (bad magic or size), or None if the body was whole.
    broken: str | None = None

    @property
    def framed_count(self) -> int:
        """Records framed before the break: decoded (whether or not they matched) or skipped."""
        return self.decoded_count + len(self.undecodable)


def _walk_records(body: bytes, mq: MessageQueue, tag_filter: pm.TagFilter) -> _Walk:
    walk = _Walk()
    position = 0
    while position < len(body):
        try:
            size = record_size_at(body, position)
        except CorruptRecordError as exc:
            walk.broken = str(exc)
            return walk
        try:
            message = MessageExt.from_stored(decode_record(body, position), mq.broker_name)
        except (CorruptRecordError, ProtocolError) as exc:
            # The header may be what is corrupt: its queue offset is for the log line only.
            offset = queue_offset_at(body, position)
            walk.undecodable.append(UndecodableMessage(mq, offset, str(exc)))
        else:
            walk.last_decoded_offset = message.queue_offset
            walk.decoded_count += 1
            # The broker filters by tag hash, and hashes collide: filter again by tag string.
            if tag_filter.matches_all or tag_filter.matches_tag(message.tags):
                walk.messages.append(message)
        position += size
    return walk


def decode_pull_response(
    response: RemotingCommand,
    mq: MessageQueue,
    tag_filter: pm.TagFilter,
    *,
    requested_offset: int = 0,
    max_nums: int = 1,
) -> PullResult | None:
    """The PullResult of a PULL_MESSAGE answer; undecodable records are skipped and listed.

    `requested_offset` and `max_nums` are what was asked; they matter only when a body's framing
    breaks (see the module docstring).

    Returns:
        The result, or None when the body's framing broke at its first record and more than one
        message was asked for: ask again for one message at the same offset.

    Raises:
        BrokerError: the answer's code is not one of a pull's.
    """
    status = _PULL_STATUS.get(response.code)
    if status is None:
        raise error_for_code(response.code, response.remark)
    header = PullMessageResponseHeader.from_fields(response.ext_fields)
    next_begin_offset = header.next_begin_offset
    walk = _Walk()
    if status is PullStatus.FOUND:
        walk = _walk_records(response.body, mq, tag_filter)
    if walk.broken is not None:
        framed = walk.framed_count
        if framed:
            # Re-pull from just after the last framed record: nothing behind it is given up. The
            # records came in queue order from `requested_offset`, so that is at least
            # requested_offset + framed (an undecodable record's own offset is not trusted).
            resume = max(walk.last_decoded_offset + 1, requested_offset + framed)
            next_begin_offset = min(next_begin_offset, resume)
        elif max_nums > 1:
            return None
        else:
            walk.undecodable.append(UndecodableMessage(mq, requested_offset, walk.broken))
    return PullResult(
        status=status,
        next_begin_offset=next_begin_offset,
        min_offset=header.min_offset,
        max_offset=header.max_offset,
        messages=walk.messages,
        undecodable=walk.undecodable,
        suggest_which_broker_id=header.suggest_which_broker_id,
    )


class UndecodableLog:
    """Counts skipped records for one consumer and logs them at most once per interval."""

    def __init__(self, group: str, clock: Clock) -> None:
        self._group = group
        self._clock = clock
        self.count = 0
        self._unlogged = 0
        self._logged_at_ms: float | None = None

    def record(self, skipped: Sequence[UndecodableMessage]) -> None:
        if not skipped:
            return
        self.count += len(skipped)
        self._unlogged += len(skipped)
        now_ms = self._clock.monotonic_ms()
        if self._logged_at_ms is not None and now_ms - self._logged_at_ms < (
            UNDECODABLE_LOG_INTERVAL_MS
        ):
            return
        last = skipped[-1]
        logger.warning(
            "%s: skipped %d undecodable message(s) (%d in all); last: %s %s:%d offset %d: %s",
            self._group,
            self._unlogged,
            self.count,
            last.message_queue.topic,
            last.message_queue.broker_name,
            last.message_queue.queue_id,
            last.queue_offset,
            last.reason,
        )
        self._logged_at_ms = now_ms
        self._unlogged = 0
