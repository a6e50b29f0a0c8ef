"""Shared ACL files and helpers of tests/security (example keys only, made up for the tests)."""

from __future__ import annotations

import os
from pathlib import Path

from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers_send import SendMessageRequestHeader
from tidemq.protocol.message import encode_properties
from tidemq.security.signing import Credentials

# Fake keys, valid only in these tests.
PRODUCER = Credentials("producerAK", "producerSK-example")
CONSUMER = Credentials("consumerAK", "consumerSK-example")
ADMIN = Credentials("adminAK01", "adminSK-example")
STRANGER = Credentials("strangerAK", "strangerSK-example")

ACL_YAML = f"""\
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: {PRODUCER.access_key}
    secretKey: {PRODUCER.secret_key}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TopicA=PUB
      - TopicB=PUB|SUB
      - TopicC=SUB
      - TopicD=DENY
    groupPerms:
      - GroupA=PUB|SUB
      - GroupD=DENY
  - accessKey: {CONSUMER.access_key}
    secretKey: {CONSUMER.secret_key}
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    whiteRemoteAddress: 192.168.1.*
    admin: true
"""


def write_acl(path: Path, text: str) -> None:
    """Replace the file's content so a watcher sees the change: the mtime is moved on by a
    second, whatever the file system's timestamp granularity."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    after = max(path.stat().st_mtime_ns, before + 1_000_000_000)
    os.utime(path, ns=(after, after))


def send_command(topic: str, body: bytes = b"hello", *, v2: bool = True) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1,
        flag=0,
        properties=encode_properties({}),
    )
    code = RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    return RemotingCommand(code=code, ext_fields=header.to_fields(v2=v2), body=body)
