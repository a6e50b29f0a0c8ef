"""SendCoalescer: the single sends of one event-loop turn, stored with one store call.

    SendHandler.handle, per plain or transactional single send: its checks, its MessageToStore
      ─▶ add(): connection.defer(request), joins the pending list (the first one schedules
         put_pending with loop.call_soon)
      ... the rest of this turn's reads: more frames of the same read, other connections' frames
    put_pending ─▶ store.put_each(pending), one pass ─▶ per send: its refusal, or
         ASYNC_FLUSH + ASYNC_MASTER  SUCCESS at once
         SYNC_FLUSH or SYNC_MASTER   one durability callback for the whole group (the flush and
                                     the slave's ack, awaited together: durability.py) ─▶ SUCCESS,
                                     FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or
                                     SLAVE_NOT_AVAILABLE each
      ─▶ connection.respond_frame / respond: each connection's write coalescing sends them

Why: a send's cost was mostly per call (store put, a task per sync-flush wait); one put for the
sends of a turn is the batch path's cost, and one durability callback replaces a task per send. The
loop turn bounds the wait: put_pending runs before the loop polls for more input, so a lone send
waits one callback, not a timer.

A SUCCESS answer to a JSON request is made from a template (`protocol.frame.encode_send_success`,
the bytes the frame encoder makes for it, derived from it at import): an answer built as a
command and encoded costs several times more than the rest of its way out.

What stays per send: the request hook (it runs before the handler, so ACL sees every request
before the store), every check (permission, topic, size: a refusal answers that request only),
its record (the same bytes as put alone) and its response. Sends in arrival order reach the
store in arrival order: whatever the send handler stores another way (batches, delayed sends,
redirected retries) first puts the pending group (`put_pending`).

A send may be stored as another message (`Substitute`): a transactional send joins as its half
message (RMQ_SYS_TRANS_HALF_TOPIC queue 0). Its answer quotes the queue id the sender named and
the half queue's offset, a refusal names the sender's topic, and the substitute's `stored` (the
transaction resolver's `half_stored`, which tracks the half in the ledger) runs before any
answer of the group goes out, so an END_TRANSACTION never arrives for an untracked half.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import Final, NamedTuple

from tidemq.broker.durability import Durability
from tidemq.broker.handlers.common import PUT_STATUS_CODES, BrokerAddress, refuse
from tidemq.broker.stats import BrokerStats
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.frame import RemotingCommand, SerializeType, encode_send_success
from tidemq.protocol.headers_send import send_response_fields
from tidemq.protocol.message import offset_msg_ids
from tidemq.remoting.connection import Connection
from tidemq.store.message_store import FileMessageStore
from tidemq.store.types import MessageToStore, PutResult

log = logging.getLogger(__name__)


_SUCCESS: Final = int(ResponseCode.SUCCESS)


class Substitute(NamedTuple):
    """A send stored as another message: the topic and queue id its sender named (its answer
    quotes the queue id, a refusal the topic) and what to call with the message and its result
    once stored, before the send is answered."""

    topic: str
    queue_id: int
    stored: Callable[[MessageToStore, PutResult], None]


# Both are plain tuples, always unpacked into named locals, never indexed: one of each is made per
# send, and building a NamedTuple measured ~0.25-0.5 us against ~0.06 us for a tuple display
# (2-4 % of the broker's ~17 us per pipelined send).
# A pending send: its connection, its request, its message, and its Substitute if stored as one.
_Pending = tuple[Connection, RemotingCommand, MessageToStore, Substitute | None]
# A send stored and waiting for its flush: its connection, its request, and for its response
# header its offsetMsgId, queue id and queue offset.
_Stored = tuple[Connection, RemotingCommand, str, int, int]


def store_refusal(topic: str, result: PutResult) -> tuple[int, str]:
    """The response code and remark of a send the store refused."""
    code = PUT_STATUS_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
    remark = f"store refused the message to {topic}: {result.status.value} {result.error}"
    return code, remark.rstrip()


class SendCoalescer:
    """Collects the plain single sends of a loop turn; stores and answers them together."""

    __slots__ = (
        "_address",
        "_durability",
        "_pending",
        "_scheduled",
        "_started_ns",
        "_stats",
        "_store",
    )

    def __init__(
        self,
        store: FileMessageStore,
        durability: Durability,
        address: BrokerAddress,
        stats: BrokerStats | None = None,
    ) -> None:
        self._store = store
        self._stats = stats
        self._durability = durability
        self._address = address
        self._pending: list[_Pending] = []
        self._scheduled = False
        # When the group being collected began: its sends' RPC latency is timed from there.
        self._started_ns = 0

    def add(
        self,
        connection: Connection,
        request: RemotingCommand,
        msg: MessageToStore,
        substitute: Substitute | None = None,
    ) -> None:
        """Store `msg` with the other sends of this loop turn and answer `request` then (the
        handler returns None). `substitute`: `msg` stands for what `request` sent."""
        connection.defer(request, timed=False)  # timed as a group: _record, _respond
        if not self._pending:
            self._started_ns = perf_counter_ns()
        self._pending.append((connection, request, msg, substitute))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._put_scheduled)

    def _put_scheduled(self) -> None:
        self._scheduled = False
        self.put_pending()

    def put_pending(self) -> None:
        """Store the sends collected so far, in arrival order, and answer them (now, or once
        durable: SYNC_FLUSH, SYNC_MASTER)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        started = self._started_ns
        address = self._address
        try:
            results = self._store.put_each([message for _conn, _req, message, _sub in pending])
            ok = [r for r in results if r.ok]
            msg_ids = offset_msg_ids(address.host, address.port, [r.physical_offset for r in ok])
        except Exception as exc:
            # A callback boundary: every send of the group is answered, the loop carries on.
            log.exception("storing %d coalesced sends failed", len(pending))
            remark = str(exc) or type(exc).__name__
            for connection, request, *_ in pending:
                response = request.response(ResponseCode.SYSTEM_ERROR, remark=remark)
                _respond(connection, request, response, started)
            return
        stored = self._answer_refused(pending, results, msg_ids, started)
        if self._stats is not None and ok:
            self._count(pending, results)
        if not stored:
            return
        durability = self._durability
        if durability.waits:
            answer = self._answer_stored
            end = max(r.physical_offset + r.size for r in ok)
            durability.on_durable(end, lambda code, remark: answer(stored, code, remark, started))
        else:
            self._answer_stored(stored, _SUCCESS, "", started)

    def _answer_refused(
        self, pending: list[_Pending], results: list[PutResult], msg_ids: list[str], started: int
    ) -> list[_Stored]:
        """Answer the sends the store refused; the others' response fields, in order."""
        stored: list[_Stored] = []
        n = 0
        for (connection, request, msg, substitute), result in zip(pending, results, strict=True):
            if not result.ok:
                topic = msg.topic if substitute is None else substitute.topic
                code, remark = store_refusal(topic, result)
                _respond(connection, request, refuse(connection, request, code, remark), started)
                continue
            msg_id = msg_ids[n]
            n += 1
            queue_id = msg.queue_id
            if substitute is not None:
                try:
                    substitute.stored(msg, result)
                except Exception as exc:
                    # A callback boundary, as put_pending's: this send is answered, not the rest.
                    log.exception("after storing a send to %s", substitute.topic)
                    remark = str(exc) or type(exc).__name__
                    response = request.response(ResponseCode.SYSTEM_ERROR, remark=remark)
                    _respond(connection, request, response, started)
                    continue
                queue_id = substitute.queue_id
            stored.append((connection, request, msg_id, queue_id, result.queue_offset))
        return stored

    def _count(self, pending: list[_Pending], results: list[PutResult]) -> None:
        """Count the stored sends, one `put` per topic of the group (mostly a single one)."""
        stats = self._stats
        assert stats is not None
        topic = ""
        count = nbytes = 0
        for (_conn, _req, msg, _sub), result in zip(pending, results, strict=True):
            if not result.ok:
                continue
            if msg.topic != topic:
                if count:
                    stats.put(topic, count, nbytes)
                topic, count, nbytes = msg.topic, 0, 0
            count += 1
            nbytes += result.size
        if count:
            stats.put(topic, count, nbytes)

    def _answer_stored(self, stored: list[_Stored], code: int, remark: str, started: int) -> None:
        """Answer the stored sends of one group with `code` (the durability's verdict)."""
        _record(stored, code, started)
        if code == _SUCCESS:
            json = SerializeType.JSON
            for connection, request, msg_id, queue_id, queue_offset in stored:
                if request.serialize_type is json:
                    frame = encode_send_success(request.opaque, msg_id, queue_id, queue_offset)
                    connection.respond_frame(request, frame)
                else:
                    fields = send_response_fields(msg_id, queue_id, queue_offset)
                    connection.respond(request, request.response(ResponseCode.SUCCESS, fields))
            return
        for connection, request, msg_id, queue_id, queue_offset in stored:
            fields = send_response_fields(msg_id, queue_id, queue_offset)
            response = request.response(code, fields, remark=remark)
            connection.respond(request, response)


def _respond(
    connection: Connection, request: RemotingCommand, response: RemotingCommand, started: int
) -> None:
    """Answer one send of a group and time it from the group's start (the sends are deferred
    untimed: Connection.defer(timed=False))."""
    connection.respond(request, response)
    observer = connection.rpc_observer
    if observer is not None:
        observer.record(request.code, response.code, perf_counter_ns() - started)


def _record(stored: list[_Stored], response_code: int, started: int) -> None:
    """Time the stored sends of a group as one: each from the group's first send to now (a
    later send of the same turn is over-stated by at most that turn's length), one
    `record_many` per run of one request code instead of a clock read and an entry per send."""
    observer = stored[0][0].rpc_observer if stored else None
    if observer is None:
        return
    elapsed = perf_counter_ns() - started
    code = stored[0][1].code
    count = 0
    for _connection, request, *_fields in stored:
        if request.code != code:
            observer.record_many(code, response_code, elapsed, count)
            code, count = request.code, 0
        count += 1
    observer.record_many(code, response_code, elapsed, count)
