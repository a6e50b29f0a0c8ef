"""One coroutine per broker request a consumer or admin tool makes, over a ClientInstance.

Each turns a typed header into a RemotingCommand, sends it to a broker of the queue's group and
turns the answer into Python values, raising `tidemq.errors.BrokerError` subclasses for codes the
caller does not expect. Reads (pulls, offset commits and queries, queue offsets, consumer lists)
go where the instance's read router says: the master while it answers, else a slave
(read_route.py); writes and locks (send-back, LOCK/UNLOCK_BATCH_MQ) go to the master only, as
RocketMQ 4.x slaves refuse them. The push consumer, the pull consumer and the admin client share
them, so the wire use of each code lives in one place. A pull's answer is decoded by
pull_answer.py (pure).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from tidemq.errors import BrokerError, ClientClosedError, ClientError, ProtocolError, error_for_code
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import (
    ConsumerListBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    UnlockBatchRequestBody,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    EarliestMsgStoretimeResponseHeader,
    GetConsumerListByGroupRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullSysFlag,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

from .instance import ClientInstance
from .message import MessageExt, PullResult
from .pull_answer import decode_pull_response
from .read_route import BrokerTarget
from .route_cache import MASTER_ID
from .selector import MessageSelector

logger = logging.getLogger(__name__)


def _checked(response: RemotingCommand, *ok: int) -> RemotingCommand:
    if response.code not in (ResponseCode.SUCCESS, *ok):
        raise error_for_code(response.code, response.remark)
    return response


async def invoke_read(
    instance: ClientInstance,
    target: BrokerTarget,
    cmd: RemotingCommand,
    timeout_ms: float | None = None,
) -> RemotingCommand:
    """Request to `target` (from `instance.reads`); the raw response (any code). A transport
    failure makes later reads of its group skip that address until a probe finds it answering.

    Raises:
        ClientError: no answer (transport).
    """
    timeout = instance.request_timeout_ms if timeout_ms is None else timeout_ms
    try:
        response = await instance.remoting.invoke(target.addr, cmd, timeout)
    except ClientClosedError:
        raise
    except ClientError:
        instance.reads.record(target, failed=True)
        raise
    instance.reads.record(target, failed=False)
    return response


async def pull(
    instance: ClientInstance,
    mq: MessageQueue,
    *,
    group: str,
    expression: str,
    offset: int,
    max_nums: int,
    sys_flag: int,
    commit_offset: int = 0,
    suspend_ms: int = 0,
    timeout_ms: float,
    sub_version: int = 0,
    broker_id: int = MASTER_ID,
    expression_type: str = pm.EXPRESSION_TYPE_TAG,
) -> PullResult:
    """PULL_MESSAGE from the broker of `mq`'s group the read router picks, preferring
    `broker_id` (the queue's last suggestWhichBrokerId). A pull sent to a slave has its
    COMMIT_OFFSET flag cleared: slaves take offsets from explicit commits only (as upstream).
    The client re-checks tags of a TAG `expression`; a SQL92 one is the broker's alone.
    """
    target = instance.reads.target(mq.broker_name, broker_id)
    if target.is_slave:
        sys_flag &= ~int(PullSysFlag.COMMIT_OFFSET)
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=mq.topic,
        queue_id=mq.queue_id,
        queue_offset=offset,
        max_msg_nums=max_nums,
        sys_flag=sys_flag,
        commit_offset=commit_offset,
        suspend_timeout_millis=suspend_ms,
        subscription=expression,
        sub_version=sub_version,
        expression_type=expression_type,
    )
    tag_filter = MessageSelector(expression_type, expression).tag_filter()
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=header.to_fields())
    response = await invoke_read(instance, target, cmd, timeout_ms)
    result = decode_pull_response(
        response, mq, tag_filter, requested_offset=offset, max_nums=max_nums
    )
    if result is None:
        # The body's framing broke at its first record: one message at a time finds its end.
        header = dataclasses.replace(header, max_msg_nums=1)
        cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=header.to_fields())
        response = await invoke_read(instance, target, cmd, timeout_ms)
        result = decode_pull_response(response, mq, tag_filter, requested_offset=offset)
    assert result is not None  # one message asked for: never None
    return result


async def query_consumer_offset(instance: ClientInstance, group: str, mq: MessageQueue) -> int:
    """The group's stored next offset for `mq`, or -1 if the broker has none (code 22)."""
    header = QueryConsumerOffsetRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id
    )
    cmd = RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=header.to_fields())
    target = instance.reads.target(mq.broker_name)
    response = _checked(await invoke_read(instance, target, cmd), ResponseCode.QUERY_NOT_FOUND)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return -1
    return OffsetResponseHeader.from_fields(response.ext_fields).offset


def _offset_update(group: str, mq: MessageQueue, offset: int) -> RemotingCommand:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
    )
    return RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=header.to_fields())


async def update_consumer_offset(
    instance: ClientInstance, group: str, mq: MessageQueue, offset: int
) -> BrokerTarget:
    """Store the group's next offset for `mq` in its group's master whenever the route lists
    one, whatever the read fault tracker says; in a slave only if that request fails at the
    transport or the route lists no master (read_route.py, `ReadRouter.commit_target`). A
    slave keeps it only until its copy of the master's offsets replaces it: commit there again
    once the master is back. Returns the broker that stored it.

    Raises:
        ClientError: no broker of the group answered (the master's failure if none other).
        BrokerError: the broker answered with an error code.
    """
    target = instance.reads.commit_target(mq.broker_name)
    try:
        _checked(await invoke_read(instance, target, _offset_update(group, mq, offset)))
    except ClientClosedError:
        raise
    except ClientError as exc:
        fallback = instance.reads.fallback(target)
        if fallback is None:
            raise
        logger.info(
            "%s: commit %s=%d: %s failed (%s), storing it in %s",
            group,
            mq,
            offset,
            target.addr,
            exc,
            fallback.addr,
        )
        _checked(await invoke_read(instance, fallback, _offset_update(group, mq, offset)))
        return fallback
    return target


async def commit_on_master(
    instance: ClientInstance,
    group: str,
    mq: MessageQueue,
    offset: int,
    timeout_ms: float | None = None,
) -> bool:
    """Store the group's next offset for `mq` in its group's master only (an offset a slave
    took must reach it): whether the master stored it. False when the route lists no master or
    the master did not answer.

    Raises:
        BrokerError: the master answered with an error code.
    """
    addr = instance.routes.master_address(mq.broker_name)
    if addr is None:
        return False
    target = BrokerTarget(mq.broker_name, MASTER_ID, addr)
    try:
        response = await invoke_read(
            instance, target, _offset_update(group, mq, offset), timeout_ms
        )
    except ClientClosedError:
        raise
    except ClientError as exc:
        logger.debug("%s: commit %s=%d on %s: %s", group, mq, offset, addr, exc)
        return False
    _checked(response)
    return True


async def _offset_request(instance: ClientInstance, mq: MessageQueue, cmd: RemotingCommand) -> int:
    # Upstream asks the master only (MQAdminImpl uses findBrokerAddressInPublish); a slave's
    # consume queues answer as well while its master is down, so TideMQ reads these there too.
    target = instance.reads.target(mq.broker_name)
    response = _checked(await invoke_read(instance, target, cmd))
    return OffsetResponseHeader.from_fields(response.ext_fields).offset


async def max_offset(instance: ClientInstance, mq: MessageQueue) -> int:
    """The next offset to be written in `mq` (its message count since the start)."""
    header = GetMaxOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
    return await _offset_request(
        instance,
        mq,
        RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=header.to_fields()),
    )


async def min_offset(instance: ClientInstance, mq: MessageQueue) -> int:
    header = GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
    return await _offset_request(
        instance,
        mq,
        RemotingCommand(code=RequestCode.GET_MIN_OFFSET, ext_fields=header.to_fields()),
    )


async def search_offset(instance: ClientInstance, mq: MessageQueue, timestamp_ms: int) -> int:
    """The offset of the message stored nearest to `timestamp_ms` (§4.7)."""
    header = SearchOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms)
    cmd = RemotingCommand(
        code=RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext_fields=header.to_fields()
    )
    return await _offset_request(instance, mq, cmd)


async def earliest_store_time(instance: ClientInstance, mq: MessageQueue) -> int:
    header = GetEarliestMsgStoretimeRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
    cmd = RemotingCommand(
        code=RequestCode.GET_EARLIEST_MSG_STORETIME, ext_fields=header.to_fields()
    )
    response = _checked(await invoke_read(instance, instance.reads.target(mq.broker_name), cmd))
    return EarliestMsgStoretimeResponseHeader.from_fields(response.ext_fields).timestamp


async def consumer_ids(instance: ClientInstance, group: str, target: BrokerTarget) -> list[str]:
    """The ids of the group's live consumers, as one broker knows them (a slave knows them
    from the consumers' heartbeats too), sorted."""
    header = GetConsumerListByGroupRequestHeader(consumer_group=group)
    cmd = RemotingCommand(
        code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields=header.to_fields()
    )
    response = _checked(await invoke_read(instance, target, cmd))
    return sorted(ConsumerListBody.from_json(response.body).consumer_id_list)


async def lock_batch(
    instance: ClientInstance, group: str, broker_name: str, mqs: Iterable[MessageQueue]
) -> set[MessageQueue]:
    """LOCK_BATCH_MQ: the subset of `mqs` (all on `broker_name`) now locked by this client."""
    body = LockBatchRequestBody(
        consumer_group=group, client_id=instance.client_id, mq_set=frozenset(mqs)
    )
    cmd = RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=body.to_json())
    response = _checked(await instance.invoke_broker(broker_name, cmd))
    return set(LockBatchResponseBody.from_json(response.body).lock_ok_mq_set)


async def unlock_batch(
    instance: ClientInstance, group: str, broker_name: str, mqs: Iterable[MessageQueue]
) -> None:
    body = UnlockBatchRequestBody(
        consumer_group=group, client_id=instance.client_id, mq_set=frozenset(mqs)
    )
    cmd = RemotingCommand(code=RequestCode.UNLOCK_BATCH_MQ, body=body.to_json())
    _checked(await instance.invoke_broker(broker_name, cmd))


async def send_back(
    instance: ClientInstance,
    group: str,
    message: MessageExt,
    *,
    delay_level: int,
    max_reconsume_times: int,
) -> None:
    """CONSUMER_SEND_MSG_BACK: the broker re-delivers `message` later via %RETRY%<group>
    (delay level 0: the broker picks 3 + reconsume times) or parks it in %DLQ%<group> (-1)."""
    header = ConsumerSendMsgBackRequestHeader(
        offset=message.commit_log_offset,
        group=group,
        delay_level=delay_level,
        origin_msg_id=message.properties.get(pm.ORIGIN_MESSAGE_ID) or message.msg_id,
        origin_topic=message.topic,
        max_reconsume_times=max_reconsume_times,
    )
    cmd = RemotingCommand(code=RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=header.to_fields())
    _checked(await instance.invoke_broker(message.broker_name, cmd))


def _by_broker(mqs: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    grouped: dict[str, list[MessageQueue]] = {}
    for mq in mqs:
        grouped.setdefault(mq.broker_name, []).append(mq)
    return dict(sorted(grouped.items()))


async def lock_queues(
    instance: ClientInstance, group: str, mqs: Iterable[MessageQueue]
) -> set[MessageQueue]:
    """Lock `mqs` (any brokers) for this client; the locked subset. Failures are logged."""
    locked: set[MessageQueue] = set()
    for broker_name, queues in _by_broker(mqs).items():
        try:
            locked |= await lock_batch(instance, group, broker_name, queues)
        except (ClientError, BrokerError, ProtocolError) as exc:
            logger.warning("%s: lock on %s failed: %s", group, broker_name, exc)
    return locked


async def unlock_queues(instance: ClientInstance, group: str, mqs: Iterable[MessageQueue]) -> None:
    for broker_name, queues in _by_broker(mqs).items():
        try:
            await unlock_batch(instance, group, broker_name, queues)
        except (ClientError, BrokerError, ProtocolError) as exc:
            logger.warning("%s: unlock on %s failed: %s", group, broker_name, exc)
