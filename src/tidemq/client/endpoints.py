"""Where a client instance connects and what it calls itself: the name server list as users
write it, and this host's outward address (the "<ip>" of a client id "<ip>@<pid>#<name>")."""

from __future__ import annotations

import socket
from collections.abc import Sequence


def local_ipv4() -> str:
    """This host's outward IPv4 address (no packet is sent), or 127.0.0.1."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        address: str = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    return address


def parse_namesrv_addr(namesrv_addr: str | Sequence[str]) -> list[str]:
    """The name server list from "a:9876;b:9876" (RocketMQ's form), "a,b" or a sequence."""
    items = [namesrv_addr] if isinstance(namesrv_addr, str) else list(namesrv_addr)
    addrs = [
        part.strip() for item in items for part in item.replace(",", ";").split(";") if part.strip()
    ]
    if not addrs:
        raise ValueError("no name server address given")
    return addrs
