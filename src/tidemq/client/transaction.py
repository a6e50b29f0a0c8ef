"""The transactional producer: half message, local transaction, END_TRANSACTION, check-backs.

    send_message_in_transaction(message, arg)
      1. half send: the message with TRAN_MSG=true, PGROUP=<group> and sysFlag PREPARED, as an
         ordinary send (the producer's fast path, route, retries); the broker parks it in
         RMQ_SYS_TRANS_HALF_TOPIC
         ├─ the send raised ─▶ listener not called, nothing to end, and the error is raised
         │                    to the caller, as `send` raises it (send_half reports it instead)
         ├─ FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE
         │                    ─▶ listener not called, state ROLLBACK_MESSAGE
         └─ SEND_OK ─▶ 2. listener.execute_local_transaction(message, arg)
                          an exception or None counts as UNKNOW (the broker will check back)
      3. END_TRANSACTION (37), oneway, to the master that stored the half message: producer
         group, the half's queue offset and commit-log offset (from its offsetMsgId), COMMIT (8),
         ROLLBACK (12) or NOT (0); a lost one is recovered by the broker's check-back

    CHECK_TRANSACTION_STATE (39) from a broker ─▶ queued (at most `check_queue_max`; beyond it
      the check is dropped, the broker asks again next interval) ─▶ one of `check_workers`
      workers calls listener.check_local_transaction(message) ─▶ END_TRANSACTION oneway to that
      broker with fromTransactionCheck=true and the offsets the check named

Listener methods may be plain functions or coroutine functions. In the asyncio producer a plain
`execute_local_transaction` runs on the event loop (keep it short, or make it async); plain
`check_local_transaction` calls run on a thread pool of `check_workers` threads, so a slow
database lookup never stalls the client. `BlockingTransactionProducer` (blocking.py) runs
`execute_local_transaction` in the caller's thread, as Java's TransactionMQProducer does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tidemq.errors import ClientError, QueueError
from tidemq.protocol import message as pm
from tidemq.protocol.bodies import MessageQueue
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    end_transaction_fields,
)
from tidemq.protocol.message_id import physical_offset_of

from .message import Message, MessageExt, SendResult, SendStatus
from .producer import Producer
from .sending import prepare_parts

logger = logging.getLogger(__name__)

# As Java's checkThreadPoolMinSize/MaxSize = 1 and checkRequestHoldMax = 2000, with one more
# worker by default so one slow check does not hold all the others.
CHECK_WORKERS_DEFAULT: Final = 2
CHECK_QUEUE_MAX_DEFAULT: Final = 2_000
# The remark of an END_TRANSACTION carries at most this much of the local exception's text.
END_REMARK_LENGTH_MAX: Final = 512


class LocalTransactionState(enum.Enum):
    """The outcome of a local transaction, named as RocketMQ names it (UNKNOW included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"

    @property
    def end_code(self) -> int:
        """commitOrRollback of END_TRANSACTION: the sysFlag transaction value."""
        return _END_CODES[self]


_END_CODES: Final = {
    LocalTransactionState.COMMIT_MESSAGE: pm.SysFlag.COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: pm.SysFlag.ROLLBACK,
    LocalTransactionState.UNKNOW: pm.SysFlag.TRANSACTION_NOT,
}
# Half sends stored but not as durable as configured: RocketMQ rolls these back.
_ROLLBACK_STATUSES: Final = frozenset(
    {SendStatus.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE}
)


class TransactionListener(Protocol):
    """What the application provides. Either method may also be a coroutine function; returning
    None or raising counts as UNKNOW."""

    def execute_local_transaction(self, message: Message, arg: Any) -> Any: ...

    def check_local_transaction(self, message: MessageExt) -> Any: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half send's result (None when the half send failed: then `error` says why) and the
    local transaction's state as reported to the broker."""

    local_transaction_state: LocalTransactionState
    send_result: SendResult | None
    msg_id: str
    error: BaseException | None = None

    @property
    def send_status(self) -> SendStatus | None:
        return self.send_result.status if self.send_result is not None else None

    @property
    def transaction_id(self) -> str:
        if self.send_result is not None and self.send_result.transaction_id:
            return self.send_result.transaction_id
        return self.msg_id

    @property
    def message_queue(self) -> MessageQueue | None:
        return self.send_result.message_queue if self.send_result is not None else None

    @property
    def queue_offset(self) -> int:
        return self.send_result.queue_offset if self.send_result is not None else -1


@dataclass(frozen=True, slots=True)
class HalfSend:
    """Step 1's outcome, handed to the local transaction and then to `end_transaction`."""

    message: Message  # as sent: UNIQ_KEY, TRAN_MSG and PGROUP among its properties
    msg_id: str
    send_result: SendResult | None
    error: BaseException | None = None

    @property
    def run_local(self) -> bool:
        """Whether the local transaction may run (the half message is stored durably)."""
        return self.send_result is not None and self.send_result.status is SendStatus.SEND_OK


def state_of(
    result: Any, error: BaseException | None, what: str, msg_id: str
) -> tuple[LocalTransactionState, str | None]:
    """A listener's return value (or exception) as a state and an END_TRANSACTION remark."""
    if error is not None:
        logger.warning("%s of %s raised %r: state UNKNOW", what, msg_id, error)
        return LocalTransactionState.UNKNOW, f"{type(error).__name__}: {error}"[
            :END_REMARK_LENGTH_MAX
        ]
    if isinstance(result, LocalTransactionState):
        return result, None
    if result is not None:
        logger.warning("%s of %s returned %r, not a LocalTransactionState", what, msg_id, result)
    return LocalTransactionState.UNKNOW, None


class TransactionProducer(Producer):
    """A Producer that also sends messages in transactions. Plain sends work as in Producer.

    Use `async with TransactionProducer(group, namesrv, listener=...) as producer:`.
    """

    # Check-backs for the group's pending halves may come from any master, not only from the
    # brokers of the declared topics: start() heartbeats them all.
    _announce_to_every_master = True

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        listener: TransactionListener,
        check_workers: int = CHECK_WORKERS_DEFAULT,
        check_queue_max: int = CHECK_QUEUE_MAX_DEFAULT,
        **options: Any,
    ) -> None:
        if check_workers < 1 or check_queue_max < 1:
            raise ValueError("check_workers and check_queue_max must be >= 1")
        super().__init__(group, namesrv_addr, **options)
        self.listener = listener
        self.check_workers = check_workers
        self.check_queue_max = check_queue_max
        self._checks: asyncio.Queue[tuple[str, CheckTransactionStateRequestHeader, MessageExt]]
        self._checks = asyncio.Queue(maxsize=check_queue_max)
        self._workers: list[asyncio.Task[None]] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.checks_dropped = 0

    async def start(self) -> None:
        if not self._workers:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.check_workers, thread_name_prefix=f"tidemq-check-{self.group}"
            )
            loop = asyncio.get_running_loop()
            self._workers = [
                loop.create_task(self._check_worker(), name=f"tx-check-{self.group}-{i}")
                for i in range(self.check_workers)
            ]
        await super().start()

    async def shutdown(self) -> None:
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        await super().shutdown()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    # -- sending in a transaction --------------------------------------------------------

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Send `message` as a half message, run the local transaction, end it (oneway).

        A half message stored but not as durable as configured (FLUSH_DISK_TIMEOUT, ...) is
        rolled back without calling the listener: the result says so, as `send` returns such a
        status rather than raising it.

        Raises:
            ValueError, ProtocolError, MessageTooLargeError: the message is invalid (nothing
                was sent).
            QueueError: the half send failed as `send` fails (BrokerError such as
                NoPermissionError, RequestTimeoutError, NoRouteError, ...): the local
                transaction did not run; the broker rolls back a half it may have stored.
        """
        half = await self.send_half(message)
        if half.error is not None:
            raise half.error
        state, remark = LocalTransactionState.ROLLBACK_MESSAGE, None
        if half.run_local:
            result: Any = None
            error: BaseException | None = None
            try:
                result = self.listener.execute_local_transaction(half.message, arg)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                error = exc
            state, remark = state_of(result, error, "local transaction", half.msg_id)
        return await self.end_transaction(half, state, remark)

    async def send_half(self, message: Message) -> HalfSend:
        """Step 1: the half message. A failed send is reported in the result (`error`), not
        raised, for callers that retry or decide themselves (send_message_in_transaction
        raises it)."""
        self._check_open()
        if message.delay_level:
            raise ValueError("a transactional message cannot have a delay level")
        msg_id = self._keys.next(self._clock.now_ms())
        properties = dict(message.properties)
        properties.setdefault(pm.UNIQ_KEY, msg_id)
        msg_id = properties[pm.UNIQ_KEY]
        properties[pm.TRAN_MSG] = "true"
        properties[pm.PGROUP] = self.group
        half_message = dataclasses.replace(message, properties=properties)
        # Checked and encoded before the try: an invalid message raises (nothing was sent)
        # rather than being reported as a failed half send. TRAN_MSG makes prepare_parts flag it
        # PREPARED; the send itself is the producer's (its fast path, its retries).
        now_ms = self._clock.now_ms()
        parts = prepare_parts(
            half_message,
            msg_id,
            self.compress_over_bytes,
            self.compress_level,
            self.max_message_size,
            self._checked_topics,
            self._codec_bits,  # the producer's `compression`, as for its plain sends
        )
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        try:
            send_result = await self._start_send(
                future, half_message, parts, now_ms, None, None, None, None
            )
        except QueueError as exc:
            logger.warning("half message of %s not stored: %s", msg_id, exc)
            return HalfSend(half_message, msg_id, None, exc)
        if send_result.status in _ROLLBACK_STATUSES:
            logger.warning(
                "half message %s stored with %s: rolled back", msg_id, send_result.status
            )
        return HalfSend(half_message, msg_id, send_result)

    async def end_transaction(
        self, half: HalfSend, state: LocalTransactionState, remark: str | None = None
    ) -> TransactionSendResult:
        """Step 3: END_TRANSACTION, oneway; a lost one is settled by the broker's check-back."""
        result = TransactionSendResult(state, half.send_result, half.msg_id, half.error)
        send = half.send_result
        if send is None:
            return result
        try:
            fields = end_transaction_fields(
                self.group,
                send.queue_offset,
                physical_offset_of(send.offset_msg_id),
                state.end_code,
                half.msg_id,
                send.transaction_id or half.msg_id,
            )
            addr = self._instance.master_address(send.message_queue.broker_name)
            await self._end_oneway(addr, fields, remark)
        except QueueError as exc:
            logger.warning(
                "END_TRANSACTION of %s not sent (%s): the broker will check back", half.msg_id, exc
            )
        return result

    async def _end_oneway(self, addr: str, fields: dict[str, str], remark: str | None) -> None:
        """END_TRANSACTION with `fields` (its header's extFields), oneway."""
        cmd = RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=fields, remark=remark)
        await self._instance.remoting.invoke_oneway(addr, cmd)

    # -- check-backs ---------------------------------------------------------------------

    async def on_check_transaction_state(
        self, broker_addr: str, header: CheckTransactionStateRequestHeader, message: MessageExt
    ) -> None:
        try:
            self._checks.put_nowait((broker_addr, header, message))
        except asyncio.QueueFull:
            self.checks_dropped += 1
            logger.warning(
                "producer %s: %d check-backs queued; dropping the one for %s (asked again later)",
                self.group,
                self.check_queue_max,
                header.msg_id,
            )

    async def _check_worker(self) -> None:
        while True:
            broker_addr, header, message = await self._checks.get()
            try:
                await self._answer_check(broker_addr, header, message)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A task boundary: one failed answer must not stop the worker.
                logger.exception("check-back answer for %s failed", header.msg_id)

    async def _answer_check(
        self, broker_addr: str, header: CheckTransactionStateRequestHeader, message: MessageExt
    ) -> None:
        msg_id = message.properties.get(pm.UNIQ_KEY) or message.msg_id
        result: Any = None
        error: BaseException | None = None
        try:
            if inspect.iscoroutinefunction(self.listener.check_local_transaction):
                result = await self.listener.check_local_transaction(message)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    self._executor, self.listener.check_local_transaction, message
                )
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            error = exc
        state, remark = state_of(result, error, "transaction check", msg_id)
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=state.end_code,
            from_transaction_check=True,
            msg_id=msg_id,
            transaction_id=header.transaction_id,
        )
        try:
            await self._end_oneway(broker_addr, end.to_fields(), remark)
        except ClientError as exc:
            logger.warning("check-back answer for %s not sent: %s", msg_id, exc)
