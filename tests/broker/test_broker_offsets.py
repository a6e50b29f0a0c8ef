"""Consumer offsets: commit, query semantics for new groups, commit-on-pull, persistence."""

from __future__ import annotations

from pathlib import Path

from broker_harness import Harness, running_broker

from tidemq.broker.offsets import ConsumerOffsetTable
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    PullSysFlag,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)


async def _query(broker: Harness, group: str, topic: str, queue_id: int = 0) -> RemotingCommand:
    header = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id)
    return await broker.call(
        RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=header.to_fields())
    )


async def _commit(
    broker: Harness, group: str, topic: str, offset: int, queue_id: int = 0
) -> RemotingCommand:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, commit_offset=offset
    )
    return await broker.call(
        RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=header.to_fields())
    )


async def test_new_group_on_a_young_queue_starts_at_0(broker: Harness) -> None:
    response = await _query(broker, "CG_NEW", "NoSuchTopic")
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["offset"] == "0"


async def test_commit_query_and_ignore_negative(broker: Harness) -> None:
    for i in range(6):
        await broker.send("TopicO", b"%d" % i)
    assert (await _commit(broker, "CG", "TopicO", 5)).code == ResponseCode.SUCCESS
    assert (await _commit(broker, "CG", "TopicO", -1)).code == ResponseCode.SUCCESS
    assert (await _query(broker, "CG", "TopicO")).ext_fields["offset"] == "5"


async def test_commits_are_checked_and_clamped(broker: Harness) -> None:
    for i in range(3):
        await broker.send("TopicK", b"%d" % i, queue_id=0)
    queue_nums = broker.app.topics.get("TopicK").read_queue_nums  # type: ignore[union-attr]
    # Unknown topic, queue id out of range, illegal names: refused, nothing stored.
    assert (await _commit(broker, "CG", "NoSuchTopic", 1)).code == ResponseCode.TOPIC_NOT_EXIST
    bad_queue = await _commit(broker, "CG", "TopicK", 1, queue_id=queue_nums)
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR
    assert (await _commit(broker, "C@G", "TopicK", 1)).code == ResponseCode.SYSTEM_ERROR
    assert (await _query(broker, "C@G", "TopicK")).code == ResponseCode.SYSTEM_ERROR
    assert broker.app.offsets.groups_of_topic("TopicK") == set()
    assert broker.app.offsets.groups_of_topic("NoSuchTopic") == set()
    # Offsets beyond the queue's end are clamped to it.
    assert (await _commit(broker, "CG", "TopicK", 10**15)).code == ResponseCode.SUCCESS
    assert (await _query(broker, "CG", "TopicK")).ext_fields["offset"] == "3"
    flags = PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET
    await broker.pull("TopicK", group="CG_PULL", sys_flag=flags, commit_offset=10**12)
    assert (await _query(broker, "CG_PULL", "TopicK")).ext_fields["offset"] == "3"


async def test_pull_creates_no_group(broker: Harness) -> None:
    await broker.send("TopicG", b"x")
    response = await broker.pull("TopicG", group="CG_ONLY_PULLS")
    assert response.code == ResponseCode.SUCCESS
    assert broker.app.groups.get("CG_ONLY_PULLS") is None


async def test_commit_on_pull(broker: Harness) -> None:
    await broker.send("TopicC", b"x")
    flags = PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET
    await broker.pull("TopicC", group="CG_PULL", sys_flag=flags, commit_offset=1)
    assert (await _query(broker, "CG_PULL", "TopicC")).ext_fields["offset"] == "1"


async def test_offsets_persist_across_restart(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        await broker.send("TopicP", b"x")
        await _commit(broker, "CG", "TopicP", 1)
    text = (tmp_path / "config" / "consumerOffset.json").read_text()
    assert '"TopicP@CG"' in text
    async with running_broker(tmp_path) as broker:
        assert (await _query(broker, "CG", "TopicP")).ext_fields["offset"] == "1"


async def test_offset_lookups(broker: Harness) -> None:
    for i in range(3):
        await broker.send("TopicL", b"%d" % i)
    max_header = GetMaxOffsetRequestHeader(topic="TopicL", queue_id=0).to_fields()
    response = await broker.call(
        RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=max_header)
    )
    assert response.ext_fields["offset"] == "3"
    min_header = GetMinOffsetRequestHeader(topic="TopicL", queue_id=0).to_fields()
    response = await broker.call(
        RemotingCommand(code=RequestCode.GET_MIN_OFFSET, ext_fields=min_header)
    )
    assert response.ext_fields["offset"] == "0"
    unknown = GetMaxOffsetRequestHeader(topic="Nope", queue_id=0).to_fields()
    response = await broker.call(
        RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=unknown)
    )
    assert response.ext_fields["offset"] == "0"
    search = SearchOffsetRequestHeader(topic="TopicL", queue_id=0, timestamp=0).to_fields()
    response = await broker.call(
        RemotingCommand(code=RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext_fields=search)
    )
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["offset"] == "0"
    earliest = GetMinOffsetRequestHeader(topic="TopicL", queue_id=0).to_fields()
    response = await broker.call(
        RemotingCommand(code=RequestCode.GET_EARLIEST_MSG_STORETIME, ext_fields=earliest)
    )
    assert int(response.ext_fields["timestamp"]) > 0


async def test_group_sees_22_once_the_queue_start_was_deleted(tmp_path: Path) -> None:
    async with running_broker(tmp_path, fileReservedTime="0.0001") as broker:
        for _ in range(80):  # 80 KiB over 64 KiB segments: at least two segments
            assert (await broker.send("TopicOld", b"x" * 1024)).code == ResponseCode.SUCCESS
        now = broker.app.clock.now_ms() + 3_600_000
        assert broker.app.store.clean_expired_files(now, force=True) > 0
        assert broker.app.store.min_offset("TopicOld", 0) > 0
        response = await _query(broker, "CG_LATE", "TopicOld")
        assert response.code == ResponseCode.QUERY_NOT_FOUND
        pulled = await broker.pull("TopicOld", offset=0)
        assert pulled.code == ResponseCode.PULL_OFFSET_MOVED


def test_offset_file_accepts_fastjson_unquoted_keys(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable":{"T@G":{0:12,1:7}}}')
    table = ConsumerOffsetTable(tmp_path)
    table.load()
    assert table.offsets("G", "T") == {0: 12, 1: 7}
    table.commit("G", "T", 2, 3)
    table.persist()
    again = ConsumerOffsetTable(tmp_path)
    again.load()
    assert again.offsets("G", "T") == {0: 12, 1: 7, 2: 3}
    assert not list(tmp_path.glob("*.tmp"))


def test_group_auto_creation_stops_at_groups_max(tmp_path: Path) -> None:
    from tidemq.broker.groups import GROUPS_MAX, SubscriptionGroupConfig, SubscriptionGroupTable
    from tidemq.clock import FakeClock

    assert GROUPS_MAX == 10_000
    table = SubscriptionGroupTable(tmp_path, FakeClock(), auto_create=True, groups_max=2)
    assert table.find_or_create("G1") is not None
    assert table.find_or_create("G2") is not None
    assert table.find_or_create("G3") is None
    assert table.get("G3") is None
    assert table.lookup("G3") == SubscriptionGroupConfig(group_name="G3")  # served, not stored
    assert table.get("G3") is None
    table.put(SubscriptionGroupConfig(group_name="G3"))  # admin puts are not bounded
    assert table.get("G3") is not None
