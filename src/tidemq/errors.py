"""The one exception tree of TideMQ.

    QueueError
      ProtocolError              malformed bytes from a peer (frame, header, record, body)
        CorruptRecordError       a stored record that fails its layout or CRC check
      StoreError                 the store refused an operation
        StoreFullError           disk usage above diskMaxUsedSpaceRatio
        MessageTooLargeError     body or properties over their limits
        ReplicaOffsetError       replication at an offset the log does not hold or continue from
        ReplicaCorruptError      a master's log bytes that are no valid record or blank marker
      BrokerError                a broker or name server answered with a non-success code
        (one subclass per ResponseCode, e.g. TopicNotExistError, SubscriptionParseFailedError;
         `error_for_code(code)` picks it)
      ClientError                failures on the client side
        RequestTimeoutError      no response within the request's timeout (retriable)
        ConnectionClosedError    the connection closed before the response came (retriable)
        NoRouteError             no name server knows the topic, or no queue is writable
        ClientClosedError        the producer or consumer was shut down

Assertions state invariants (programmer errors). Exceptions are for operating errors.
"""

from __future__ import annotations

from typing import ClassVar

from tidemq.protocol.codes import ResponseCode


class QueueError(Exception):
    """Root of every error TideMQ raises on purpose."""


class ProtocolError(QueueError):
    pass


class CorruptRecordError(ProtocolError):
    pass


class StoreError(QueueError):
    pass


class StoreFullError(StoreError):
    pass


class MessageTooLargeError(StoreError):
    pass


class ReplicaOffsetError(StoreError):
    """A slave's append not at its log's end, or a master's read of bytes it no longer (or
    does not yet) hold (store/replica.py)."""


class ReplicaCorruptError(StoreError):
    """Bytes from a master that are not a valid commit-log unit; the valid units before them
    were appended (store/replica.py)."""


class BrokerError(QueueError):
    """A server answered with `code`. `retriable` says whether another broker or try may succeed."""

    code: ClassVar[ResponseCode] = ResponseCode.SYSTEM_ERROR
    retriable: ClassVar[bool] = False

    def __init__(self, remark: str | None = None, *, code: int | None = None) -> None:
        self.remark = remark or ""
        self.response_code = int(code) if code is not None else int(self.code)
        name = _code_name(self.response_code)
        super().__init__(f"{name} ({self.response_code}): {self.remark}" if remark else name)


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"UNKNOWN_CODE_{code}"


class ClientError(QueueError):
    retriable: ClassVar[bool] = False


class RequestTimeoutError(ClientError):
    retriable = True


class ConnectionClosedError(ClientError):
    retriable = True


class ConnectFailedError(ConnectionClosedError):
    """No connection could be opened, so the request never left this process: the peer stored
    nothing (a caller that must not send twice, such as the Spark sink's halves, may resend)."""


class NoRouteError(ClientError):
    pass


class ClientClosedError(ClientError):
    pass


# One class per non-success ResponseCode, written out (not made at import time) so that
# `from tidemq.errors import TopicNotExistError` type-checks and editors complete it. Retriable
# ones mean "try again, maybe elsewhere": the client's send retry and fault avoidance use it.
# tests/test_errors.py checks that every code has exactly one class, named after it.


class SystemErrorError(BrokerError):
    code = ResponseCode.SYSTEM_ERROR
    retriable = True


class SystemBusyError(BrokerError):
    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupportedError(BrokerError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class TransactionFailedError(BrokerError):
    code = ResponseCode.TRANSACTION_FAILED


class FlushDiskTimeoutError(BrokerError):
    code = ResponseCode.FLUSH_DISK_TIMEOUT
    retriable = True


class SlaveNotAvailableError(BrokerError):
    code = ResponseCode.SLAVE_NOT_AVAILABLE
    retriable = True


class FlushSlaveTimeoutError(BrokerError):
    code = ResponseCode.FLUSH_SLAVE_TIMEOUT
    retriable = True


class MessageIllegalError(BrokerError):
    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailableError(BrokerError):
    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class VersionNotSupportedError(BrokerError):
    code = ResponseCode.VERSION_NOT_SUPPORTED


class NoPermissionError(BrokerError):
    code = ResponseCode.NO_PERMISSION


class TopicNotExistError(BrokerError):
    code = ResponseCode.TOPIC_NOT_EXIST
    retriable = True


class TopicExistAlreadyError(BrokerError):
    code = ResponseCode.TOPIC_EXIST_ALREADY


class PullNotFoundError(BrokerError):
    code = ResponseCode.PULL_NOT_FOUND


class PullRetryImmediatelyError(BrokerError):
    code = ResponseCode.PULL_RETRY_IMMEDIATELY


class PullOffsetMovedError(BrokerError):
    code = ResponseCode.PULL_OFFSET_MOVED


class QueryNotFoundError(BrokerError):
    code = ResponseCode.QUERY_NOT_FOUND


class SubscriptionParseFailedError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SubscriptionNotExistError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_EXIST


class SubscriptionNotLatestError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_LATEST


class SubscriptionGroupNotExistError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class FilterDataNotExistError(BrokerError):
    code = ResponseCode.FILTER_DATA_NOT_EXIST


class FilterDataNotLatestError(BrokerError):
    code = ResponseCode.FILTER_DATA_NOT_LATEST


class TransactionShouldCommitError(BrokerError):
    code = ResponseCode.TRANSACTION_SHOULD_COMMIT


class TransactionShouldRollbackError(BrokerError):
    code = ResponseCode.TRANSACTION_SHOULD_ROLLBACK


class TransactionStateUnknowError(BrokerError):
    code = ResponseCode.TRANSACTION_STATE_UNKNOW


class TransactionStateGroupWrongError(BrokerError):
    code = ResponseCode.TRANSACTION_STATE_GROUP_WRONG


class NoBuyerIdError(BrokerError):
    code = ResponseCode.NO_BUYER_ID


class NotInCurrentUnitError(BrokerError):
    code = ResponseCode.NOT_IN_CURRENT_UNIT


class ConsumerNotOnlineError(BrokerError):
    code = ResponseCode.CONSUMER_NOT_ONLINE


class ConsumeMsgTimeoutError(BrokerError):
    code = ResponseCode.CONSUME_MSG_TIMEOUT


class NoMessageError(BrokerError):
    code = ResponseCode.NO_MESSAGE


class FlowControlError(BrokerError):
    code = ResponseCode.FLOW_CONTROL
    retriable = True


_ERROR_BY_CODE: dict[int, type[BrokerError]] = {
    int(cls.code): cls
    for cls in (
        SystemErrorError,
        SystemBusyError,
        RequestCodeNotSupportedError,
        TransactionFailedError,
        FlushDiskTimeoutError,
        SlaveNotAvailableError,
        FlushSlaveTimeoutError,
        MessageIllegalError,
        ServiceNotAvailableError,
        VersionNotSupportedError,
        NoPermissionError,
        TopicNotExistError,
        TopicExistAlreadyError,
        PullNotFoundError,
        PullRetryImmediatelyError,
        PullOffsetMovedError,
        QueryNotFoundError,
        SubscriptionParseFailedError,
        SubscriptionNotExistError,
        SubscriptionNotLatestError,
        SubscriptionGroupNotExistError,
        FilterDataNotExistError,
        FilterDataNotLatestError,
        TransactionShouldCommitError,
        TransactionShouldRollbackError,
        TransactionStateUnknowError,
        TransactionStateGroupWrongError,
        NoBuyerIdError,
        NotInCurrentUnitError,
        ConsumerNotOnlineError,
        ConsumeMsgTimeoutError,
        NoMessageError,
        FlowControlError,
    )
}


def error_for_code(code: int, remark: str | None = None) -> BrokerError:
    """The exception for a non-success response code (BrokerError itself for unknown codes)."""
    cls = _ERROR_BY_CODE.get(code)
    if cls is None:
        return BrokerError(remark, code=code)
    return cls(remark)


def error_class_for_code(code: int) -> type[BrokerError]:
    return _ERROR_BY_CODE.get(code, BrokerError)
