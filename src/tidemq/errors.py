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
        (one subclass per ResponseCode, built below; `error_for_code(code)` picks it)
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


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.lower().split("_"))


# Codes that mean "try again, maybe elsewhere": the client's send retry and fault avoidance use it.
_RETRIABLE_CODES = frozenset(
    {
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.FLOW_CONTROL,
    }
)

_ERROR_BY_CODE: dict[int, type[BrokerError]] = {}
for _code in ResponseCode:
    if _code is ResponseCode.SUCCESS:
        continue
    _cls = type(
        _camel(_code.name) + "Error",
        (BrokerError,),
        {"code": _code, "retriable": _code in _RETRIABLE_CODES, "__module__": __name__},
    )
    _ERROR_BY_CODE[int(_code)] = _cls
    globals()[_cls.__name__] = _cls


def error_for_code(code: int, remark: str | None = None) -> BrokerError:
    """The exception for a non-success response code (BrokerError itself for unknown codes)."""
    cls = _ERROR_BY_CODE.get(code)
    if cls is None:
        return BrokerError(remark, code=code)
    return cls(remark)


def error_class_for_code(code: int) -> type[BrokerError]:
    return _ERROR_BY_CODE.get(code, BrokerError)
