"""Peer addresses as RocketMQ writes them: "host:port" text, with IPv4 text for loopback and
v4-mapped IPv6 hosts so that one peer has one name whichever way it connected."""

from __future__ import annotations


def parse_address(addr: str) -> tuple[str, int]:
    """Split "host:port" (or "[v6]:port") into its parts.

    Raises:
        ValueError: no port, or a port that is not a number in 1..65535.
    """
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {addr!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"address {addr!r} has port {port} out of range")
    return host, port


def normalise_host(host: str) -> str:
    """IPv4 text for loopback and v4-mapped IPv6 addresses; other hosts unchanged."""
    if host == "::1":
        return "127.0.0.1"
    if host.startswith("::ffff:") and "." in host:
        return host[len("::ffff:") :]
    return host


def socket_address(info: object) -> tuple[str, int]:
    """(host, port) of a transport's "peername"/"sockname" extra info; ("", 0) if it has none."""
    if isinstance(info, tuple) and len(info) >= 2:
        return normalise_host(str(info[0])), int(info[1])
    return ("", 0)
