"""TideMQ: Apache RocketMQ's architecture and wire protocol, in Python."""

__version__ = "0.1.0"
