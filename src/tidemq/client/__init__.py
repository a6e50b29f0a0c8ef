"""RocketMQ-compatible clients: asyncio Producer, PushConsumer, PullConsumer and Admin, and their
blocking facades. The public names are re-exported from `tidemq`; so is Credentials, the ACL
account every client takes as `credentials=`, and MessageSelector (tag or SQL92 subscriptions)."""

from tidemq.client.selector import MessageSelector
from tidemq.security.signing import Credentials

__all__ = ["Credentials", "MessageSelector"]
