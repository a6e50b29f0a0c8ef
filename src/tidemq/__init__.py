"""TideMQ: Apache RocketMQ's architecture and wire protocol, in Python.

The public client API lives here; everything else is reached through its subpackage.

    async with Producer("PG", "127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicA", b"hello", tags="TagA"))
"""

from tidemq._version import __version__
from tidemq.client.admin import Admin
from tidemq.client.blocking import (
    BlockingAdmin,
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    BlockingTransactionProducer,
)
from tidemq.client.consumer import PushConsumer
from tidemq.client.instance import ClientInstance
from tidemq.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeResult,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.selector import MessageSelector
from tidemq.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from tidemq.errors import (
    BrokerError,
    ClientClosedError,
    ClientError,
    ConnectionClosedError,
    NoRouteError,
    ProtocolError,
    QueueError,
    RequestTimeoutError,
)
from tidemq.security.signing import Credentials

__all__ = [
    "Admin",
    "BlockingAdmin",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BlockingTransactionProducer",
    "BrokerError",
    "ClientClosedError",
    "ClientError",
    "ClientInstance",
    "ConnectionClosedError",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeResult",
    "Credentials",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "NoRouteError",
    "Producer",
    "ProtocolError",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueError",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "__version__",
]
