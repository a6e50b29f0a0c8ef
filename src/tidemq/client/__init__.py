"""RocketMQ-compatible clients: asyncio Producer, PushConsumer, PullConsumer and Admin, and their
blocking facades. The public names are re-exported from `tidemq`; so is Credentials, the ACL
account every client takes as `credentials=`."""

from tidemq.security.signing import Credentials

__all__ = ["Credentials"]
