"""Broker-side message trace (issue 17 item 4; operations.md §3): the broker writes, in upstream's
trace format (protocol/trace.py), what it saw happen to each message of the traced topics, so
the trace works for every client, tracing or not.

    store dispatch ─▶ `on_dispatch` ─┐  (the store's listener, only for `wants_topic` topics)
    pull FOUND     ─▶ `delivered`  ──┤
    offset commit  ─▶ `acked`      ──┼─▶ deque of small tuples, bounded by the records they name
    END_TRANSACTION ─▶ `ended`     ──┘   (RECORDS_MAX; full: dropped, counted)
                                               │ every 100 ms (`flush`, a PeriodicService)
                                               ▼
            chunks of ≤ CHUNK_RECORDS_MAX records / CHUNK_BUDGET_S read back from the store,
            each one store put (trace messages of up to 64 records, KEYS = every msgId and key
            of their records); the writer yields to the loop between chunks

The hooks run on the hot path and only append a tuple; reading records, encoding and storing
happen in the writer's turn, a chunk at a time: reading a record back costs ~15 µs, so a full
buffer in one synchronous call would hold the loop for seconds. With brokerTraceEnable off no
part exists: the handlers hold None and test it once, and no dispatch listener is registered.

What TideMQ writes for each event (the record layouts are upstream's, so any reader parses
them; `request_id` says what the broker saw):

    send stored           Pub, msgType Normal_Msg; a half Trans_Msg_Half; parked by DELAY or a
                          TIMER_* property Delay_Msg (written when parked, not when delivered).
                          costTime = store time - born time; group = the send header's
                          producerGroup (PGROUP for a half), else the heartbeats' group of the
                          connection, else empty
    pull returns it       SubBefore, the consumer group, retryTimes = its reconsumeTimes,
                          requestId "pull:<queueId>:<queueOffset>"
    offset commit passes  SubAfter success=true, contextCode 0 (SUCCESS), requestId
                          "ack:<queueId>:<queueOffset>"; at most ACK_NAMED_MAX messages named
                          per commit (the last ones); a group's first commit starts at the
                          first offset this broker delivered to it since its last commit
    send-back (retry)     SubAfter success=false, contextCode 4 (FAILED), requestId
                          "sendback:<n>" where n is the retry it becomes
    moved to %DLQ%group   SubAfter success=false, contextCode 100 (TideMQ's; no upstream type),
                          requestId "dlq:<n>", n the attempts made (its reconsumeTimes)
    END_TRANSACTION       EndTransaction COMMIT_MESSAGE / ROLLBACK_MESSAGE, with the producer's
                          transactionId and fromTransactionCheck

The trace topic, system topics and the retry/DLQ topics themselves are never traced as topics
(their messages are traced under the topic they were sent to). Deliveries to and commits of
tool and system groups (`untraced_group`) are not traced: they browse, never consume.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Final

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.config import BrokerConfig, ConfigError
from tidemq.broker.handlers.common import BrokerAddress
from tidemq.broker.service import PeriodicService
from tidemq.broker.timer import TIMER_TOPIC_PREFIX
from tidemq.broker.topics import TopicTable
from tidemq.broker.trace_parts import (
    Head,
    Producers,
    clean,
    is_untraced_topic,
    traced_topics,
    untraced_group,
)
from tidemq.broker.transaction.states import TxInput
from tidemq.clock import Clock
from tidemq.errors import CorruptRecordError, ProtocolError
from tidemq.protocol import record as rec
from tidemq.protocol import trace as tr
from tidemq.protocol.headers_tx import EndTransactionRequestHeader
from tidemq.protocol.message import (
    DLQ_GROUP_TOPIC_PREFIX,
    KEYS,
    ORIGIN_MESSAGE_ID,
    PGROUP,
    REAL_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    RETRY_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC_XXXX,
    TAGS,
    TRAN_PREPARED_QUEUE_OFFSET,
    UNIQ_KEY,
    SysFlag,
    decode_properties,
    encode_properties,
    validate_topic,
)
from tidemq.protocol.message_id import offset_msg_id
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import DispatchEvent, GetStatus, MessageToStore

log = logging.getLogger(__name__)

FLUSH_INTERVAL_MS: Final = 100
# Records the waiting events name (a pull names up to 32, a commit up to ACK_NAMED_MAX); more
# are dropped (and counted) rather than slow the broker.
RECORDS_MAX: Final = 8_192
# One chunk of a writer turn reads back at most this many records or runs at most this long;
# the writer yields to the loop between chunks.
CHUNK_RECORDS_MAX: Final = 200
CHUNK_BUDGET_S: Final = 0.002
# Messages one offset commit names (the last ones before the new offset), read ACK_READ_MAX at
# a time (the rest goes back to the head of the buffer).
ACK_NAMED_MAX: Final = 256
ACK_READ_MAX: Final = 64
# A trace message holds at most this many records, and keys (their msgIds and keys) of at most
# this many characters (the properties of a record are limited to 32 KiB).
BATCH_RECORDS_MAX: Final = 64
BATCH_KEYS_TEXT_MAX: Final = 8_192
# Connections whose producer group is remembered (cleared when full: they are re-learnt).
SENDERS_MAX: Final = 65_536
# (group, topic, queue) whose first delivery since their last commit is remembered (the oldest
# is forgotten when full).
FIRST_DELIVERED_MAX: Final = 65_536
DROP_LOG_INTERVAL_S: Final = 60.0
TRACE_QUEUE_NUMS: Final = 1

_STORED: Final = 0
_DELIVERED: Final = 1
_ACKED: Final = 2
_ENDED: Final = 3
_STATES: Final = {TxInput.COMMIT: tr.COMMIT_MESSAGE, TxInput.ROLLBACK: tr.ROLLBACK_MESSAGE}


def ensure_trace_topic(config: BrokerConfig, topics: TopicTable) -> None:
    """traceTopicEnable (upstream: the broker creates the trace topic) or brokerTraceEnable:
    the trace topic exists, so it is routed and QUERY_MESSAGE finds its records (a slave copies
    its master's table)."""
    if (config.trace_topic_enable or config.broker_trace_enable) and not config.is_slave:
        topics.ensure(config.msg_trace_topic_name, TRACE_QUEUE_NUMS)


class BrokerTrace:
    """The hooks, the buffer and the writer (module doc). Built only with brokerTraceEnable."""

    def __init__(
        self,
        config: BrokerConfig,
        store: FileMessageStore,
        topics: TopicTable,
        clients: ClientRegistry,
        clock: Clock,
        address: BrokerAddress,
    ) -> None:
        self.trace_topic = config.msg_trace_topic_name
        self._only = traced_topics(config.broker_trace_topics)
        self._store = store
        self._topics = topics
        self._clients = clients
        self._clock = clock
        self._address = address
        # (records it names, event); `_pending` is the sum of the first.
        self._events: collections.deque[tuple[int, tuple[object, ...]]] = collections.deque()
        self._pending = 0
        self._first_delivered: collections.OrderedDict[tuple[str, str, int], int] = (
            collections.OrderedDict()
        )
        self._senders: dict[tuple[str, int], str] = {}
        self.dropped = 0
        self.written = 0
        # The longest synchronous chunk of a writer turn so far (s: what the loop waited) and
        # the most records one chunk named.
        self.longest_chunk_s = 0.0
        self.largest_chunk_records = 0
        self._dropped_logged_at = 0.0
        self._spread = 0
        self._writer = PeriodicService("trace-writer", FLUSH_INTERVAL_MS, self.flush)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Follow the store's dispatch and start the writer (after the topic table loaded)."""
        self._store.add_dispatch_listener(self.on_dispatch, self.wants_topic)
        self._writer.start()

    async def stop(self) -> None:
        """Stop the writer and write what is buffered (before the store shuts)."""
        await self._writer.stop()
        while self._events:
            self.flush_chunk()

    # -- which topics --------------------------------------------------------------------------

    def traced(self, topic: str) -> bool:
        """A topic whose messages are traced: listed (or all when none is), never a system,
        retry, DLQ or the trace topic."""
        if topic == self.trace_topic or is_untraced_topic(topic):
            return False
        return self._only is None or topic in self._only

    def wants_topic(self, topic: str) -> bool:
        """The dispatch listener's filter (asked once per topic per put)."""
        if topic == self.trace_topic:
            return False
        if topic in (SCHEDULE_TOPIC_XXXX, RMQ_SYS_TRANS_HALF_TOPIC):
            return True
        if topic.startswith((TIMER_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
            return True
        return self.traced(topic)

    def _consumed(self, group: str, topic: str) -> bool:
        """Pulls and commits of `topic` may name traced messages: a traced topic's, or a retry
        topic's (whose messages are traced under their original topic), by a consuming group."""
        if untraced_group(group):
            return False
        return topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or self.traced(topic)

    # -- hooks (hot path: append a tuple) ------------------------------------------------------

    def _add(self, event: tuple[object, ...], named: int = 1) -> None:
        if self._pending + named > RECORDS_MAX:
            self._drop(named)
            return
        self._pending += named
        self._events.append((named, event))

    def producer_seen(self, peer: tuple[str, int], group: str) -> None:
        """A send from `peer` named producer `group` (the Pub record's group: a producer need
        not have heartbeated this broker before its first send)."""
        groups = self._senders
        if groups.get(peer) != group:
            if len(groups) >= SENDERS_MAX:
                groups.clear()
            groups[peer] = group

    def on_dispatch(self, event: DispatchEvent) -> None:
        self._add((_STORED, event))

    def delivered(self, group: str, topic: str, records: list[bytes]) -> None:
        """A pull of `topic` returned `records` to `group`."""
        if not self._consumed(group, topic):
            return
        phys = [rec.physical_offset_at(r) for r in records]
        self._add((_DELIVERED, self._clock.now_ms(), group, phys), len(phys))

    def acked(self, group: str, topic: str, queue_id: int, old: int | None, new: int) -> None:
        """`group` committed `new` for the queue (its offset was `old`, None if it had none)."""
        if (old is None or new > old) and self._consumed(group, topic):
            named = ACK_NAMED_MAX if old is None or old < 0 else min(new - old, ACK_NAMED_MAX)
            self._add((_ACKED, self._clock.now_ms(), group, topic, queue_id, old, new), named)

    def ended(
        self, header: EndTransactionRequestHeader, props: dict[str, str], tx: TxInput
    ) -> None:
        """An END_TRANSACTION about the half with `props` passed its checks."""
        if tx in _STATES and self.traced(props.get(REAL_TOPIC, "")):
            self._add((_ENDED, self._clock.now_ms(), header, props, _STATES[tx]))

    def _drop(self, count: int) -> None:
        self.dropped += count
        now = time.monotonic()
        if now - self._dropped_logged_at >= DROP_LOG_INTERVAL_S:
            self._dropped_logged_at = now
            log.warning("message trace: %d trace records dropped so far", self.dropped)

    # -- the writer ------------------------------------------------------------------------------

    async def flush(self) -> int:
        """One writer turn: what was buffered at its start, a chunk at a time, yielding to the
        loop between chunks. Returns the number of records stored."""
        stored, budget = 0, self._pending
        while self._events and budget > 0:
            before = self._pending
            stored += self.flush_chunk()
            budget -= max(1, before - self._pending)
            await asyncio.sleep(0)
        return stored

    def flush_chunk(self) -> int:
        """Read back the records of the oldest events, up to CHUNK_RECORDS_MAX records or
        CHUNK_BUDGET_S, and store them with one store call. Returns the number stored."""
        if self._store.replica_mode:  # became a slave: its log is a copy, the master traces
            self._events.clear()
            self._pending = 0
            return 0
        started = time.perf_counter()
        records: list[tr.TraceRecord] = []
        producers = Producers(self._clients, self._senders)
        named = 0
        while (
            self._events
            and named < CHUNK_RECORDS_MAX
            and time.perf_counter() - started < CHUNK_BUDGET_S
        ):
            weight, event = self._events.popleft()
            self._pending -= weight
            left = self._pending
            try:
                records.extend(clean(r) for r in self._records(event, producers))
            except (CorruptRecordError, ProtocolError, OSError, ValueError):
                self._drop(weight - (self._pending - left))
                log.exception("message trace: an event could not be read back; skipped")
            named += weight - (self._pending - left)  # less what a commit put back
        stored = self._store_records(records)
        self.longest_chunk_s = max(self.longest_chunk_s, time.perf_counter() - started)
        self.largest_chunk_records = max(self.largest_chunk_records, named)
        return stored

    def _records(self, event: tuple[object, ...], producers: Producers) -> list[tr.TraceRecord]:
        kind = event[0]
        if kind == _STORED:
            stored = event[1]
            assert isinstance(stored, DispatchEvent)
            return self._stored(stored, producers)
        if kind == _DELIVERED:
            return self._delivered(*event[1:])  # type: ignore[arg-type]
        if kind == _ACKED:
            return self._acked(*event[1:])  # type: ignore[arg-type]
        return self._ended(*event[1:])  # type: ignore[arg-type]

    def _read(self, physical_offset: int) -> rec.StoredMessage | None:
        data = self._store.read_record(physical_offset)
        return None if data is None else rec.decode_record(data, verify_crc=False)

    def _head(self, physical_offset: int) -> Head | None:
        """The record's fixed fields up to its body length: what a Pub needs beyond the
        dispatch event, without copying the body (a third of the writer's time otherwise)."""
        data = self._store.read_raw(physical_offset, rec.BODY_OFFSET)
        if len(data) < rec.BODY_OFFSET:
            return None
        fields = rec.RECORD_HEADER.unpack_from(data)
        born_ip, born_port = fields[9], fields[10]
        born_host = (".".join(str(b) for b in born_ip), born_port)
        return Head(fields[7], fields[8], born_host, fields[14], fields[16])

    def _msg_ids(self, physical_offset: int, props: dict[str, str]) -> tuple[str, str]:
        """(msgId, offsetMsgId): the client's UNIQ_KEY (kept across retries), else the first
        offset id, else the record's own."""
        own = offset_msg_id(self._address.host, self._address.port, physical_offset)
        return props.get(UNIQ_KEY) or props.get(ORIGIN_MESSAGE_ID) or own, own

    def _stored(self, event: DispatchEvent, producers: Producers) -> list[tr.TraceRecord]:
        topic, props = event.topic, event.properties
        if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
            return self._failed(event, topic[len(DLQ_GROUP_TOPIC_PREFIX) :], "dlq", tr.CONTEXT_DLQ)
        real = props.get(REAL_TOPIC, "")
        msg_type = tr.MSG_TYPE_NORMAL
        if topic == RMQ_SYS_TRANS_HALF_TOPIC:
            if TRAN_PREPARED_QUEUE_OFFSET in props:  # a check-back's copy of a half
                return []
            topic, msg_type = real, tr.MSG_TYPE_TRANS_HALF
        elif topic == SCHEDULE_TOPIC_XXXX or topic.startswith(TIMER_TOPIC_PREFIX):
            if real.startswith(RETRY_GROUP_TOPIC_PREFIX):
                group = real[len(RETRY_GROUP_TOPIC_PREFIX) :]
                return self._failed(event, group, "sendback", tr.CONTEXT_FAILED)
            topic, msg_type = real, tr.MSG_TYPE_DELAY
        elif real:  # delivered from parking, or a commit: traced when it was stored first
            return []
        if not self.traced(topic):
            return []
        head = self._head(event.physical_offset)
        if head is None or SysFlag.transaction_type(head.sys_flag) == SysFlag.COMMIT:
            return []  # a commit's real message: its half was traced, and its END
        msg_id, own_id = self._msg_ids(event.physical_offset, props)
        group = props.get(PGROUP) or producers.group_of(head.born_host)
        pub = tr.TraceRecord(
            tr.PUB,
            timestamp=event.store_timestamp,
            group=group,
            topic=topic,
            msg_id=msg_id,
            tags=props.get(TAGS, ""),
            keys=props.get(KEYS, ""),
            store_host=self._address.text,
            body_length=head.body_length,
            cost_time=max(0, event.store_timestamp - head.born_timestamp),
            msg_type=msg_type,
            offset_msg_id=own_id,
            success=True,
        )
        return [pub]

    def _failed(
        self, event: DispatchEvent, group: str, what: str, context: int
    ) -> list[tr.TraceRecord]:
        """A send-back or DLQ move of a message of a traced topic: SubAfter success=false."""
        props = event.properties
        if not self.traced(props.get(RETRY_TOPIC, "")):
            return []
        head = self._head(event.physical_offset)
        if head is None:
            return []
        msg_id, _ = self._msg_ids(event.physical_offset, props)
        return [
            tr.TraceRecord(
                tr.SUB_AFTER,
                timestamp=event.store_timestamp,
                group=group,
                msg_id=msg_id,
                keys=props.get(KEYS, ""),
                success=False,
                context_code=context,
                request_id=f"{what}:{head.reconsume_times}",
            )
        ]

    def _consumed_ids(self, message: rec.StoredMessage) -> tuple[str, str] | None:
        """(msgId, keys) of a delivered message whose topic (a retry's original one) is
        traced, else None."""
        props = decode_properties(message.properties)
        topic = message.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic = props.get(RETRY_TOPIC, "")
        if not self.traced(topic):
            return None
        return self._msg_ids(message.physical_offset, props)[0], props.get(KEYS, "")

    def _delivered(self, now: int, group: str, phys: list[int]) -> list[tr.TraceRecord]:
        records: list[tr.TraceRecord] = []
        for offset in phys:
            message = self._read(offset)
            if message is None:
                continue
            key = (group, message.topic, message.queue_id)
            if key not in self._first_delivered:
                if len(self._first_delivered) >= FIRST_DELIVERED_MAX:
                    self._first_delivered.popitem(last=False)  # the oldest
                self._first_delivered[key] = message.queue_offset
            ids = self._consumed_ids(message)
            if ids is None:
                continue
            records.append(
                tr.TraceRecord(
                    tr.SUB_BEFORE,
                    timestamp=now,
                    group=group,
                    request_id=f"pull:{message.queue_id}:{message.queue_offset}",
                    msg_id=ids[0],
                    retry_times=message.reconsume_times,
                    keys=ids[1],
                )
            )
        return records

    def _acked(
        self, now: int, group: str, topic: str, queue_id: int, old: int | None, new: int
    ) -> list[tr.TraceRecord]:
        first = self._first_delivered.pop((group, topic, queue_id), None)
        start = old if old is not None and old >= 0 else first
        if start is None or new <= start:
            return []
        start = max(start, new - ACK_NAMED_MAX)
        if new - start > ACK_READ_MAX:  # the rest is read in the next chunk
            rest = (_ACKED, now, group, topic, queue_id, start + ACK_READ_MAX, new)
            self._events.appendleft((new - start - ACK_READ_MAX, rest))
            self._pending += new - start - ACK_READ_MAX
            new = start + ACK_READ_MAX
        result = self._store.get_messages(topic, queue_id, start, new - start)
        if result.status is not GetStatus.FOUND:
            return []
        records: list[tr.TraceRecord] = []
        for data in result.records:
            message = rec.decode_record(data, verify_crc=False)
            if message.queue_offset >= new:
                break
            ids = self._consumed_ids(message)
            if ids is None:
                continue
            records.append(
                tr.TraceRecord(
                    tr.SUB_AFTER,
                    timestamp=now,
                    group=group,
                    request_id=f"ack:{queue_id}:{message.queue_offset}",
                    msg_id=ids[0],
                    keys=ids[1],
                    success=True,
                    context_code=tr.CONTEXT_SUCCESS,
                )
            )
        return records

    def _ended(
        self, now: int, header: EndTransactionRequestHeader, props: dict[str, str], state: str
    ) -> list[tr.TraceRecord]:
        topic = props.get(REAL_TOPIC, "")
        if not self.traced(topic):
            return []
        record = tr.TraceRecord(
            tr.END_TRANSACTION,
            timestamp=now,
            group=header.producer_group,
            topic=topic,
            msg_id=props.get(UNIQ_KEY) or header.msg_id,
            tags=props.get(TAGS, ""),
            keys=props.get(KEYS, ""),
            store_host=self._address.text,
            msg_type=tr.MSG_TYPE_TRANS_COMMIT,
            transaction_id=header.transaction_id or "",
            transaction_state=state,
            from_transaction_check=header.from_transaction_check,
        )
        return [record]

    def _store_records(self, records: list[tr.TraceRecord]) -> int:
        """Store `records` in trace messages of at most BATCH_RECORDS_MAX records and
        BATCH_KEYS_TEXT_MAX characters of keys (upstream batches the same way), with one store
        call. Returns the number of records stored."""
        if not records:
            return 0
        topic_config = self._topics.get(self.trace_topic)
        if topic_config is None or topic_config.write_queue_nums <= 0:
            self._drop(len(records))
            return 0
        batches: list[list[tr.TraceRecord]] = [[]]
        keys_text = 0
        for record in records:
            size = len(record.msg_id) + len(record.keys) + 2
            batch = batches[-1]
            if batch and (
                len(batch) >= BATCH_RECORDS_MAX or keys_text + size > BATCH_KEYS_TEXT_MAX
            ):
                batch, keys_text = [], 0
                batches.append(batch)
            batch.append(record)
            keys_text += size
        queues = topic_config.write_queue_nums
        try:
            messages = [self._message(batch, queues) for batch in batches]
            results = self._store.put_each(messages)
        except Exception:
            log.exception("message trace: %d trace records could not be stored", len(records))
            self._drop(len(records))
            return 0
        stored = sum(len(b) for b, r in zip(batches, results, strict=True) if r.ok)
        if stored < len(records):
            self._drop(len(records) - stored)
        self.written += stored
        return stored

    def _message(self, records: list[tr.TraceRecord], queue_nums: int) -> MessageToStore:
        body = tr.encode_records(records).encode()
        props = encode_properties({KEYS: tr.KEY_SEPARATOR.join(tr.trace_keys(records))})
        self._spread += 1
        host = (self._address.host, self._address.port)
        return MessageToStore(
            topic=self.trace_topic,
            queue_id=self._spread % queue_nums,
            body=body,
            flag=0,
            properties=props,
            sys_flag=0,
            born_timestamp=self._clock.now_ms(),
            born_host=host,
            store_host=host,
        )


def broker_trace(
    config: BrokerConfig,
    store: FileMessageStore,
    topics: TopicTable,
    clients: ClientRegistry,
    clock: Clock,
    address: BrokerAddress,
) -> BrokerTrace | None:
    """The broker's trace, or None (brokerTraceEnable off, or a slave: its log is a copy).

    Raises:
        ConfigError: msgTraceTopicName or a name in brokerTraceTopics is no legal topic name.
    """
    for key, names in (
        ("msgTraceTopicName", [config.msg_trace_topic_name]),
        ("brokerTraceTopics", sorted(traced_topics(config.broker_trace_topics) or ())),
    ):
        for name in names:
            try:
                validate_topic(name)
            except ProtocolError as exc:
                raise ConfigError(f"{key}={name!r}: {exc}") from None
    if not config.broker_trace_enable or config.is_slave:
        return None
    return BrokerTrace(config, store, topics, clients, clock, address)


def start_trace(config: BrokerConfig, topics: TopicTable, trace: BrokerTrace | None) -> None:
    """At start, once the topic table is loaded: the trace topic, then the trace itself."""
    ensure_trace_topic(config, topics)
    if trace is not None:
        trace.start()


async def stop_trace(trace: BrokerTrace | None) -> None:
    """At stop, before the store shuts: what is buffered is written."""
    if trace is not None:
        await trace.stop()
