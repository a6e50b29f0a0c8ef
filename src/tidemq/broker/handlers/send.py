"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): remoting.md §4.1.

    header ─▶ broker writable? ─▶ topic name legal? not a system topic? ─▶ topic known, else
    auto-create from the default topic (INHERIT bit) or as a retry topic ─▶ queue id valid
    (negative: the broker picks) ─▶ topic writable ─▶ build MessageToStore(s) ─▶ store.put_*
    ─▶ SYNC_FLUSH / SYNC_MASTER: await durability (durability.py) ─▶ response header
    (offsetMsgId, queueId, queueOffset)

On a SLAVE every send is refused with SERVICE_NOT_AVAILABLE (its log is its master's copy; as
upstream's put on a slave: SLAVE_NOT_AVAILABLE is a send *status*, promising a msgId): the
check is part of `_check`, which a send to an already checked topic skips, so it costs the
master's hot path nothing; a slave never fills that cache.

A topic that passed the checks up to "topic writable" is remembered (not a retry topic, whose
group lives in another table) until the topic table next changes: its next sends skip them.

A batch is code 320, or code 10/310 with batch "true" or "1" (C++ 1.2.3 sends "1", which Java reads
as false and stores as one blob; we split it). A C++ batch body may be zlib-compressed as a whole
(outer sysFlag bit 0): it is inflated first and the inner messages stored uncompressed. Each inner
message keeps its flag, body and properties, gains the outer properties and CLUSTER, and takes
topic, queue, sysFlag, born time and hosts from the outer request.

A single send flagged COMPRESSED whose body does not inflate within maxMessageSize is refused
with MESSAGE_ILLEGAL before anything is stored (send_body.py): stored, it would stop every
consumer of its queue. A compressed batch body that does not inflate is refused the same way.

A single send whose TRAN_MSG property is true (any sysFlag: the C++ client sets only the
property) is stored as a half message (broker/transaction/, §8): the resolver makes it
(`half_message`, SYSTEM_BUSY when too many transactions are in flight), it joins the coalescer in
the send's place (a `Substitute`: the answer quotes the real queue id, a refusal the real topic)
and the resolver tracks it once stored (`half_stored`); the response's queueOffset is the half
queue's offset, which END_TRANSACTION quotes back.

A single send with DELAY > 0 or a TIMER_* property is parked by the DelayRouter (schedule.py,
§9); a send to %RETRY%<group> whose reconsumeTimes reached the limit goes to %DLQ%<group>
(send_back.py, §4.1 step 5).

Every other single send is plain: after its checks it joins the SendCoalescer
(send_coalesce.py), which stores the plain and half sends of one event-loop turn with one store
call and answers each. The handler then returns None; the rest are stored and answered here,
after the coalescer's pending sends (arrival order).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.delay_levels import PARKING_PROPERTIES
from tidemq.broker.durability import Durability
from tidemq.broker.groups import SubscriptionGroupTable
from tidemq.broker.handlers.common import (
    BrokerAddress,
    Refusal,
    guarded,
    slave_refusal_remark,
)
from tidemq.broker.handlers.send_back import header_max_reconsume_times, redirect_exhausted
from tidemq.broker.handlers.send_body import CompressedBodyCheck
from tidemq.broker.handlers.send_coalesce import SendCoalescer, Substitute, store_refusal
from tidemq.broker.schedule import DelayRefused, DelayRouter
from tidemq.broker.stats import BrokerStats
from tidemq.broker.topics import TopicTable
from tidemq.broker.trace import BrokerTrace
from tidemq.broker.transaction.ledger import TransactionBusy
from tidemq.broker.transaction.resolution import TransactionResolver
from tidemq.clock import Clock, SystemClock
from tidemq.errors import ProtocolError
from tidemq.limits import MESSAGE_PROPERTIES_SIZE_MAX
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_admin import TOPIC_FILTER_MULTI_TAG
from tidemq.protocol.headers_send import SendMessageRequestHeader, send_response_fields
from tidemq.protocol.message import (
    CLUSTER,
    DELAY,
    TRAN_MSG,
    WAIT,
    Perm,
    SysFlag,
    TopicSysFlag,
    decode_batch_raw,
    decode_properties,
    edit_properties,
    encode_properties,
    group_of_retry_topic,
    inflate,
    is_system_topic,
    is_true_text,
    offset_msg_id,
    offset_msg_ids,
    validate_topic,
)
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore, PutResult

log = logging.getLogger(__name__)


# Calling a class with keywords packs them into a dict first (type.__call__): ~0.6 µs more per
# message than positional arguments. Its __init__ called as a function takes them as any call
# does, so the message is built by name for about the positional cost.
_new: Final = object.__new__
_init_message: Final = MessageToStore.__init__


class SendHandler:
    def __init__(
        self,
        config: BrokerConfig,
        address: BrokerAddress,
        store: FileMessageStore,
        topics: TopicTable,
        groups: SubscriptionGroupTable,
        durability: Durability,
        transactions: TransactionResolver | None = None,
        delays: DelayRouter | None = None,
        clock: Clock | None = None,
        stats: BrokerStats | None = None,
        trace: BrokerTrace | None = None,
    ) -> None:
        """`stats`: what stored sends are counted in (None: not counted); `trace`: the message
        trace, told which producer group each connection sends for (None: off)."""
        self._config = config
        self._trace = trace
        self._stats = stats
        self._address = address
        self._store = store
        self._topics = topics
        self._groups = groups
        self._durability = durability
        self._transactions = transactions
        self._delays = delays
        # Spreads sends with queueId < 0 over the queues (no randomness outside cli/testing).
        self._spread = itertools.count()
        self._coalescer = SendCoalescer(store, durability, address, stats)
        # A COMPRESSED body must inflate (send_body.py): a batch body to at most its largest
        # uncompressed form, a single body to maxMessageSize.
        self._compressed = CompressedBodyCheck(
            config.max_message_size, clock if clock is not None else SystemClock()
        )
        self._batch_inflated_max = config.max_message_size + MESSAGE_PROPERTIES_SIZE_MAX
        # What every stored single message gains, encoded once.
        self._cluster = {CLUSTER: config.broker_cluster_name}
        self._cluster_text = encode_properties(self._cluster)
        # The topics that passed _check, by name, while the topic table stays as it is: what
        # decides the check is the broker's permission (fixed), the topic's name and its config
        # (the table's), so a send to one of them skips it. Retry topics are never here (their
        # group, from another table, is checked each time).
        self._checked: dict[str, TopicConfig] = {}
        topics.add_change_listener(self._on_topics_changed)

    def _on_topics_changed(self) -> None:
        self._checked.clear()
        # Sends collected before the change are stored under the table they were checked
        # against: a topic deleted in the same loop turn loses them with it, never recreates it.
        self._coalescer.put_pending()

    def register(self, table: HandlerTable) -> None:
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
        ):
            table.register(code, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        header = SendMessageRequestHeader.from_fields(request.ext_fields)
        if self._trace is not None:
            self._trace.producer_seen(connection.peer, header.producer_group)
        topic = header.topic
        topic_config = self._checked.get(topic) or self._check(connection, header)
        queue_id = self._queue_id(header, topic_config)
        text = header.properties or ""
        properties = decode_properties(text)
        text = edit_properties(text, properties, WAIT, self._cluster, self._cluster_text)
        sys_flag = header.sys_flag
        if topic_config.topic_filter_type == TOPIC_FILTER_MULTI_TAG:
            sys_flag |= SysFlag.MULTI_TAGS
        coalescer = self._coalescer
        if request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch:
            return await self._send_batch(connection, request, header, queue_id, properties)
        body = request.body
        transactional = TRAN_MSG in properties and is_true_text(properties[TRAN_MSG])
        if transactional or len(body) > self._config.max_message_size:
            self._check_single(body, properties)
        if sys_flag & SysFlag.COMPRESSED:
            # zlib, LZ4 or ZSTD by sysFlag bits 8-10 (send_body.py).
            refusal = self._compressed.check(body, topic, connection.peer_text, sys_flag)
            if refusal is not None:
                return request.response(ResponseCode.MESSAGE_ILLEGAL, remark=refusal)
        address = self._address
        message = _new(MessageToStore)
        _init_message(
            message,
            topic=topic,
            queue_id=queue_id,
            body=body,
            flag=header.flag,
            properties=text,
            sys_flag=sys_flag,
            born_timestamp=header.born_timestamp,
            born_host=connection.peer,
            store_host=(address.host, address.port),
            reconsume_times=header.reconsume_times,
            parsed=(text, properties),
        )
        if transactional:
            half = self._half_message(message, header.producer_group)
            assert self._transactions is not None  # _check_single refused the send otherwise
            substitute = Substitute(topic, queue_id, self._transactions.half_stored)
            coalescer.add(connection, request, half, substitute)
            return None
        # A checked topic is no retry topic (nothing to redirect); without a delay or timer
        # property the DelayRouter gives the message back: _park would change nothing.
        if topic in self._checked and properties.keys().isdisjoint(PARKING_PROPERTIES):
            coalescer.add(connection, request, message)
            return None
        parked = self._park(message, header, request.version)
        if parked is message:
            coalescer.add(connection, request, message)
            return None
        coalescer.put_pending()
        results = [self._store.put_message(parked)]
        return await self._answer(request, header, queue_id, results)

    async def _send_batch(
        self,
        connection: Connection,
        request: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
        properties: dict[str, str],
    ) -> RemotingCommand:
        # As Java, a batch's messages take the header's sysFlag (no MULTI_TAGS bit).
        body, sys_flag = request.body, header.sys_flag
        if sys_flag & SysFlag.COMPRESSED:
            # C++ 1.2.3 deflates the whole batch body; its messages are stored uncompressed.
            try:
                body = inflate(body, self._batch_inflated_max)
            except ProtocolError as exc:
                remark = self._compressed.refused(str(exc), header.topic, connection.peer_text)
                return request.response(ResponseCode.MESSAGE_ILLEGAL, remark=remark)
            sys_flag &= ~SysFlag.COMPRESSED
        messages = self._split_batch(connection, header, body, sys_flag, queue_id, properties)
        self._coalescer.put_pending()
        results = self._store.put_messages(messages)
        return await self._answer(request, header, queue_id, results)

    # -- checks ------------------------------------------------------------------------------

    def _check(self, connection: Connection, header: SendMessageRequestHeader) -> TopicConfig:
        if self._config.is_slave:
            raise Refusal(
                ResponseCode.SERVICE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )
        if not Perm.is_writable(self._config.broker_permission):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self._config.broker_name}] sending message is forbidden",
            )
        try:
            validate_topic(header.topic)
        except ProtocolError as exc:
            raise Refusal(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        if is_system_topic(header.topic):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"Sending message to topic[{header.topic}] is forbidden (system topic)",
            )
        topic_config = self._topics.get(header.topic) or self._auto_create(header)
        if topic_config is None:
            raise Refusal(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{header.topic}] not exist, apply first please!",
            )
        if not Perm.is_writable(topic_config.perm):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"the topic[{header.topic}] sending message is forbidden (perm "
                f"{Perm.to_text(topic_config.perm)})",
            )
        retry_group = group_of_retry_topic(header.topic)
        if retry_group is None:
            # Cleared by every change of the topic table (its change listener).
            self._checked[header.topic] = topic_config
        elif self._groups.find_or_create(retry_group) is None:
            raise Refusal(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{retry_group}] does not exist",
            )
        return topic_config

    def _auto_create(self, header: SendMessageRequestHeader) -> TopicConfig | None:
        retry_group = group_of_retry_topic(header.topic)
        if retry_group is not None:
            group = self._groups.find_or_create(retry_group)
            if group is None:
                return None
            return self._topics.ensure_retry_topic(retry_group, max(1, group.retry_queue_nums))
        try:
            validate_topic(header.default_topic)
        except ProtocolError:
            return None
        sys_flag = TopicSysFlag.UNIT if header.unit_mode else 0
        return self._topics.create_from_default(
            header.topic, header.default_topic, header.default_topic_queue_nums, sys_flag
        )

    def _queue_id(self, header: SendMessageRequestHeader, topic_config: TopicConfig) -> int:
        queue_nums = max(topic_config.write_queue_nums, topic_config.read_queue_nums)
        if header.queue_id >= queue_nums:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{header.queue_id}] is illegal, {topic_config.topic_name} has "
                f"{topic_config.write_queue_nums} write and {topic_config.read_queue_nums} read "
                "queues",
            )
        if header.queue_id >= 0:
            return header.queue_id
        if topic_config.write_queue_nums <= 0:
            raise Refusal(
                ResponseCode.NO_PERMISSION, f"topic[{topic_config.topic_name}] has no write queue"
            )
        return next(self._spread) % topic_config.write_queue_nums

    def _check_single(self, body: bytes, properties: dict[str, str]) -> None:
        self._check_size(len(body))
        if is_true_text(properties.get(TRAN_MSG)):
            if self._config.reject_transaction_message:
                raise Refusal(
                    ResponseCode.NO_PERMISSION,
                    f"the broker[{self._config.broker_name}] sending transaction message is "
                    "forbidden",
                )
            if self._transactions is None:
                raise Refusal(
                    ResponseCode.NO_PERMISSION,
                    "transactional messages are not supported by this broker",
                )

    def _park(
        self, message: MessageToStore, header: SendMessageRequestHeader, version: int
    ) -> MessageToStore:
        max_times = header_max_reconsume_times(header.max_reconsume_times, version)
        message = redirect_exhausted(message, max_times, self._groups, self._topics)
        if self._delays is None:
            return message
        try:
            return self._delays.route(message)
        except DelayRefused as exc:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"bad delayed message: {exc}") from None

    def _half_message(self, message: MessageToStore, producer_group: str) -> MessageToStore:
        assert self._transactions is not None
        try:
            return self._transactions.half_message(message, producer_group)
        except TransactionBusy as exc:
            raise Refusal(
                ResponseCode.SYSTEM_BUSY, f"[TRANSACTIONS_BUSY] {exc}; try again later"
            ) from None

    def _check_size(self, body_size: int) -> None:
        if body_size > self._config.max_message_size:
            raise Refusal(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {body_size} is larger than maxMessageSize "
                f"{self._config.max_message_size}",
            )

    def _split_batch(
        self,
        connection: Connection,
        header: SendMessageRequestHeader,
        body: bytes,
        sys_flag: int,
        queue_id: int,
        outer: dict[str, str],
    ) -> list[MessageToStore]:
        """The messages of a batch `body` (already inflated), each with `sys_flag`."""
        self._check_size(len(body))
        try:
            items = decode_batch_raw(body)
        except ProtocolError as exc:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
        if not items:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        messages: list[MessageToStore] = []
        outer_text = encode_properties(outer)
        topic, born_host = header.topic, connection.peer
        store_host = (self._address.host, self._address.port)
        born_timestamp, reconsume_times = header.born_timestamp, header.reconsume_times
        for flag, item_body, item_properties in items:
            props = decode_properties(item_properties)
            if is_true_text(props.get(TRAN_MSG)) or props.get(DELAY, "0").strip() not in ("", "0"):
                raise Refusal(
                    ResponseCode.MESSAGE_ILLEGAL,
                    "transactional or delayed messages are not allowed in a batch",
                )
            text = edit_properties(item_properties, props, WAIT, outer, outer_text)
            message = _new(MessageToStore)
            _init_message(
                message,
                topic=topic,
                queue_id=queue_id,
                body=item_body,
                flag=flag,
                properties=text,
                sys_flag=sys_flag,
                born_timestamp=born_timestamp,
                born_host=born_host,
                store_host=store_host,
                reconsume_times=reconsume_times,
                parsed=(text, props),
            )
            messages.append(message)
        return messages

    # -- answer ------------------------------------------------------------------------------

    async def _answer(
        self,
        request: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
        results: Sequence[PutResult],
    ) -> RemotingCommand:
        failed = next((r for r in results if not r.ok), None)
        if failed is not None:
            raise Refusal(*store_refusal(header.topic, failed))
        if self._stats is not None:  # a batch or a parked message, under the sender's topic
            self._stats.put(header.topic, len(results), sum(r.size for r in results))
        host, port = self._address.host, self._address.port
        if len(results) == 1:
            msg_ids = offset_msg_id(host, port, results[0].physical_offset)
            end = results[0].physical_offset + results[0].size
        else:
            msg_ids = ",".join(offset_msg_ids(host, port, [r.physical_offset for r in results]))
            end = max(r.physical_offset + r.size for r in results)
        fields = send_response_fields(msg_ids, queue_id, results[0].queue_offset)
        if self._durability.waits:
            code, remark = await self._durability.wait_durable(end)
            return request.response(code, fields, remark=remark or None)
        return request.response(ResponseCode.SUCCESS, fields)
