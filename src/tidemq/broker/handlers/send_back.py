"""CONSUMER_SEND_MSG_BACK (36): a consumer hands back a message it failed to consume (§4.9).

    group exists (26) ─▶ retryQueueNums <= 0: answer 0, do nothing ─▶ %RETRY%<group> exists
    ─▶ load the message at header.offset (SYSTEM_ERROR if absent) ─▶ destination:
         reconsumeTimes >= max  or  delayLevel < 0   ─▶ %DLQ%<group> queue 0, no delay
         otherwise (delayLevel 0 ─▶ 3 + reconsumeTimes) ─▶ %RETRY%<group>, DELAY = level
    ─▶ new message: same body, flags, born fields and properties; reconsumeTimes + 1;
       RETRY_TOPIC = the original topic (kept if already set); ORIGIN_MESSAGE_ID = the first
       msgId; RECONSUME_TIME = the new count ─▶ parked by the DelayRouter ─▶ stored
    ─▶ durability (flush, SYNC_MASTER ack: durability.py) ─▶ 0 or its error code

A slave refuses with SERVICE_NOT_AVAILABLE (the client then sends the message to the retry topic
through its producer, which writes to a master).

`max` is the header's maxReconsumeTimes when present (ali-ons and Java send it), else the group's
retryMaxTimes (16). The same limit applies to a direct send to %RETRY%<group> whose
reconsumeTimes has reached it (§4.1 step 5): `redirect_exhausted` sends it to the DLQ instead.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Final

from tidemq.broker.access import NO_ACL, AccessGate
from tidemq.broker.config import BrokerConfig
from tidemq.broker.durability import Durability
from tidemq.broker.groups import SubscriptionGroupConfig, SubscriptionGroupTable
from tidemq.broker.handlers.common import (
    BrokerAddress,
    Refusal,
    guarded,
    slave_refusal_remark,
)
from tidemq.broker.restore import message_from_stored
from tidemq.broker.schedule import DelayRefused, DelayRouter
from tidemq.broker.stats import BrokerStats
from tidemq.broker.topics import PERM_DEFAULT, TopicTable
from tidemq.errors import CorruptRecordError
from tidemq.protocol import record as rec
from tidemq.protocol.bodies import TopicConfig
from tidemq.protocol.codes import VERSION_V3_4_9, RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import ConsumerSendMsgBackRequestHeader
from tidemq.protocol.message import (
    DELAY,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    Perm,
    decode_properties,
    dlq_topic,
    encode_properties,
    group_of_retry_topic,
    offset_msg_id,
    validate_group,
)
from tidemq.protocol.names import DLQ_GROUP_TOPIC_PREFIX
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import HandlerTable
from tidemq.security.permissions import Perm as AclPerm
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore

log = logging.getLogger(__name__)

# delayLevel 0 from the client means "the broker picks": 3 + reconsumeTimes (first retry 10 s).
RETRY_DELAY_LEVEL_BASE: Final = 3
DLQ_QUEUE_NUMS: Final = 1


def retry_limit(group: SubscriptionGroupConfig, from_request: int | None) -> int:
    return from_request if from_request is not None and from_request >= 0 else group.retry_max_times


def header_max_reconsume_times(max_reconsume_times: int | None, version: int) -> int | None:
    """The header's maxReconsumeTimes, honoured only from clients that send it on purpose.

    RocketMQ reads it only from V3_4_9 (121) on; older clients leave it unset or at a default
    that must not override the group's retryMaxTimes.
    """
    return max_reconsume_times if version >= VERSION_V3_4_9 else None


def redirect_exhausted(
    message: MessageToStore,
    max_reconsume_times: int | None,
    groups: SubscriptionGroupTable,
    topics: TopicTable,
) -> MessageToStore:
    """A direct send to %RETRY%<group> past the retry limit goes to %DLQ%<group>, undelayed."""
    group_name = group_of_retry_topic(message.topic)
    if group_name is None:
        return message
    group = groups.find_or_create(group_name)
    if group is None or message.reconsume_times < retry_limit(group, max_reconsume_times):
        return message
    dlq = topics.ensure(dlq_topic(group_name), DLQ_QUEUE_NUMS, PERM_DEFAULT)
    props = decode_properties(message.properties)
    props.pop(DELAY, None)
    log.info("%s: reconsumeTimes %d, to the DLQ", message.topic, message.reconsume_times)
    return dataclasses.replace(
        message, topic=dlq.topic_name, queue_id=0, properties=encode_properties(props)
    )


class SendBackHandler:
    def __init__(
        self,
        config: BrokerConfig,
        address: BrokerAddress,
        store: FileMessageStore,
        topics: TopicTable,
        groups: SubscriptionGroupTable,
        durability: Durability,
        delays: DelayRouter,
        gate: AccessGate = NO_ACL,
        stats: BrokerStats | None = None,
    ) -> None:
        """`stats`: where a move to the DLQ is counted."""
        self._gate = gate
        self._stats = stats
        self._config = config
        self._address = address
        self._store = store
        self._topics = topics
        self._groups = groups
        self._durability = durability
        self._delays = delays
        self._spread = itertools.count()

    def register(self, table: HandlerTable) -> None:
        table.register(RequestCode.CONSUMER_SEND_MSG_BACK, guarded(self.handle))

    async def handle(
        self, connection: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        header = ConsumerSendMsgBackRequestHeader.from_fields(request.ext_fields)
        group = self._writable_group(header.group)
        if group.retry_queue_nums <= 0:
            return request.response(ResponseCode.SUCCESS)
        retry = self._topics.ensure_retry_topic(header.group, group.retry_queue_nums)
        original = self._stored_original(header.offset)
        if self._gate.enabled:
            self._check_access(connection, request, header, original)
        max_times = header_max_reconsume_times(header.max_reconsume_times, request.version)
        message = self._resend_message(header, original, group, retry, max_times)
        destination = message.topic  # the retry or DLQ topic, before a delay parks it
        try:
            message = self._delays.route(message)
        except DelayRefused as exc:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        result = self._store.put_message(message)
        if not result.ok:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR,
                f"send back to {destination} failed: {result.status.value} {result.error}",
            )
        if self._stats is not None and destination.startswith(DLQ_GROUP_TOPIC_PREFIX):
            self._stats.to_dlq(header.group, header.origin_topic or original.topic)
        code, remark = await self._durability.wait_durable(result.physical_offset + result.size)
        return request.response(code, remark=remark or None)

    def _writable_group(self, group_name: str) -> SubscriptionGroupConfig:
        """The consumer group, created if allowed, on a broker that takes writes; else a Refusal."""
        validate_group(group_name)  # send-back may create the group: only legal names
        if self._config.is_slave:
            raise Refusal(
                ResponseCode.SERVICE_NOT_AVAILABLE, slave_refusal_remark(self._config.broker_name)
            )
        if not Perm.is_writable(self._config.broker_permission):
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self._config.broker_name}] sending message is forbidden",
            )
        group = self._groups.find_or_create(group_name)
        if group is None:
            raise Refusal(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group_name}] does not exist",
            )
        return group

    def _stored_original(self, offset: int) -> rec.StoredMessage:
        """The message being handed back, read at its commit-log offset; else SYSTEM_ERROR."""
        data = self._store.read_record(offset, from_peer=True)
        try:
            if data is None:
                raise CorruptRecordError("no record there")
            return rec.decode_record(data)
        except CorruptRecordError as exc:
            raise Refusal(
                ResponseCode.SYSTEM_ERROR, f"look message by offset {offset} failed: {exc}"
            ) from None

    def _check_access(
        self,
        connection: Connection,
        request: RemotingCommand,
        header: ConsumerSendMsgBackRequestHeader,
        original: rec.StoredMessage,
    ) -> None:
        """Under ACL: SUB on the stored message's real topic (its RETRY_TOPIC, else its topic),
        which the header's originTopic, when given, must be. One remark for both refusals: an
        account may not learn the topic of a message it may not read."""
        real = original.property_map().get(RETRY_TOPIC) or original.topic
        shown = "the message at this offset"
        self._gate.require(connection, request, real, AclPerm.SUB, shown=shown)
        if header.origin_topic and header.origin_topic != real:
            raise Refusal(
                ResponseCode.NO_PERMISSION,
                f"originTopic {header.origin_topic} is not the topic of {shown}",
            )

    def _resend_message(
        self,
        header: ConsumerSendMsgBackRequestHeader,
        original: rec.StoredMessage,
        group: SubscriptionGroupConfig,
        retry: TopicConfig,
        max_times: int | None,
    ) -> MessageToStore:
        """The copy to store: to the retry topic with a delay level, or to the DLQ undelayed."""
        props = decode_properties(rec.strip_crc_property(original.properties))
        props.pop(TAGS_CODE_PROPERTY, None)
        props.setdefault(RETRY_TOPIC, header.origin_topic or original.topic)
        if not props.get(ORIGIN_MESSAGE_ID):
            host, port = original.store_host
            props[ORIGIN_MESSAGE_ID] = header.origin_msg_id or offset_msg_id(
                host, port, original.physical_offset
            )
        times = original.reconsume_times
        delay_level = header.delay_level
        if times >= retry_limit(group, max_times) or delay_level < 0:
            topic = self._topics.ensure(dlq_topic(header.group), DLQ_QUEUE_NUMS, PERM_DEFAULT)
            queue_id = 0
            delay_level = 0
        else:
            topic = retry
            queue_id = next(self._spread) % max(1, retry.write_queue_nums)
            if delay_level == 0:
                delay_level = RETRY_DELAY_LEVEL_BASE + times
        if delay_level > 0:
            props[DELAY] = str(delay_level)
        else:
            props.pop(DELAY, None)
        props[RECONSUME_TIME] = str(times + 1)
        return message_from_stored(
            original,
            topic=topic.topic_name,
            queue_id=queue_id,
            properties=props,
            store_host=(self._address.host, self._address.port),
            reconsume_times=times + 1,
        )
