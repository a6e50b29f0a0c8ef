"""Which resources a request names and the permission each needs (spec security.md §1), and
which codes only admin accounts may send: upstream PlainAccessValidator.parse and
Permission.ADMIN_CODE, plus what TideMQ adds.

    SEND_MESSAGE / _V2 / SEND_BATCH_MESSAGE  topic PUB (V1 field "topic", V2 field "b": the
                                             spelling the send handler reads, is_v2_send);
                                             to %RETRY%G: group G SUB (upstream 4.9)
    CONSUMER_SEND_MSG_BACK                   originTopic PUB, group SUB; the handler then
                                             needs SUB on the stored message's real topic
    PULL_MESSAGE                             topic SUB, consumerGroup SUB
    QUERY_MESSAGE                            topic SUB
    HEART_BEAT                               each consumer group SUB and each topic it
                                             subscribes SUB; each producer group not DENY
                                             (PUB or SUB; the clients' own
                                             CLIENT_INNER_PRODUCER excepted) (JSON body)
    UNREGISTER_CLIENT                        consumerGroup SUB (when given)
    GET_CONSUMER_LIST_BY_GROUP               consumerGroup SUB
    UPDATE_CONSUMER_OFFSET                   consumerGroup SUB, topic SUB
    QUERY_CONSUMER_OFFSET                    consumerGroup SUB, topic SUB  (TideMQ; upstream
                                             checks nothing: another group's progress is
                                             that group's business)
    GET_MAX_OFFSET / GET_MIN_OFFSET /        topic SUB  (TideMQ, as every read below: a
    SEARCH_OFFSET_BY_TIMESTAMP /             topic's or group's figures are its readers')
    GET_EARLIEST_MSG_STORETIME /
    GET_TOPIC_STATS_INFO
    GET_CONSUME_STATS                        consumerGroup SUB, topic SUB (when given)
    GET_CONSUMER_CONNECTION_LIST /           consumerGroup SUB
    GET_CONSUMER_RUNNING_INFO
    QUERY_TOPIC_CONSUME_BY_WHO /             topic SUB
    QUERY_CONSUME_TIME_SPAN
    LOCK_BATCH_MQ / UNLOCK_BATCH_MQ          the body's consumerGroup SUB (JSON body)
    END_TRANSACTION                          producerGroup not DENY; the handler then needs
                                             PUB on the half's REAL_TOPIC (the header's
                                             optional topic is ignored)
    checked by the handler (HANDLER_CHECKED) the resource is in the data the request names,
                                             read first: VIEW_MESSAGE_BY_ID (SUB on the
                                             record's topic), CONSUMER_SEND_MSG_BACK,
                                             END_TRANSACTION (above), TIDEMQ_END_BATCH (PUB
                                             on the topic of every half the batch resolves)
    system topics (is_system_resource)       SCHEDULE_TOPIC_XXXX, the transaction and batch
                                             topics, RMQ_SYS_* / rmq_sys_*, %DLQ%*, TBW102,
                                             SELF_TEST_TOPIC, OFFSET_MOVED_EVENT, and the
                                             groups CID_RMQ_SYS_*: never under
                                             defaultTopicPerm / defaultGroupPerm: an admin
                                             account or an explicit entry (acl.py)
    admin only                               upstream's five (create/delete topic, create/
                                             delete group, UPDATE_BROKER_CONFIG), plus
                                             INVOKE_BROKER_TO_RESET_OFFSET,
                                             GET_PRODUCER_CONNECTION_LIST,
                                             VIEW_BROKER_STATS_DATA, the slave's
                                             metadata copies (GET_ALL_TOPIC_CONFIG,
                                             GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
                                             GET_ALL_SUBSCRIPTIONGROUP_CONFIG) and
                                             TIDEMQ_TX_LIST (other groups' messages),
                                             TIDEMQ_TX_STATS (every group's figures)
    SIGNATURE_ONLY                           a valid signature, no resource: the broker's
                                             own settings (secrets redacted) and figures

A group is named by its retry topic (acl_file.group_resource), so the account's groupPerms
decide it. Only HEART_BEAT parses a body, and only after the signature has been checked
(acl.py), every 30 s per client: the send path reads one extField.

The name server (NAMESRV_POLICY): nothing is open. Route, cluster, topic-list and KV reads
(NAMESRV_READ_CODES) need a valid signature of any account: the lists name every topic, and
every client with credentials (ours, Java's, the C++ client) signs what it sends a name server
too. Every other code needs an admin account: REGISTER_BROKER, UNREGISTER_BROKER,
QUERY_DATA_VERSION (it refreshes a broker's liveness: open, anyone could keep a dead broker in
the routes), KV writes, topic deletion, write-permission changes, unknown codes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from tidemq.protocol.bodies_client import HeartbeatData, LockBatchRequestBody
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_send import is_v2_send
from tidemq.protocol.names import (
    CID_RMQ_SYS_PREFIX,
    CLIENT_INNER_PRODUCER_GROUP,
    DLQ_GROUP_TOPIC_PREFIX,
    OFFSET_MOVED_EVENT,
    RMQ_SYS_TRACE_TOPIC,
    RMQ_SYS_TRANS_BATCH_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC_XXXX,
    SELF_TEST_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    TBW102,
    TRANS_CHECK_MAX_TIME_TOPIC,
    is_retry_topic,
)
from tidemq.security.acl_file import group_resource
from tidemq.security.permissions import Perm

# (resource, permission needed): a topic by name, a group as group_resource(group); the
# permission a plain int of Perm bits (permissions.check_permission).
Need = tuple[str, int]
_PUB: Final = int(Perm.PUB)
_SUB: Final = int(Perm.SUB)
_ANY: Final = int(Perm.ANY)  # PUB or SUB: anything but DENY (and "no permission")
_Finder = Callable[[Mapping[str, str], bytes], Sequence[Need]]
_NOTHING: Final[tuple[Need, ...]] = ()


def _send(fields: Mapping[str, str], body: bytes) -> Sequence[Need]:
    topic = fields.get("b") if is_v2_send(fields) else fields.get("topic")
    if not topic:
        return _NOTHING
    # A send to %RETRY%G is a consumer's retry (its resource is group G): SUB, as upstream 4.9.
    return [(topic, _SUB if is_retry_topic(topic) else _PUB)]


def _needs(fields: Mapping[str, str], *spec: tuple[str, int, bool]) -> list[Need]:
    """(field, perm, is_group) for each field present in `fields`."""
    needs: list[Need] = []
    for name, perm, is_group in spec:
        value = fields.get(name)
        if value:
            needs.append((group_resource(value) if is_group else value, perm))
    return needs


def _send_back(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("originTopic", _PUB, False), ("group", _SUB, True))


def _pull(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("topic", _SUB, False), ("consumerGroup", _SUB, True))


def _topic_sub(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("topic", _SUB, False))


def _group_sub(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("consumerGroup", _SUB, True))


def _offsets(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("consumerGroup", _SUB, True), ("topic", _SUB, False))


def _consume_stats(fields: Mapping[str, str], body: bytes) -> list[Need]:
    return _needs(fields, ("consumerGroup", _SUB, True), ("topic", _SUB, False))


def _end_transaction(fields: Mapping[str, str], body: bytes) -> list[Need]:
    # The half's real topic is checked by the handler once it has read the half.
    return _needs(fields, ("producerGroup", _ANY, True))


def _heart_beat(fields: Mapping[str, str], body: bytes) -> list[Need]:
    """Raises ProtocolError for a body that is not a heartbeat (answered SYSTEM_ERROR)."""
    data = HeartbeatData.from_json(body)
    needs: list[Need] = []
    for consumer in data.consumer_data_set:
        needs.append((group_resource(consumer.group_name), _SUB))
        needs.extend((sub.topic, _SUB) for sub in consumer.subscription_data_set)
    needs.extend(
        (group_resource(producer.group_name), _ANY)
        for producer in data.producer_data_set
        if producer.group_name != CLIENT_INNER_PRODUCER_GROUP
    )
    return needs


def _lock_batch(fields: Mapping[str, str], body: bytes) -> list[Need]:
    """Raises ProtocolError for a body that is not a lock request (answered SYSTEM_ERROR);
    UnlockBatchRequestBody reads the same consumerGroup."""
    return [(group_resource(LockBatchRequestBody.from_json(body).consumer_group), _SUB)]


BROKER_RESOURCES: Final[Mapping[int, _Finder]] = {
    RequestCode.SEND_MESSAGE: _send,
    RequestCode.SEND_MESSAGE_V2: _send,
    RequestCode.SEND_BATCH_MESSAGE: _send,
    RequestCode.CONSUMER_SEND_MSG_BACK: _send_back,
    RequestCode.PULL_MESSAGE: _pull,
    RequestCode.QUERY_MESSAGE: _topic_sub,
    RequestCode.HEART_BEAT: _heart_beat,
    RequestCode.UNREGISTER_CLIENT: _group_sub,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _group_sub,
    RequestCode.UPDATE_CONSUMER_OFFSET: _offsets,
    RequestCode.QUERY_CONSUMER_OFFSET: _offsets,
    RequestCode.END_TRANSACTION: _end_transaction,
    RequestCode.GET_MAX_OFFSET: _topic_sub,
    RequestCode.GET_MIN_OFFSET: _topic_sub,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _topic_sub,
    RequestCode.GET_EARLIEST_MSG_STORETIME: _topic_sub,
    RequestCode.GET_TOPIC_STATS_INFO: _topic_sub,
    RequestCode.GET_CONSUME_STATS: _consume_stats,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: _group_sub,
    RequestCode.GET_CONSUMER_RUNNING_INFO: _group_sub,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: _topic_sub,
    RequestCode.QUERY_CONSUME_TIME_SPAN: _topic_sub,
    RequestCode.LOCK_BATCH_MQ: _lock_batch,
    RequestCode.UNLOCK_BATCH_MQ: _lock_batch,
}

# Codes whose resource is in the data the request names (a record, a half, a batch's halves):
# the handler reads it, then asks BrokerAcl's gate (broker/access.py) for the permission.
HANDLER_CHECKED: Final = frozenset(
    {
        RequestCode.VIEW_MESSAGE_BY_ID,
        RequestCode.CONSUMER_SEND_MSG_BACK,
        RequestCode.END_TRANSACTION,
        RequestCode.TIDEMQ_END_BATCH,
    }
)
# Broker codes that name no topic or group: a valid signature is all they need.
SIGNATURE_ONLY: Final = frozenset(
    {
        RequestCode.GET_BROKER_CONFIG,  # secrets redacted (config_keys)
        RequestCode.GET_BROKER_RUNTIME_INFO,  # the broker's own figures, no names
    }
)

# System topics (and groups, by their retry topic) that no default permission reaches.
_SYSTEM_TOPICS: Final = frozenset(
    {
        TBW102,
        SCHEDULE_TOPIC_XXXX,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        RMQ_SYS_TRANS_BATCH_TOPIC,
        RMQ_SYS_TRACE_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)
_SYSTEM_PREFIXES: Final = (
    "RMQ_SYS_",
    SYSTEM_TOPIC_PREFIX,
    DLQ_GROUP_TOPIC_PREFIX,
    group_resource(CID_RMQ_SYS_PREFIX),
)


def is_system_resource(resource: str) -> bool:
    """A system topic or group: an admin account's, or an explicit entry's (never a default)."""
    return resource in _SYSTEM_TOPICS or resource.startswith(_SYSTEM_PREFIXES)


# Upstream's Permission.ADMIN_CODE.
UPSTREAM_ADMIN_CODES: Final = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
    }
)
BROKER_ADMIN_CODES: Final = UPSTREAM_ADMIN_CODES | {
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.GET_PRODUCER_CONNECTION_LIST,  # client addresses of any producer group
    RequestCode.VIEW_BROKER_STATS_DATA,  # figures of any topic or group
    RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_ALL_CONSUMER_OFFSET,
    RequestCode.GET_ALL_DELAY_OFFSET,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    RequestCode.TIDEMQ_TX_LIST,
    RequestCode.TIDEMQ_TX_STATS,
}

# What a name server answers any account that signs; the rest of its codes are admin's.
NAMESRV_READ_CODES: Final = frozenset(
    {
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.GET_TOPICS_BY_CLUSTER,
        RequestCode.GET_KV_CONFIG,
        RequestCode.GET_KVLIST_BY_NAMESPACE,
    }
)


@dataclass(frozen=True, slots=True)
class Policy:
    """What a server asks of a request: codes answered without any check (`open_codes`),
    codes for admin accounts (`admin_codes`, or when `admin_unless` is given every code not in
    it), and the resources of the rest (`resources`)."""

    name: str
    open_codes: frozenset[int] = frozenset()
    admin_codes: frozenset[int] = frozenset()
    admin_unless: frozenset[int] | None = None
    resources: Mapping[int, _Finder] = field(default_factory=dict)

    def needs_admin(self, code: int) -> bool:
        if self.admin_unless is not None and code not in self.admin_unless:
            return True
        return code in self.admin_codes

    def needs(self, cmd: RemotingCommand) -> Sequence[Need]:
        finder = self.resources.get(cmd.code)
        return finder(cmd.ext_fields, cmd.body) if finder is not None else _NOTHING


BROKER_POLICY: Final = Policy(
    "broker", admin_codes=frozenset(BROKER_ADMIN_CODES), resources=BROKER_RESOURCES
)
NAMESRV_POLICY: Final = Policy("namesrv", admin_unless=NAMESRV_READ_CODES)
