"""RocketMQ-compatible clients: asyncio Producer, PushConsumer, PullConsumer and Admin, and their
blocking facades. The public names are re-exported from `tidemq`."""
