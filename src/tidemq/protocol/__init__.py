"""The RocketMQ 4.x remoting protocol as pure functions over bytes (no sockets, no clock)."""
