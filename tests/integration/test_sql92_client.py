"""SQL92 subscriptions from our own client (issue 16 item 5): MessageSelector.by_sql on a real
broker with enablePropertyFilter=true, through PushConsumer and PullConsumer; a plain string stays
a tag expression, as in the Java client; a broker that refuses SQL92 fails start() with its
reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tidemq
from tidemq import Admin, ConsumeFromWhere, Message, MessageSelector, Producer, PullConsumer
from tidemq import PushConsumer as AsyncPushConsumer
from tidemq.errors import SubscriptionParseFailedError
from tidemq.testing import LocalCluster, eventually, local_cluster

pytestmark = pytest.mark.integration

TOPIC = "SqlTopic"
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


async def fill(cluster: LocalCluster) -> None:
    """Ten messages, property a = 1..10, tag TagA for even a."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
    async with Producer("PG-sql", cluster.namesrv_addr) as producer:
        for a in range(1, 11):
            tags = "TagA" if a % 2 == 0 else "TagB"
            await producer.send(Message(TOPIC, b"m%d" % a, tags=tags, properties={"a": str(a)}))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with local_cluster(tmp_path, broker_settings={"enablePropertyFilter": "true"}) as c:
        await fill(c)
        yield c


def test_selector_is_exported_and_plain_strings_stay_tags() -> None:
    assert tidemq.MessageSelector is MessageSelector
    assert tidemq.client.MessageSelector is MessageSelector
    assert MessageSelector.of("TagA || TagB") == MessageSelector.by_tag("TagA || TagB")
    assert MessageSelector.by_sql(" a > 5 ").expression_type == "SQL92"
    assert MessageSelector.by_tag("").expression == "*"
    with pytest.raises(ValueError, match="SQL92 selector needs an expression"):
        MessageSelector.by_sql("  ")
    with pytest.raises(TypeError, match="MessageSelector"):
        MessageSelector.of(5)  # type: ignore[arg-type]


def test_a_plain_string_that_looks_like_sql_warns(caplog: pytest.LogCaptureFixture) -> None:
    consumer = AsyncPushConsumer("CG-warn", "127.0.0.1:9", subscriptions={TOPIC: "a > 5"})
    consumer.subscribe("Other", "TagA || TagB")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"subscription of {TOPIC}: 'a > 5' is a tag expression (tags 'a > 5'), so it matches "
        "only those tags; for a SQL92 filter pass MessageSelector.by_sql('a > 5')"
    ]


async def consume(
    cluster: LocalCluster, group: str, selector: object, expected: int
) -> list[bytes]:
    got: list[bytes] = []
    consumer = AsyncPushConsumer(group, cluster.namesrv_addr, consume_from_where=FIRST)
    consumer.subscribe(TOPIC, selector)  # type: ignore[arg-type]
    consumer.register_listener(lambda msgs: got.extend(m.body for m in msgs))
    async with consumer:
        await eventually(lambda: len(got) >= expected, what=f"{expected} messages consumed")
        # The broker answers every queue up to its end: what passes the filter is all there is.
        await eventually(
            lambda: sum(consumer.committed_offsets().values()) == 10, what="queues read to the end"
        )
    return sorted(got)


async def test_push_consumer_by_sql(cluster: LocalCluster) -> None:
    got = await consume(cluster, "CG-sql", MessageSelector.by_sql("a > 5"), 5)
    assert got == sorted(b"m%d" % a for a in range(6, 11))


async def test_push_consumer_sql_with_tags(cluster: LocalCluster) -> None:
    got = await consume(
        cluster, "CG-sql-tags", MessageSelector.by_sql("a > 5 AND TAGS = 'TagA'"), 3
    )
    assert got == sorted([b"m6", b"m8", b"m10"])


async def test_push_consumer_by_tag_selector_equals_string(cluster: LocalCluster) -> None:
    got = await consume(cluster, "CG-tag", MessageSelector.by_tag("TagA"), 5)
    assert got == sorted(b"m%d" % a for a in (2, 4, 6, 8, 10))


async def test_pull_consumer_by_sql(cluster: LocalCluster) -> None:
    async with PullConsumer("CG-pull-sql", cluster.namesrv_addr) as consumer:
        got: list[bytes] = []
        plain: list[bytes] = []
        for mq in await consumer.fetch_subscribe_message_queues(TOPIC):
            result = await consumer.pull(mq, MessageSelector.by_sql("a <= 3"), 0, 32)
            got += [m.body for m in result.messages]
            # A plain string is a tag expression, as in Java: no tag is called "a <= 3".
            result = await consumer.pull(mq, "a <= 3", 0, 32)
            plain += [m.body for m in result.messages]
    assert sorted(got) == [b"m1", b"m2", b"m3"]
    assert plain == []


async def test_broker_without_property_filter_fails_start(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster:
        await fill(cluster)
        consumer = AsyncPushConsumer("CG-refused", cluster.namesrv_addr)
        consumer.subscribe(TOPIC, MessageSelector.by_sql("a > 5"))
        consumer.register_listener(lambda msgs: None)
        with pytest.raises(SubscriptionParseFailedError, match="enablePropertyFilter=true"):
            await consumer.start()


async def test_bad_sql_fails_start_naming_the_topic(cluster: LocalCluster) -> None:
    consumer = AsyncPushConsumer("CG-bad", cluster.namesrv_addr)
    consumer.subscribe(TOPIC, MessageSelector.by_sql("a >"))
    consumer.register_listener(lambda msgs: None)
    with pytest.raises(SubscriptionParseFailedError, match=f"topic {TOPIC}: invalid SQL92"):
        await consumer.start()
