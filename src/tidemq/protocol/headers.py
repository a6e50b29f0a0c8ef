"""Every typed request and response header of the protocol, importable from one place.

The headers are defined in three modules by reason to change, and re-exported here:

- `headers_send`: SEND_MESSAGE 10/310/320, PULL_MESSAGE, END_TRANSACTION, CHECK_TRANSACTION_STATE;
- `headers_query`: consumer offsets, offset lookups, view/query by id or key, client registration,
  send-back;
- `headers_admin`: topic administration and the name server.

Each header is `@dataclass(frozen=True, slots=True, kw_only=True)` with `to_fields()` (extFields:
every value a string, None fields omitted) and `from_fields(fields)` (lenient inbound parsing per
remoting.md §1.4; ProtocolError naming the missing or invalid wire field):

    header = PullMessageRequestHeader.from_fields(request.ext_fields)
    response = request.response(0, PullMessageResponseHeader(...).to_fields(), body)
"""

from __future__ import annotations

from tidemq.protocol._fields import PLAIN_DIGITS_MAX
from tidemq.protocol.headers_admin import (
    TOPIC_FILTER_MULTI_TAG,
    TOPIC_FILTER_SINGLE_TAG,
    AddWritePermOfBrokerRequestHeader,
    AddWritePermOfBrokerResponseHeader,
    CreateTopicRequestHeader,
    DeleteKVConfigRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    GetKVConfigRequestHeader,
    GetKVConfigResponseHeader,
    GetKVListByNamespaceRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    GetTopicStatsInfoRequestHeader,
    PutKVConfigRequestHeader,
    QueryConsumeTimeSpanRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    QueryTopicConsumeByWhoRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    ResetOffsetRequestHeader,
    UnregisterBrokerRequestHeader,
    ViewBrokerStatsDataRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)
from tidemq.protocol.headers_query import (
    UNIQUE_KEY_QUERY_FIELD,
    ConsumerSendMsgBackRequestHeader,
    EarliestMsgStoretimeResponseHeader,
    GetConsumerListByGroupRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from tidemq.protocol.headers_send import (
    DEFAULT_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
    MSG_REGION_DEFAULT,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    PullSysFlag,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    parse_send_response,
    send_fields_v2,
)
from tidemq.protocol.headers_tx import (
    CheckTransactionStateRequestHeader,
    EndBatchRequestHeader,
    EndTransactionRequestHeader,
    end_transaction_fields,
)

__all__ = [
    "DEFAULT_TOPIC",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "MSG_REGION_DEFAULT",
    "PLAIN_DIGITS_MAX",
    "TOPIC_FILTER_MULTI_TAG",
    "TOPIC_FILTER_SINGLE_TAG",
    "UNIQUE_KEY_QUERY_FIELD",
    "AddWritePermOfBrokerRequestHeader",
    "AddWritePermOfBrokerResponseHeader",
    "CheckTransactionStateRequestHeader",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteKVConfigRequestHeader",
    "DeleteSubscriptionGroupRequestHeader",
    "DeleteTopicRequestHeader",
    "EarliestMsgStoretimeResponseHeader",
    "EndBatchRequestHeader",
    "EndTransactionRequestHeader",
    "GetConsumeStatsRequestHeader",
    "GetConsumerConnectionListRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "GetConsumerRunningInfoRequestHeader",
    "GetEarliestMsgStoretimeRequestHeader",
    "GetKVConfigRequestHeader",
    "GetKVConfigResponseHeader",
    "GetKVListByNamespaceRequestHeader",
    "GetMaxOffsetRequestHeader",
    "GetMinOffsetRequestHeader",
    "GetProducerConnectionListRequestHeader",
    "GetRouteInfoRequestHeader",
    "GetTopicStatsInfoRequestHeader",
    "GetTopicsByClusterRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "OffsetResponseHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "PullSysFlag",
    "PutKVConfigRequestHeader",
    "QueryConsumeTimeSpanRequestHeader",
    "QueryConsumerOffsetRequestHeader",
    "QueryConsumerOffsetResponseHeader",
    "QueryDataVersionRequestHeader",
    "QueryDataVersionResponseHeader",
    "QueryMessageRequestHeader",
    "QueryMessageResponseHeader",
    "QueryTopicConsumeByWhoRequestHeader",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "ResetOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "SendMessageRequestHeader",
    "SendMessageResponseHeader",
    "UnregisterBrokerRequestHeader",
    "UnregisterClientRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ViewBrokerStatsDataRequestHeader",
    "ViewMessageRequestHeader",
    "WipeWritePermOfBrokerRequestHeader",
    "WipeWritePermOfBrokerResponseHeader",
    "end_transaction_fields",
    "parse_send_response",
    "send_fields_v2",
]
