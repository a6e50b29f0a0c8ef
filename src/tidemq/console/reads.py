"""What the console's pages show, gathered through the admin protocol only.

Every function takes the app's one `Admin` and returns plain data for a template. Tables are
capped (`ROWS_PER_PAGE`, `MESSAGES_MAX`) so a topic with 10,000 queues or a group with 100 clients
still renders: the page shows a slice and says how many more there are. The caller
(core.Console.page) runs each page under one deadline, so a silent broker costs a page at most
PAGE_TIMEOUT_S.

The group's offsets are read from every master (GET_CONSUME_STATS without a topic), as
Admin.consume_stats only asks the brokers of the group's retry topic, which a group that only
ever pulled does not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import orjson

from tidemq.client import api
from tidemq.client.admin import Admin
from tidemq.client.admin_groups import QUERY_CONSUMER_GROUP
from tidemq.client.message import MessageExt, PullStatus
from tidemq.client.route_cache import subscribe_queues
from tidemq.errors import (
    BrokerError,
    ConsumerNotOnlineError,
    ProtocolError,
    QueueError,
    error_for_code,
)
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import ConsumeStats, MessageQueue, OffsetWrapper, TopicRouteData
from tidemq.protocol.bodies_admin import ClientConnection
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import GetConsumeStatsRequestHeader, PullSysFlag
from tidemq.protocol.message_id import decode_offset_msg_id

# Rows of one table page: a topic of 10,000 queues renders in slices of this many.
ROWS_PER_PAGE: Final = 200
# Messages one query shows (by time, by key, a DLQ page): what a person reads on one page.
MESSAGES_MAX: Final = 64
# Body bytes a message page shows; the rest is counted, not sent to the browser.
BODY_SHOWN_BYTES: Final = 16 * 1024
# The pull group the console reads with: upstream's tools group (no consumer joins it).
READER_GROUP: Final = QUERY_CONSUMER_GROUP
# One Admin call's budget within a page (pages ask brokers side by side, each under this).
CALL_TIMEOUT_S: Final = 5.0
# Requests one page has in flight at once (a plan for 10,000 queues is sent in waves).
CONCURRENCY_MAX: Final = 64
PULL_BATCH: Final = 32
T = TypeVar("T")


class Refused(Exception):
    """A request the console will not make for the person (a 400 page saying why)."""


class NotFound(Exception):
    """A broker, topic, group or message the cluster does not know: answered with a 404 page."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} not found")
        self.kind = kind
        self.name = name


@dataclass(frozen=True, slots=True)
class Page:
    """One slice of a long table: `rows` of `total`, starting at row `start`."""

    rows: list[Any]
    total: int
    start: int
    number: int
    pages: int

    @property
    def more(self) -> int:
        return self.total - self.start - len(self.rows)


def paginate(rows: Sequence[Any], number: int, size: int = ROWS_PER_PAGE) -> Page:
    pages = max(1, -(-len(rows) // size))
    number = min(max(number, 1), pages)
    start = (number - 1) * size
    return Page(list(rows[start : start + size]), len(rows), start, number, pages)


def is_not_found(error: QueueError) -> bool:
    return isinstance(error, BrokerError) and error.response_code in (
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
        ResponseCode.QUERY_NOT_FOUND,
    )


async def invoke(admin: Admin, addr: str, code: int, fields: dict[str, str]) -> bytes:
    """One request to the broker at `addr`; its body, or the error its code names."""
    cmd = RemotingCommand(code=code, ext_fields=fields)
    response = await admin.instance.remoting.invoke(addr, cmd, admin.timeout_ms)
    if response.code != ResponseCode.SUCCESS:
        raise error_for_code(response.code, f"{addr}: {response.remark}")
    return response.body


# -- cluster -----------------------------------------------------------------------------------


@dataclass(slots=True)
class BrokerRow:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    runtime: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def role(self) -> str:
        return self.runtime.get("brokerRole", "MASTER" if self.broker_id == 0 else "SLAVE")

    @property
    def slaves(self) -> list[dict[str, str]]:
        """A master's slaves from its haSlaves key (broker/handlers/ha_info.py)."""
        listed = self.runtime.get("haSlaves", "")
        names = ("addr", "brokerId", "ackedOffset", "lagBytes", "lagMs")
        return [
            dict(zip(names, item.split(","), strict=False)) for item in listed.split(";") if item
        ]


async def brokers(admin: Admin, *, with_runtime: bool = True) -> list[BrokerRow]:
    """Every broker the name servers know, by cluster, name and id, with its runtime info: asked
    of all at once, each under CALL_TIMEOUT_S, so a silent broker shows its error in its own
    row instead of costing the whole page."""
    info = await admin.cluster_info()
    rows: list[BrokerRow] = []
    for cluster, names in sorted(info.cluster_addr_table.items()):
        for name in sorted(names):
            data = info.broker_addr_table.get(name)
            for broker_id, addr in sorted((data.broker_addrs if data else {}).items()):
                rows.append(BrokerRow(cluster, name, broker_id, addr))
    if with_runtime:
        answers = await asyncio.gather(
            *(bounded(admin.broker_runtime_info(row.addr)) for row in rows),
            return_exceptions=True,
        )
        for row, answer in zip(rows, answers, strict=True):
            if isinstance(answer, dict):
                row.runtime = answer
            else:
                row.error = failure_text(answer)
    return rows


async def bounded(call: Awaitable[T]) -> T:
    """One Admin call under CALL_TIMEOUT_S (the Admin's own timeout covers one request only)."""
    async with asyncio.timeout(CALL_TIMEOUT_S):
        return await call


def failure_text(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer in {CALL_TIMEOUT_S} s"
    if isinstance(error, QueueError):
        return str(error) or type(error).__name__
    raise error  # not a broker's failure: the 500 page


async def broker_addresses(admin: Admin) -> set[str]:
    """Every address the name servers list for a broker of the cluster."""
    info = await admin.cluster_info()
    return {a for data in info.broker_addr_table.values() for a in data.broker_addrs.values()}


async def broker(admin: Admin, addr: str) -> BrokerRow:
    for row in await brokers(admin, with_runtime=False):
        if row.addr == addr:
            row.runtime = await admin.broker_runtime_info(addr)
            return row
    raise NotFound("broker", addr)


# -- topics ------------------------------------------------------------------------------------


def topic_kind(topic: str) -> str:
    if pm.is_retry_topic(topic):
        return "retry"
    if pm.is_dlq_topic(topic):
        return "dlq"
    if topic.startswith(("RMQ_SYS_", "SCHEDULE_TOPIC", pm.TBW102)) or topic == pm.SELF_TEST_TOPIC:
        return "system"
    return "normal"


async def route(admin: Admin, topic: str) -> TopicRouteData:
    try:
        return await admin.topic_route(topic)
    except QueueError as error:
        if is_not_found(error):
            raise NotFound("topic", topic) from error
        raise


@dataclass(frozen=True, slots=True)
class QueueRow:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int


async def topic_queues(admin: Admin, topic: str) -> list[QueueRow]:
    """The queues of `topic`, which the caller knows exists (`route`)."""
    stats = await admin.topic_stats(topic)
    return [
        QueueRow(mq.broker_name, mq.queue_id, o.min_offset, o.max_offset, o.last_update_timestamp)
        for mq, o in stats.offset_table.items()
    ]


# -- groups ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LagRow:
    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - max(self.consumer_offset, 0), 0)


async def consume_stats(
    admin: Admin, addrs: Iterable[str], group: str, topic: str | None = None
) -> dict[MessageQueue, OffsetWrapper]:
    """The group's offsets on `topic` (every topic when None) from the brokers at `addrs`:
    GET_CONSUME_STATS to each, side by side, merged."""
    fields = GetConsumeStatsRequestHeader(consumer_group=group, topic=topic).to_fields()
    answers = await asyncio.gather(
        *(bounded(invoke(admin, a, RequestCode.GET_CONSUME_STATS, fields)) for a in addrs),
        return_exceptions=True,
    )
    table: dict[MessageQueue, OffsetWrapper] = {}
    for answer in answers:
        if isinstance(answer, QueueError) and is_not_found(answer):
            continue  # the group has no offsets on that broker
        if isinstance(answer, BaseException):
            raise answer  # a broker that fails: the page says so, not a shorter table
        table.update(ConsumeStats.from_json(answer).offset_table)
    return table


async def group_offsets(admin: Admin, group: str) -> list[LagRow]:
    """The group's offsets on every topic of every master (GET_CONSUME_STATS without a topic):
    Admin.consume_stats only asks the brokers of the retry topic."""
    table = await consume_stats(admin, await admin.master_addresses(), group)
    return [
        LagRow(mq, o.broker_offset, o.consumer_offset, o.last_timestamp)
        for mq, o in sorted(table.items())
    ]


async def group_clients(admin: Admin, group: str) -> list[ClientConnection]:
    """The group's online consumers (GET_CONSUMER_CONNECTION_LIST); none online: []."""
    try:
        return list((await admin.consumer_connections(group)).connection_set)
    except ConsumerNotOnlineError:
        return []


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Body:
    """A body as a page shows it: text when it is UTF-8, else hex; cut at BODY_SHOWN_BYTES."""

    text: str
    encoding: str
    size: int
    cut: int

    @classmethod
    def of(cls, body: bytes, limit: int = BODY_SHOWN_BYTES) -> Body:
        """The whole body decides text or hex (a cut may split a character); then the first
        `limit` bytes' worth is kept."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            shown = body[:limit]
            return cls(shown.hex(" ", 4), "hex", len(body), len(body) - len(shown))
        kept = text.encode()[:limit].decode("utf-8", "ignore")
        return cls(kept, "utf-8", len(body), len(body) - len(kept.encode()))


async def message_by_id(admin: Admin, msg_id: str, topic: str = "") -> MessageExt:
    """By offset msg id (VIEW_MESSAGE_BY_ID), else by unique key within `topic`.

    An offset msg id names the address of the broker that stored it, and VIEW_MESSAGE_BY_ID
    goes there: the console asks only addresses the name servers list for this cluster, so a
    crafted id cannot make it connect to any other host and port."""
    try:
        host, port, _ = decode_offset_msg_id(msg_id)
        addr: str | None = f"{host}:{port}"
    except ProtocolError:
        addr = None  # not an offset msg id: perhaps a unique key
    known = addr is not None and addr in await broker_addresses(admin)
    if known:
        try:
            return await admin.view_message(msg_id)
        except QueueError as error:
            # A broker has no code for "no message at that offset": upstream's SYSTEM_ERROR text.
            missing = is_not_found(error) or "can not find message" in str(error)
            if not topic and not missing:
                raise
    if not topic:
        if addr is None or known:
            raise NotFound("message", msg_id)
        raise Refused(
            f"Message id {msg_id!r} names {addr}, which is not a broker of this cluster: "
            "the console does not connect there."
        )
    found = await admin.query_message_by_key(topic, msg_id, max_num=1, unique_key=True)
    if not found:
        raise NotFound("message", msg_id)
    return found[0]


async def messages_by_key(admin: Admin, topic: str, key: str) -> list[MessageExt]:
    await route(admin, topic)
    return (await admin.query_message_by_key(topic, key, max_num=MESSAGES_MAX))[:MESSAGES_MAX]


async def messages_by_time(
    admin: Admin, topic: str, begin_ms: int, end_ms: int
) -> list[MessageExt]:
    """Messages of `topic` stored in [begin_ms, end_ms], at most MESSAGES_MAX in all."""
    await route(admin, topic)
    return await admin.query_messages_by_time(topic, begin_ms, end_ms, max_count=MESSAGES_MAX)


async def read_queue(
    admin: Admin, queue: MessageQueue, start: int, end: int, limit: int
) -> list[MessageExt]:
    """Messages of `queue` in [start, end), at most `limit`, read as TOOLS_CONSUMER (upstream's
    tools group, which brokers create at start; the pull commits nothing)."""
    messages: list[MessageExt] = []
    offset = start
    while offset < end and len(messages) < limit:
        result = await api.pull(
            admin.instance,
            queue,
            group=READER_GROUP,  # no commit: sys_flag has no COMMIT_OFFSET
            expression=pm.SUB_ALL,
            offset=offset,
            max_nums=min(PULL_BATCH, end - offset),
            sys_flag=int(PullSysFlag.SUBSCRIPTION),
            timeout_ms=admin.timeout_ms,
        )
        messages.extend(m for m in result.messages if m.queue_offset < end)
        if result.status is not PullStatus.FOUND and result.next_begin_offset <= offset:
            break
        offset = max(result.next_begin_offset, offset + len(result.messages))
    return messages[:limit]


# -- dead letters ------------------------------------------------------------------------------


async def dlq_groups(admin: Admin) -> list[str]:
    prefix = pm.DLQ_GROUP_TOPIC_PREFIX
    return sorted(t[len(prefix) :] for t in await admin.topic_list() if t.startswith(prefix))


async def dead_letters(admin: Admin, group: str) -> tuple[list[MessageExt], int]:
    """The first MESSAGES_MAX dead letters of `group` (oldest first) and how many there are."""
    topic = pm.dlq_topic(group)
    queues = subscribe_queues(topic, await route(admin, topic))
    letters: list[MessageExt] = []
    total = 0
    for queue in queues:
        low = await api.min_offset(admin.instance, queue)
        high = await api.max_offset(admin.instance, queue)
        total += high - low
        if len(letters) < MESSAGES_MAX:
            letters += await read_queue(admin, queue, low, high, MESSAGES_MAX - len(letters))
    return letters, total


# -- transactions ------------------------------------------------------------------------------


@dataclass(slots=True)
class TxBroker:
    addr: str
    stats: dict[str, Any] = field(default_factory=dict)
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    in_flight_total: int = 0
    error: str = ""


async def transactions(admin: Admin) -> list[TxBroker]:
    """Each master's transaction counters and in-flight half messages, with the TideMQ-private
    TIDEMQ_TX_STATS / TIDEMQ_TX_LIST requests `tidemq tx` uses (broker/transaction/admin.py)."""
    rows = [TxBroker(addr) for addr in await admin.master_addresses()]
    answers = await asyncio.gather(
        *(bounded(_tx_of(admin, r)) for r in rows), return_exceptions=True
    )
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, BaseException):
            row.error = failure_text(answer)
    return rows


async def _tx_of(admin: Admin, row: TxBroker) -> None:
    row.stats = orjson.loads(await invoke(admin, row.addr, RequestCode.TIDEMQ_TX_STATS, {}))
    limit = {"limit": str(ROWS_PER_PAGE)}
    listed = orjson.loads(await invoke(admin, row.addr, RequestCode.TIDEMQ_TX_LIST, limit))
    row.in_flight = list(listed["transactions"])
    row.in_flight_total = int(listed["inFlight"])


# -- live chart counters -----------------------------------------------------------------------


async def counters(admin: Admin, kind: str, name: str) -> dict[str, int]:
    """Cumulative counters whose rate of change the charts draw (the browser divides the change
    by the time between polls): the cluster's messages in and out (_cluster_counters); a topic's
    messages stored (sum of queue ends); a group's messages consumed (sum of committed offsets)
    against those stored in its queues."""
    if kind == "cluster":
        return _cluster_counters(await brokers(admin))
    if kind == "topic":
        await route(admin, name)
        return {"in msgs": sum(q.max_offset for q in await topic_queues(admin, name))}
    if kind == "group":
        rows_ = await group_offsets(admin, name)
        return {
            "consumed msgs": sum(max(r.consumer_offset, 0) for r in rows_),
            "stored msgs": sum(r.broker_offset for r in rows_),
        }
    raise NotFound("chart", kind)


def _cluster_counters(rows: list[BrokerRow]) -> dict[str, int]:
    """Messages in and out per master when the brokers count them (msgPutTotalTodayNow,
    msgGetTotalTodayNow), else bytes written per broker (commitLogMaxOffset)."""
    counted = [r for r in rows if r.broker_id == 0 and "msgPutTotalTodayNow" in r.runtime]
    if counted:
        values: dict[str, int] = {}
        for r in counted:
            values[f"{r.broker_name} in msgs"] = int(r.runtime["msgPutTotalTodayNow"])
            values[f"{r.broker_name} out msgs"] = int(r.runtime.get("msgGetTotalTodayNow", 0))
        return values
    return {
        f"{r.broker_name}/{r.broker_id} bytes": int(r.runtime.get("commitLogMaxOffset", 0))
        for r in rows
        if r.runtime
    }
