"""What every broker handler shares: the broker's address, error answers and the guard.

Every failure is answered with a response code and a remark, and logged once, here. A handler
raises `Refusal(code, remark)` to answer with that code; a ProtocolError from parsing a header or
body becomes SYSTEM_ERROR naming the bad field (as Java answers a header it cannot decode).
Anything else escapes to the remoting layer, which answers SYSTEM_ERROR and logs the traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from tidemq.errors import ProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.connection import Connection
from tidemq.remoting.handlers import Handler
from tidemq.remoting.log_limit import clip_peer_text
from tidemq.store.types import PutStatus

# Store refusals → response codes (§4.1 "Store errors map to response codes"); one table for every
# handler that stores (send, end transaction).
PUT_STATUS_CODES: Final = {
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}


@dataclass(slots=True)
class BrokerAddress:
    """Where clients reach this broker: the advertised IPv4 and the bound port (known at start)."""

    host: str
    port: int = 0

    @property
    def text(self) -> str:
        return f"{self.host}:{self.port}"


def slave_refusal_remark(broker_name: str) -> str:
    """The remark of a write (send, send-back, end transaction, end batch, topic create or
    delete) a slave refuses."""
    return (
        f"the broker[{broker_name}] is a slave: it takes no writes (they go to the master of "
        "its group and reach it by replication)"
    )


class Refusal(Exception):
    """Raised inside a handler to answer `code` with `remark` (and optional header fields)."""

    def __init__(self, code: int, remark: str, ext_fields: dict[str, str] | None = None) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
        self.ext_fields = ext_fields


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


def refuse(
    connection: Connection,
    request: RemotingCommand,
    code: int,
    remark: str,
    ext_fields: dict[str, str] | None = None,
) -> RemotingCommand:
    """The error response, logged with the request code and the peer.

    The line goes through the connection's per-peer limit (a few lines per window, then a count
    of those left out) with the remark clipped: a client that repeats a bad request, or sends a
    huge field the remark quotes, cannot make the broker's log grow faster than its own traffic.
    """
    level = logging.INFO if code in _ROUTINE_CODES else logging.WARNING
    connection.log_peer_error(
        "%s from %s refused with %s: %s",
        _code_name(request.code),
        connection.peer_text,
        response_name(code),
        clip_peer_text(remark),
        level=level,
    )
    return request.response(code, ext_fields, remark=remark)


def response_name(code: int) -> str:
    """A response code for the log: its name and number, or the number if it has no name."""
    try:
        return f"{ResponseCode(code).name}({code})"
    except ValueError:
        return str(code)


# Answers a healthy cluster gives all the time: not worth a warning each.
_ROUTINE_CODES = frozenset(
    {
        ResponseCode.QUERY_NOT_FOUND,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SUBSCRIPTION_NOT_EXIST,
        ResponseCode.SUBSCRIPTION_NOT_LATEST,
    }
)

InnerHandler = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]


def guarded(handler: InnerHandler) -> Handler:
    """Turn Refusal and ProtocolError raised by `handler` into logged error responses."""

    async def run(connection: Connection, request: RemotingCommand) -> RemotingCommand | None:
        try:
            return await handler(connection, request)
        except Refusal as exc:
            return refuse(connection, request, exc.code, exc.remark, exc.ext_fields)
        except ProtocolError as exc:
            return refuse(connection, request, ResponseCode.SYSTEM_ERROR, str(exc))

    return run
