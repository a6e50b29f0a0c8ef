"""Security policy: request signatures, access control (RocketMQ's plain_acl.yml) and TLS settings.

Pure policy over protocol frames: the transport (remoting) and the servers call into it; it
opens no socket and runs no task of its own.
"""
