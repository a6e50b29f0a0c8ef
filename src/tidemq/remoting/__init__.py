"""asyncio TCP transport for RemotingCommands: connections, a server, a client pool, handlers.

The frame format lives in tidemq.protocol.frame; this package only moves frames, pairs responses
to requests by opaque and runs inbound requests as tasks.
"""

from __future__ import annotations

from tidemq.remoting.address import normalise_host, parse_address
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import (
    IN_FLIGHT_MAX,
    TURN_BUDGET,
    Connection,
    Signer,
)
from tidemq.remoting.handlers import Handler, HandlerTable, RequestHook
from tidemq.remoting.loop import install_uvloop
from tidemq.remoting.server import RemotingServer

__all__ = [
    "IN_FLIGHT_MAX",
    "TURN_BUDGET",
    "Connection",
    "Handler",
    "HandlerTable",
    "RemotingClient",
    "RemotingServer",
    "RequestHook",
    "Signer",
    "install_uvloop",
    "normalise_host",
    "parse_address",
]
