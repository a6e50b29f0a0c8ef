"""The seeded transaction simulation: real broker-side transaction parts, simulated everything else.

What is real: FileMessageStore (in a directory the caller owns), ConsumerOffsetTable,
TransactionLedger, TransactionResolver (with its start-up rebuild), CheckBackService and the
END_TRANSACTION handler. What is simulated: time (FakeClock), the network (SimNetwork: loss and
delay of every frame, both ways), the producers, and the producers' local database.

    producer i (incarnation n)                        broker (epoch e)
      half send ───────── lossy, delayed ─────────▶ resolver.prepare
      ◀──────────────── send result (lossy) ─────── (a lost result = a failed send: no local tx)
      local tx: COMMIT (row) | ROLLBACK (no row) | UNKNOW (row "running", settles later or never)
      END_TRANSACTION (oneway) ── lossy ──────────▶ EndTransactionHandler
      ◀── CHECK_TRANSACTION_STATE (SimConnection) ── CheckBackService.run_once every interval
      answer from the database ── lossy ──────────▶ EndTransactionHandler (fromTransactionCheck)

Faults, all drawn from the seed: frame loss and delay; producer crashes at the kill points of
the protocol (`KillPoint`) — the crashed producer's running local transactions are lost, its
connection is reset or left dangling until the broker would expire it, and it comes back later
as a new incarnation; broker restarts, clean (offsets persisted, store shut down) and unclean
(the directory is copied as the dying process left it — abort marker, checkpoint and offsets as
last written — and reopened, so recovery and the ledger rebuild run on a crash image). Frames
addressed to a broker that restarted since they were sent are lost, as with a reset socket.

Checkers (`TxSimReport.violations`): every pending half message is younger than
timeout + interval * (check max + 1) at every pass; no check carries more than check-max checks;
at the end nothing is in flight and each transaction is in the real topic's consume queues
exactly once if its local transaction committed, else never.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, cast

from tidemq.broker.transaction.check_back import CheckBackConfig
from tidemq.clock import FakeClock
from tidemq.protocol import message as pm
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)
from tidemq.remoting.connection import Connection
from tidemq.store.types import MessageToStore, PutResult
from tidemq.testing.sim import NetworkConfig, SimConnection, SimNetwork, SimScheduler
from tidemq.testing.sim_broker import QUEUES, STORE_HOST, TOPIC, TXID_PROPERTY, SimBroker

log = logging.getLogger(__name__)

GROUP: Final = "PG_SIM_TX"
# The broker's periodic work, as BrokerApp schedules it (flush every 500 ms, offsets every 5 s).
FLUSH_INTERVAL_MS: Final = 500
OFFSETS_PERSIST_INTERVAL_MS: Final = 5_000
# A half send without a response after this long is a failed send.
HALF_SEND_TIMEOUT_MS: Final = 200

Callable0 = Callable[[], None]


class KillPoint(enum.Enum):
    """Where in one transaction a producer can be killed."""

    AFTER_HALF_SEND = "after half send, before its result"
    BEFORE_LOCAL_COMMIT = "after the half send result, before the local transaction"
    BEFORE_END = "after the local transaction, before END_TRANSACTION"
    AFTER_END = "after END_TRANSACTION"


@dataclass(frozen=True, slots=True, kw_only=True)
class TxSimConfig:
    seed: int
    transactions: int = 200
    producers: int = 3
    network: NetworkConfig = field(default_factory=NetworkConfig)
    check: CheckBackConfig = field(
        default_factory=lambda: CheckBackConfig(interval_ms=200, timeout_ms=1_000, check_max=15)
    )
    commit_probability: float = 0.5
    unknown_probability: float = 0.2  # the local transaction is still running at END time
    listener_error_probability: float = 0.05  # execute_local_transaction raises
    unknown_never_settles_probability: float = 0.1
    settle_ms_min: int = 100
    settle_ms_max: int = 2_000  # well inside the check window: answers must not come too late
    local_ms_max: int = 40
    gap_ms_max: int = 60  # between one producer's transactions
    kill_probability: float = 0.02  # at each kill point
    restart_ms_min: int = 100
    restart_ms_max: int = 800
    dangling_ms: int = 1_000  # a killed producer's unreset connection lingers this long
    broker_restarts: int = 3

    @property
    def resolve_within_ms(self) -> int:
        """The bound on a half message's life: timeout + interval * (check max + 1)."""
        c = self.check
        return c.timeout_ms + c.interval_ms * (c.check_max + 1)


@dataclass(slots=True)
class TxSimReport:
    seed: int
    transactions: int = 0
    half_stored: int = 0
    committed_locally: int = 0
    visible: int = 0
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    broker_restarts_clean: int = 0
    broker_restarts_unclean: int = 0
    frames_sent: int = 0
    frames_dropped: int = 0
    stats: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    sim_ms: float = 0.0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"seed={self.seed} transactions={self.transactions} half_stored={self.half_stored} "
            f"committed_locally={self.committed_locally} visible={self.visible} "
            f"kills={sum(self.kills.values())} broker_restarts="
            f"{self.broker_restarts_clean}+{self.broker_restarts_unclean} unclean "
            f"frames={self.frames_sent} dropped={self.frames_dropped} "
            f"checked={self.stats['checked']} discarded={self.stats['discarded']} "
            f"sim_ms={self.sim_ms:.0f}"
        )


class RowState(enum.Enum):
    RUNNING = "RUNNING"
    COMMITTED = "COMMITTED"


@dataclass(slots=True)
class Row:
    state: RowState
    owner: tuple[int, int]  # (producer, incarnation) that runs it while RUNNING


@dataclass(slots=True)
class SimProducer:
    index: int
    incarnation: int = 0
    alive: bool = True
    connection: SimConnection | None = None

    @property
    def identity(self) -> tuple[int, int]:
        return (self.index, self.incarnation)


class TxSimulation:
    """One seeded run. `await run()` returns the report; `violations` empty means it passed."""

    def __init__(self, config: TxSimConfig, root: Path) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.clock = FakeClock()
        self.scheduler = SimScheduler(self.clock)
        self.network = SimNetwork(self.scheduler, self.rng, config.network)
        self.broker = SimBroker(root, self.clock, config.check)
        self.database: dict[str, Row] = {}
        self.producers = [SimProducer(i) for i in range(config.producers)]
        self.report = TxSimReport(seed=config.seed)
        self._started = 0
        self._load_done = False
        self._late: set[int] = set()

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> TxSimReport:
        config = self.config
        for producer in self.producers:
            self._connect(producer)
            self.scheduler.after(self.rng.uniform(0, config.gap_ms_max), self._next_for(producer))
        self.scheduler.every(config.check.interval_ms, self._check_pass)
        self.scheduler.every(FLUSH_INTERVAL_MS, self._flush)
        self.scheduler.every(OFFSETS_PERSIST_INTERVAL_MS, self._persist_offsets)
        # Broker restarts fall inside the load phase's expected length.
        load_ms = config.transactions * (config.gap_ms_max + config.local_ms_max) / 2
        load_ms /= config.producers
        for _ in range(config.broker_restarts):
            clean = self.rng.random() < 0.5
            self.scheduler.after(self.rng.uniform(0, load_ms), self._restart_broker(clean))
        while not self._load_done:
            await self.scheduler.run_until(self.scheduler.now_ms + 1_000)
        await self.scheduler.run_until(
            self.scheduler.now_ms + config.resolve_within_ms + 2 * config.check.interval_ms
        )
        self._finish()
        return self.report

    def close(self) -> None:
        self.broker.close()

    def _finish(self) -> None:
        report = self.report
        report.sim_ms = self.scheduler.now_ms
        report.frames_sent = self.network.stats.sent
        report.frames_dropped = self.network.stats.dropped
        report.stats = self.broker.total_stats()
        for entry in self.broker.ledger.pending_list():
            report.violations.append(f"transaction {entry.origin} ({entry.key}) still in flight")
        self.check_visibility()

    def check_visibility(self) -> None:
        """Consumable iff committed locally, and exactly once."""
        counts = self.broker.visible_counts()
        committed = {t for t, row in self.database.items() if row.state is RowState.COMMITTED}
        self.report.committed_locally = len(committed)
        self.report.visible = sum(counts.values())
        for number in range(self._started):
            txid = _txid(number)
            expected = 1 if txid in committed else 0
            if counts[txid] != expected:
                self.report.violations.append(
                    f"{txid}: consumable {counts[txid]} times, local transaction "
                    f"{'committed' if expected else 'not committed'}"
                )

    # -- broker side ---------------------------------------------------------------------------

    async def _check_pass(self) -> None:
        await self.broker.checker.run_once()
        now_ms = self.clock.now_ms()
        for entry in self.broker.ledger.pending_list():
            age_ms = now_ms - entry.first_store_ms
            if age_ms > self.config.resolve_within_ms and entry.origin not in self._late:
                self._late.add(entry.origin)
                self.report.violations.append(
                    f"transaction {entry.origin} ({entry.key}) pending for {age_ms} ms > "
                    f"{self.config.resolve_within_ms} ms"
                )

    def _flush(self) -> None:
        self.broker.store.flush()

    def _persist_offsets(self) -> None:
        self.broker.offsets.persist_if_dirty()

    def _restart_broker(self, clean: bool) -> Callable0:
        def restart() -> None:
            if self._load_done:
                return
            self.broker.restart(clean=clean)
            if clean:
                self.report.broker_restarts_clean += 1
            else:
                self.report.broker_restarts_unclean += 1
            for producer in self.producers:
                if producer.alive:
                    self._connect(producer)

        return restart

    def _to_broker(self, action: Callable0) -> None:
        """Send a frame to the broker; it is lost if the broker restarts before it arrives."""
        epoch = self.broker.epoch

        def deliver() -> None:
            if self.broker.epoch == epoch:
                action()

        self.network.send(deliver)

    def _to_broker_async(self, request: RemotingCommand, connection: SimConnection) -> None:
        epoch = self.broker.epoch

        async def deliver() -> None:
            if self.broker.epoch != epoch:
                return
            response = await self.broker.end_transaction(cast(Connection, connection), request)
            self._record_answer(request, response)

        self.network.send(deliver)

    def _record_answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        header = EndTransactionRequestHeader.from_fields(request.ext_fields)
        if response is None:
            self.report.answers["unknown"] += 1
            return
        code = ResponseCode(response.code)
        self.report.answers[code.name] += 1
        if code is not ResponseCode.SUCCESS:
            self.report.violations.append(
                f"END_TRANSACTION {header.commit_or_rollback} of {header.msg_id} "
                f"(check={header.from_transaction_check}) refused: {code.name} {response.remark}"
            )

    # -- producers -----------------------------------------------------------------------------

    def _connect(self, producer: SimProducer) -> None:
        identity = producer.identity

        def on_command(command: RemotingCommand) -> None:
            if producer.alive and producer.identity == identity:
                self._on_check(producer, connection, command)

        connection = SimConnection(self.network, on_command, f"producer-{identity}")
        producer.connection = connection
        self.broker.connections.append(connection)

    def _kill_here(self, producer: SimProducer, point: KillPoint) -> bool:
        """Maybe kill `producer` at `point`; never the last one alive (checks need someone)."""
        if self._load_done or self.rng.random() >= self.config.kill_probability:
            return False
        if sum(p.alive for p in self.producers) <= 1:
            return False
        self.report.kills[point.name] += 1
        producer.alive = False
        for txid, row in list(self.database.items()):
            if row.state is RowState.RUNNING and row.owner == producer.identity:
                del self.database[txid]  # the database rolls back a dead session's work
        connection = producer.connection
        if connection is not None:
            if self.rng.random() < 0.5:
                self._drop_connection(connection)
            else:
                self.scheduler.after(
                    self.config.dangling_ms, lambda: self._drop_connection(connection)
                )
        delay = self.rng.uniform(self.config.restart_ms_min, self.config.restart_ms_max)
        self.scheduler.after(delay, lambda: self._revive(producer))
        return True

    def _drop_connection(self, connection: SimConnection) -> None:
        connection.close()
        if connection in self.broker.connections:
            self.broker.connections.remove(connection)

    def _revive(self, producer: SimProducer) -> None:
        producer.incarnation += 1
        producer.alive = True
        self._connect(producer)
        self.scheduler.after(0, self._next_for(producer))

    def _next_for(self, producer: SimProducer) -> Callable0:
        identity = producer.identity

        def start() -> None:
            if not producer.alive or producer.identity != identity:
                return
            if self._started >= self.config.transactions:
                self._load_done = True
                return
            self._begin(producer, self._started)
            self._started += 1
            self.report.transactions = self._started

        return start

    def _continue(self, producer: SimProducer) -> None:
        self.scheduler.after(self.rng.uniform(0, self.config.gap_ms_max), self._next_for(producer))

    def _begin(self, producer: SimProducer, number: int) -> None:
        identity = producer.identity
        txid = _txid(number)
        message = _half_message(txid, self.rng.randrange(QUEUES), self.clock.now_ms())
        settled = [False]

        def at_broker() -> None:
            result = self.broker.resolver.prepare(message, GROUP)
            if result.ok:
                self.report.half_stored += 1
            self.network.send(lambda: on_result(result))

        def on_result(result: PutResult) -> None:
            if settled[0] or producer.identity != identity or not producer.alive:
                return
            settled[0] = True
            if not result.ok:
                self._continue(producer)
                return
            if self._kill_here(producer, KillPoint.BEFORE_LOCAL_COMMIT):
                return
            delay = self.rng.uniform(0, self.config.local_ms_max)
            self.scheduler.after(delay, lambda: self._local(producer, identity, txid, result))

        def on_timeout() -> None:
            if settled[0] or producer.identity != identity or not producer.alive:
                return
            settled[0] = True  # a failed half send: no local transaction, state ROLLBACK
            self._continue(producer)

        self._to_broker(at_broker)
        if self._kill_here(producer, KillPoint.AFTER_HALF_SEND):
            return
        self.scheduler.after(HALF_SEND_TIMEOUT_MS, on_timeout)

    def _local(
        self, producer: SimProducer, identity: tuple[int, int], txid: str, result: PutResult
    ) -> None:
        if producer.identity != identity or not producer.alive:
            return
        config = self.config
        draw = self.rng.random()
        if draw < config.listener_error_probability:
            state = pm.SysFlag.TRANSACTION_NOT  # raised before touching the database
        elif draw < config.listener_error_probability + config.unknown_probability:
            state = pm.SysFlag.TRANSACTION_NOT
            self.database[txid] = Row(RowState.RUNNING, identity)
            if self.rng.random() >= config.unknown_never_settles_probability:
                delay = self.rng.uniform(config.settle_ms_min, config.settle_ms_max)
                self.scheduler.after(delay, lambda: self._settle(txid, identity))
        elif self.rng.random() < config.commit_probability:
            state = pm.SysFlag.COMMIT
            self.database[txid] = Row(RowState.COMMITTED, identity)
        else:
            state = pm.SysFlag.ROLLBACK
        if self._kill_here(producer, KillPoint.BEFORE_END):
            return
        header = EndTransactionRequestHeader(
            producer_group=GROUP,
            tran_state_table_offset=result.queue_offset,
            commit_log_offset=result.physical_offset,
            commit_or_rollback=state,
            from_transaction_check=False,
            msg_id=txid,
            transaction_id=txid,
        )
        assert producer.connection is not None
        self._to_broker_async(_end_command(header), producer.connection)
        if self._kill_here(producer, KillPoint.AFTER_END):
            return
        self._continue(producer)

    def _settle(self, txid: str, owner: tuple[int, int]) -> None:
        row = self.database.get(txid)
        if row is None or row.state is not RowState.RUNNING or row.owner != owner:
            return
        if self.rng.random() < self.config.commit_probability:
            row.state = RowState.COMMITTED
        else:
            del self.database[txid]

    def _on_check(
        self, producer: SimProducer, connection: SimConnection, command: RemotingCommand
    ) -> None:
        assert command.code == RequestCode.CHECK_TRANSACTION_STATE, command
        header = CheckTransactionStateRequestHeader.from_fields(command.ext_fields)
        message = rec.decode_record(command.body)
        properties = message.property_map()
        check_times = int(properties.get(pm.TRANSACTION_CHECK_TIMES, "0"))
        if check_times > self.config.check.check_max:
            self.report.violations.append(
                f"check {check_times} of {properties.get(TXID_PROPERTY)} exceeds check max"
            )
        txid = properties[TXID_PROPERTY]
        row = self.database.get(txid)
        if row is None:
            state = pm.SysFlag.ROLLBACK
        elif row.state is RowState.COMMITTED:
            state = pm.SysFlag.COMMIT
        else:
            state = pm.SysFlag.TRANSACTION_NOT
        end = EndTransactionRequestHeader(
            producer_group=GROUP,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=state,
            from_transaction_check=True,
            msg_id=header.msg_id or txid,
            transaction_id=header.transaction_id,
        )
        self._to_broker_async(_end_command(end), connection)


def _txid(number: int) -> str:
    return f"T{number:06d}"


def _end_command(header: EndTransactionRequestHeader) -> RemotingCommand:
    return RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=header.to_fields())


def _half_message(txid: str, queue_id: int, now_ms: int) -> MessageToStore:
    """A send of the producer's message as the send handler hands it to `prepare`."""
    properties = {
        pm.KEYS: txid,
        pm.UNIQ_KEY: f"U{txid}",
        pm.TRAN_MSG: "true",
        pm.PGROUP: GROUP,
        TXID_PROPERTY: txid,
    }
    return MessageToStore(
        topic=TOPIC,
        queue_id=queue_id,
        body=f"transfer {txid}".encode(),
        flag=0,
        properties=pm.encode_properties(properties),
        sys_flag=pm.SysFlag.PREPARED,
        born_timestamp=now_ms,
        born_host=("10.0.0.7", 5555),
        store_host=STORE_HOST,
        reconsume_times=0,
    )


__all__ = ["GROUP", "TOPIC", "KillPoint", "TxSimConfig", "TxSimReport", "TxSimulation"]
